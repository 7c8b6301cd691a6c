// CUDA split-KV decode against the CPU decode reference, through the op-test harness: KV lengths
// 0 .. 1M, page sizes 1/7/16/128/256/4096, GQA 1/4/8/16 (and 3, 6, 12), head_dim 64/128/256,
// bf16/f16, with and without LSE, batch 1 .. 64, 1 .. ~130 splits per request. Tolerances
// (unit-variance q/k/v, sm_scale = 1/sqrt(head_dim)):
//   output max-abs <= 1e-2 (bf16) / 2e-3 (f16): both round an fp32 result once; the kernel sums
//     in another order (split chunks, warps) and uses exp2f, and it rounds the softmax weights P
//     to the input dtype before P V on the tensor cores (relative 2^-9 bf16, 2^-11 f16 per
//     weight; the max weight, 1, is exact);
//   lse max-abs <= 1e-3; an empty request must give o == 0 and lse == -inf exactly.
#include "kernels/cuda/decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_kernels/decode_case.h"
#include "gpu_kernels/fp8_pages.h"
#include "gpu_kernels/harness.h"
#include "gpu_kernels/paged_prefill_case.h"
#include "kernels/paged_case.h"

namespace longctx::gpu_test {
namespace {

using testing::PagedCase;
using testing::PagedCaseShape;

// Every page size x GQA ratio x head_dim x dtype over a mixed batch (empty, 1 key, odd lengths,
// lengths that split into several chunks).
std::vector<std::unique_ptr<OpCase>> mixed_batch_cases() {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 1;
  for (int page : {1, 16, 128})
    for (int group : {1, 4, 8})
      for (int d : {64, 128})
        for (DType dt : {DType::kBF16, DType::kF16}) {
          cases.push_back(std::make_unique<DecodeCase>(
              dshape({0, 1, 7, 300, 1025, 4097}, 2 * group, 2, d, page, dt, seed % 3 != 0, seed)));
          ++seed;
        }
  return cases;
}

TEST(DecodeGpu, MixedBatchesOverTheGrid) {
  std::vector<std::unique_ptr<OpCase>> cases = mixed_batch_cases();
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 36);
}

// Long single requests (one request must spread over the GPU) and odd GQA ratios.
TEST(DecodeGpu, LongAndOddGroups) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<DecodeCase>(dshape({40000}, 32, 8, 128, 16, DType::kBF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({40000}, 8, 1, 64, 1, DType::kF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({32768}, 8, 8, 128, 128, DType::kBF16)));
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({40000, 3, 12000}, 32, 8, 128, 128, DType::kF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({5000, 17}, 6, 2, 128, 16, DType::kBF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({5000, 17}, 12, 1, 64, 16, DType::kBF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({2000, 9}, 24, 2, 128, 7, DType::kF16)));
  // q read in place from a fused QKV row ([q | k | v] of Llama-3.1-8B / the needle model).
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({3000, 1, 700}, 32, 8, 128, 128, DType::kBF16), false, 256, 2 * 8 * 128));
  cases.push_back(std::make_unique<DecodeCase>(dshape({513, 77}, 4, 2, 64, 16, DType::kF16), false,
                                               64, 2 * 2 * 64));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 9);
}

// The cp.async pipeline's edges: lengths around the 32/64-token tile and the 64-token chunk grain,
// page sizes 1/16/128/256 (a tile inside one page, across pages, one token per page), many
// splits (min chunk 64), GQA 16 (two head tiles per kv head), batches up to 64.
std::vector<std::unique_ptr<OpCase>> pipeline_edge_cases() {
  std::vector<std::unique_ptr<OpCase>> cases;
  const std::vector<int32_t> edges = {1, 31, 32, 33, 63, 64, 65, 127, 129, 255, 256, 257, 1000};
  uint64_t seed = 100;
  for (int page : {1, 16, 128, 256})
    for (int d : {64, 128}) {
      cases.push_back(std::make_unique<DecodeCase>(
          dshape(edges, 8, 2, d, page, DType::kBF16, true, seed++), false, 64));
      cases.push_back(std::make_unique<DecodeCase>(
          dshape({4095, 2049, 9}, 32, 8, d, page, DType::kF16, seed % 2 == 0, seed++)));
    }
  // GQA 16: head tiles of 8 q heads, two per kv head.
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({3000, 70, 0}, 32, 2, 128, 128, DType::kBF16, true, 7)));
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({5001}, 16, 1, 64, 16, DType::kF16, true, 8), false, 64));
  // GQA 1 and 8 with many splits per request.
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({20000, 3}, 4, 4, 128, 256, DType::kBF16, true, 9)));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({9000, 4500}, 16, 2, 128, 128, DType::kBF16, false, 10), false, 64));
  // One request over the whole GPU: ~130 splits merged by the last CTA of each kv head.
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({131000}, 8, 2, 128, 128, DType::kBF16, true, 11)));
  // Batches 1 .. 64 of mixed lengths.
  for (int batch : {2, 8, 33, 64}) {
    std::vector<int32_t> kv(batch);
    for (int b = 0; b < batch; ++b) kv[b] = int32_t((b * 2654435761u) % 3000u) + (b % 5 == 0);
    cases.push_back(std::make_unique<DecodeCase>(
        dshape(kv, 32, 8, 128, batch % 2 ? 16 : 128, DType::kBF16, true, 20 + batch)));
  }
  return cases;
}

TEST(DecodeGpu, PipelineEdges) {
  std::vector<std::unique_ptr<OpCase>> cases = pipeline_edge_cases();
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// The tuning's pins of the decode plan's loader and stage fill.
kernels::DecodeTuning decode_pins(kernels::DecodeLoader loader, kernels::DecodeStageCopy copy) {
  kernels::DecodeTuning t;
  t.loader = loader;
  t.copy = copy;
  return t;
}
constexpr kernels::DecodeLoader kAutoLoader = kernels::DecodeLoader::kAuto;
constexpr kernels::DecodeStageCopy kAutoCopy = kernels::DecodeStageCopy::kAuto;

// Every case of `cases` (DecodeCases) planned under `tuning`.
void set_tuning(std::vector<std::unique_ptr<OpCase>>& cases, const kernels::DecodeTuning& tuning) {
  for (auto& c : cases) static_cast<DecodeCase&>(*c).set_tuning(tuning);
}

// The mixed-batch and pipeline-edge grids plus a NaN-tailed batch and one request of 1M keys,
// planned under `tuning` (a plan variant).
void expect_grids_pass_with(const kernels::DecodeTuning& tuning) {
  std::vector<std::unique_ptr<OpCase>> cases = mixed_batch_cases();
  for (auto& c : pipeline_edge_cases()) cases.push_back(std::move(c));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({1, 33, 65, 500, 3001}, 8, 2, 128, 128, DType::kBF16, true, 300), false, 64, 0, true));
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({1 << 20}, 32, 8, 128, 128, DType::kBF16, true, 33)));
  set_tuning(cases, tuning);
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// The grids above run the TMA kernel's stages (the default on sm_90): filled by TMA boxes where
// the pages hold whole tiles and the splits are short, else by cp.async; this checks those
// choices and adds last pages whose unused slots are NaN (both copy whole tiles of a page).
TEST(DecodeGpu, TmaLoaderOverTheGrids) {
  {
    const int32_t indptr[2] = {0, 3}, last[1] = {5};
    GuardedBuffer ws(kernels::cuda::decode_workspace_bytes(1, 32, 8, 128), 0);
    auto plan_with = [&](const int32_t* ip, const int32_t* lp, int page, int d, GuardedBuffer& w,
                         const kernels::DecodeTuning& tuning) {
      return kernels::cuda::decode_plan(ip, lp, 1, page, 32, 8, d, w.data(), w.bytes(), nullptr, 0,
                                        256, {}, tuning);
    };
    const kernels::DecodeTuning none;
    const kernels::cuda::DecodePlan plan = plan_with(indptr, last, 128, 128, ws, none);
    EXPECT_EQ(plan.loader, 2) << "an H200 with pages of 128 tokens takes TMA stages of 64";
    const kernels::cuda::DecodePlan single = plan_with(indptr, last, 32, 128, ws, none);
    EXPECT_EQ(single.loader, 1) << "pages of 32 tokens hold only single tiles";
    const kernels::cuda::DecodePlan small = plan_with(indptr, last, 16, 128, ws, none);
    EXPECT_EQ(small.loader, 0) << "pages of 16 tokens are not whole tiles: the cp.async ring";
    GuardedBuffer ws64(kernels::cuda::decode_workspace_bytes(1, 32, 8, 64), 0);
    const kernels::cuda::DecodePlan d64 = plan_with(indptr, last, 128, 64, ws64, none);
    EXPECT_EQ(d64.loader, 1) << "head_dim 64 has no doubled stages";
    const kernels::cuda::DecodePlan capped = plan_with(
        indptr, last, 128, 128, ws, decode_pins(kernels::DecodeLoader::kTmaTile, kAutoCopy));
    EXPECT_EQ(capped.loader, 1) << "DecodeLoader::kTmaTile caps the stages at 32 tokens";
    // The stages' copies: TMA boxes over short splits, every thread's cp.async over long ones.
    EXPECT_FALSE(plan.cp_async_stages) << "3 pages: one short split per kv head";
    const int32_t long_indptr[2] = {0, 1024}, long_last[1] = {128};  // 128K keys
    const kernels::cuda::DecodePlan long_plan =
        plan_with(long_indptr, long_last, 128, 128, ws, none);
    EXPECT_GE(long_plan.chunk_tokens, 1024);
    EXPECT_TRUE(long_plan.cp_async_stages) << "128K keys: splits of 4K keys take cp.async";
    const kernels::cuda::DecodePlan pinned =
        plan_with(long_indptr, long_last, 128, 128, ws,
                  decode_pins(kAutoLoader, kernels::DecodeStageCopy::kTmaBoxes));
    EXPECT_FALSE(pinned.cp_async_stages) << "DecodeStageCopy::kTmaBoxes pins the TMA boxes";
    const kernels::cuda::DecodePlan small_copies = plan_with(
        indptr, last, 16, 128, ws, decode_pins(kAutoLoader, kernels::DecodeStageCopy::kCpAsync));
    EXPECT_EQ(small_copies.loader, 2)
        << "DecodeStageCopy::kCpAsync: stages of 64 across pages of 16";
    EXPECT_TRUE(small_copies.cp_async_stages);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Both ways of filling the stages over the same grids; pages that are not whole tiles (1, 16,
  // 48, 96 at head_dim 64) take the ring with kTmaBoxes and stages across pages by cp.async with
  // kCpAsync.
  for (kernels::DecodeStageCopy copy :
       {kernels::DecodeStageCopy::kTmaBoxes, kernels::DecodeStageCopy::kCpAsync}) {
    SCOPED_TRACE(copy == kernels::DecodeStageCopy::kTmaBoxes ? "TMA boxes" : "cp.async stages");
    std::vector<std::unique_ptr<OpCase>> cases;
    uint64_t seed = 200;
    for (int page : {1, 16, 32, 48, 64, 96, 128, 256})
      for (int d : {64, 128}) {
        cases.push_back(std::make_unique<DecodeCase>(
            dshape({1, 33, 65, 500, 3001}, 8, 2, d, page, DType::kBF16, true, seed++), false, 64, 0,
            true));
        cases.push_back(std::make_unique<DecodeCase>(
            dshape({7, 4099}, 32, 8, d, page, DType::kF16, true, seed++), false, 256, 0, true));
      }
    set_tuning(cases, decode_pins(kAutoLoader, copy));
    const RunSummary s = run_cases(cases);
    EXPECT_EQ(s.failed, 0);
    EXPECT_EQ(s.ok, int(cases.size()));
  }
}

// TMA stages of the ring's tile only (DecodeLoader::kTmaTile; the default takes stages of 64
// tokens at head_dim 128 where the pages hold them) over the grids.
TEST(DecodeGpu, TmaSingleTilesOverTheGrids) {
  expect_grids_pass_with(decode_pins(kernels::DecodeLoader::kTmaTile, kAutoCopy));
}

// The TMA kernel's stages filled by every thread's cp.async (DecodeStageCopy::kCpAsync; the
// default for long splits only) over the grids, the million-key request included.
TEST(DecodeGpu, CpAsyncStagesOverTheGrids) {
  expect_grids_pass_with(decode_pins(kAutoLoader, kernels::DecodeStageCopy::kCpAsync));
}

// The cp.async loader (DecodeLoader::kCpAsync) over the grids, where the TMA would run.
TEST(DecodeGpu, CpAsyncLoaderOverTheGrids) {
  expect_grids_pass_with(decode_pins(kernels::DecodeLoader::kCpAsync, kAutoCopy));
}

// Pages of 4096 tokens and one request of 1M keys (a split of ~32K keys per CTA).
TEST(DecodeGpu, HugePagesAndAMillionKeys) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({100000, 4096, 4097, 5}, 32, 8, 128, 4096, DType::kBF16, true, 31)));
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({1 << 20}, 8, 1, 128, 256, DType::kBF16, true, 32)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 2);
}

// Batch 1 at few kv heads (Qwen3-30B-A3B: 32 q / 4 kv heads; Llama-3.1-8B: 32 / 8), 32K and
// 128K keys and odd lengths, where one request takes 32-66 splits per kv head: the plan's merge
// (two levels above 32 splits, kernels/decode_schedule.h's decode_merge_group) and pinned group
// sizes (2: the most groups, 3 / 7: a short last group, 1000: one level), over both loaders
// (pages of 128: TMA; 16: the ring), head_dim 64 and 128, mixed batches whose requests take
// different split counts (min chunk 64), and the first keys' L2 prefetch off and past the ranges.
TEST(DecodeGpu, FewKvHeadsMergeManySplits) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 500;
  auto add = [&](PagedCaseShape shape, int merge_group, int min_chunk = 256) {
    auto c = std::make_unique<DecodeCase>(std::move(shape), false, min_chunk);
    c->set_merge_group(merge_group);
    cases.push_back(std::move(c));
  };
  add(dshape({32768}, 32, 4, 128, 128, DType::kBF16, true, seed++), 0);
  add(dshape({131072}, 32, 4, 128, 128, DType::kBF16, true, seed++), 0);
  add(dshape({32771}, 32, 4, 128, 16, DType::kF16, true, seed++), 0);
  add(dshape({131071}, 32, 8, 128, 128, DType::kBF16, false, seed++), 0);
  add(dshape({40001}, 32, 4, 64, 128, DType::kBF16, true, seed++), 0);
  for (int g : {2, 3, 7, 1000})
    add(dshape({32781}, 32, 4, 128, 128, DType::kBF16, true, seed++), g);
  add(dshape({0, 1, 5000, 33000, 700}, 32, 4, 128, 128, DType::kBF16, true, seed++), 0, 64);
  add(dshape({9001, 2, 20000}, 16, 2, 128, 16, DType::kF16, true, seed++), 3, 64);
  // head_dim 256 (the ring; a row's states are merged by two warps): ~100 splits, two levels.
  add(dshape({20000}, 16, 2, 256, 16, DType::kBF16, true, seed++), 0, 64);
  // The L2 prefetch before the wait (DecodePlan::prefetch_tokens) is a hint: none, and past
  // every split's end, read the same.
  for (int prefetch : {0, 1 << 20}) {
    auto c = std::make_unique<DecodeCase>(
        dshape({0, 3, 4097, 33000}, 32, 4, 128, prefetch ? 128 : 16, DType::kBF16, true, seed++));
    c->set_prefetch_tokens(prefetch);
    cases.push_back(std::move(c));
  }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
  // The 4-kv-head 32K case splits into more states than one level merges.
  const auto& first = static_cast<const DecodeCase&>(*cases.front()).plan();
  EXPECT_GT(first.num_partials, kernels::kDecodeMergeOneLevelMax);
}

// Sliding windows: each request's items begin at its first visible key (any key: the kernel masks
// the keys before it in the first 64-aligned tile and reads no earlier one), split and unsplit,
// over both loaders (pages of 16: the ring; 128: TMA), windows shorter and longer than requests.
TEST(DecodeGpu, SlidingWindow) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 200;
  for (int window : {1, 7, 64, 65, 1000, 4096, 50000}) {
    for (int page : {16, 128}) {
      PagedCaseShape s = dshape({0, 1, 63, 700, 4097, 30000}, 8, 2, window % 2 ? 128 : 64, page,
                                DType::kBF16, true, seed++);
      s.window = window;
      cases.push_back(std::make_unique<DecodeCase>(s, false, 64));
    }
  }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 14);
}

// head_dim 256 (Gemma 3: 16 q / 8 kv heads, windows of 1024): the ring's 32-token stages, 3 deep;
// lengths around them, a long split request, pages 1 / 16 / 128, GQA 1 / 2 / 8 / 16, f16, windows
// and a strided q.
TEST(DecodeGpu, HeadDim256) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 400;
  const std::vector<int32_t> edges = {1, 31, 32, 33, 64, 65, 96, 97, 1000};
  for (int page : {1, 16, 128})
    cases.push_back(std::make_unique<DecodeCase>(
        dshape(edges, 16, 8, 256, page, DType::kBF16, true, seed++), false, 64));
  cases.push_back(std::make_unique<DecodeCase>(dshape({40000}, 16, 8, 256, 16, DType::kBF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({0, 7, 5000}, 8, 1, 256, 128, DType::kF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({3000, 17}, 32, 2, 256, 16, DType::kBF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({700, 2}, 4, 4, 256, 16, DType::kF16)));
  for (int window : {1, 100, 1024}) {
    PagedCaseShape w = dshape({1, 63, 1100, 9000}, 16, 8, 256, 16, DType::kBF16, true, seed++);
    w.window = window;
    cases.push_back(std::make_unique<DecodeCase>(w, false, 64));
  }
  cases.push_back(std::make_unique<DecodeCase>(dshape({513, 77}, 16, 8, 256, 16, DType::kBF16),
                                               false, 64, 2 * 8 * 256));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 11);
}

// A reduced set for compute-sanitizer (includes a split request: the fused merge).
TEST(DecodeGpu, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(
      std::make_unique<DecodeCase>(dshape({0, 1, 300, 700}, 8, 2, 128, 16, DType::kBF16)));
  cases.push_back(std::make_unique<DecodeCase>(dshape({513, 5}, 3, 1, 64, 1, DType::kF16)));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({1000, 65, 0}, 16, 1, 128, 128, DType::kBF16, true, 3), false, 64));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({700, 33, 1}, 16, 8, 256, 16, DType::kBF16, true, 4), false, 64));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 4);
}

void expect_graph_replay_matches_direct_launch(int page_size,
                                               const kernels::DecodeTuning& tuning = {},
                                               std::vector<int32_t> kv = {9000, 3, 700},
                                               int kv_heads = 8) {
  DecodeCase c(dshape(std::move(kv), 32, kv_heads, 128, page_size, DType::kBF16));
  c.set_tuning(tuning);
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c.prepare(stream);
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  CaseResult direct = c.check();
  EXPECT_EQ(direct.status, Status::kOk) << direct.detail;
  replay_in_graph(c, stream, [&] { c.reset_outputs(); });
  CaseResult replay = c.check();
  EXPECT_EQ(replay.status, Status::kOk) << replay.detail;
  EXPECT_EQ(replay.max_abs_out, direct.max_abs_out);
  cudaStreamDestroy(stream);
}

TEST(DecodeGpu, CudaGraphReplayMatchesDirectLaunch) {
  expect_graph_replay_matches_direct_launch(16);
}

// A replay after a direct launch of a two-level merge (4 kv heads, one request of 32K keys):
// the direct launch must leave both levels' counters at 0.
TEST(DecodeGpu, TwoLevelMergeGraphReplayMatchesDirectLaunch) {
  expect_graph_replay_matches_direct_launch(128, {}, {32768}, 4);
}

// The TMA loader's tensor maps are kernel parameters: a captured launch replays them, with the
// stages filled by the TMA and by every thread's cp.async.
TEST(DecodeGpu, TmaLoaderGraphReplayMatchesDirectLaunch) {
  for (kernels::DecodeStageCopy copy :
       {kernels::DecodeStageCopy::kTmaBoxes, kernels::DecodeStageCopy::kCpAsync}) {
    SCOPED_TRACE(copy == kernels::DecodeStageCopy::kTmaBoxes ? "TMA boxes" : "cp.async stages");
    expect_graph_replay_matches_direct_launch(128, decode_pins(kAutoLoader, copy));
  }
}

// FP8 pages (fp8_pages.h: page scales that vary per page and head, raised inside pages) against
// the CPU reference on the same codes: the grid of page sizes x GQA x head_dim x dtype over a
// mixed batch.
TEST(DecodeFp8Gpu, MixedBatchesOverTheGrid) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 300;
  for (int page : {1, 16, 128})
    for (int group : {1, 4, 8})
      for (int d : {64, 128})
        for (DType dt : {DType::kBF16, DType::kF16}) {
          cases.push_back(std::make_unique<DecodeCase>(
              dshape({0, 1, 7, 300, 1025, 4097}, 2 * group, 2, d, page, dt, seed % 3 != 0, seed),
              false, 256, 0, false, true));
          ++seed;
        }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 36);
}

// The converting ring's edges: lengths around its tile, pages of 1 / 7 / 16 / 256 tokens, many
// splits (min chunk 64) merged by the last CTA, GQA 3 / 6 / 16, a strided q, NaN codes past each
// request's last key (must not reach the output), sliding windows, one request of 131K keys.
TEST(DecodeFp8Gpu, EdgesSplitsAndNanTails) {
  std::vector<std::unique_ptr<OpCase>> cases;
  const std::vector<int32_t> edges = {1, 31, 32, 33, 63, 64, 65, 127, 129, 255, 256, 257, 1000};
  uint64_t seed = 400;
  for (int page : {1, 7, 16, 256})
    for (int d : {64, 128})
      cases.push_back(std::make_unique<DecodeCase>(
          dshape(edges, 8, 2, d, page, DType::kBF16, true, seed++), false, 64, 0, true, true));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({3000, 70, 0}, 32, 2, 128, 128, DType::kBF16, true, seed++), false, 256, 0, false,
      true));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({5000, 17}, 6, 2, 128, 16, DType::kF16, true, seed++), false, 64, 0, true, true));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({2000, 9}, 24, 8, 64, 16, DType::kBF16, true, seed++), false, 64, 0, false, true));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({3000, 1, 700}, 32, 8, 128, 16, DType::kBF16, true, seed++), false, 256, 2 * 8 * 128,
      false, true));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({131000}, 32, 8, 128, 16, DType::kBF16, true, seed++), false, 256, 0, true, true));
  for (int window : {7, 65, 4096}) {
    PagedCaseShape w = dshape({0, 1, 700, 9000}, 8, 2, 128, 16, DType::kBF16, true, seed++);
    w.window = window;
    cases.push_back(std::make_unique<DecodeCase>(w, false, 64, 0, false, true));
  }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// FP8 pages at 4 kv heads, batch 1, 32K and 128K keys (two-level merges; kernels/
// decode_schedule.h), and a pinned group of 5 over an odd length.
TEST(DecodeFp8Gpu, FewKvHeadsMergeManySplits) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({32768}, 32, 4, 128, 128, DType::kBF16, true, 600), false, 256, 0, true, true));
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({131072}, 32, 4, 128, 16, DType::kBF16, true, 601), false, 256, 0, false, true));
  auto pinned = std::make_unique<DecodeCase>(
      dshape({32779}, 32, 4, 128, 128, DType::kF16, true, 602), false, 256, 0, true, true);
  pinned->set_merge_group(5);
  cases.push_back(std::move(pinned));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// The FP8 kernel in a CUDA graph: the scale pointers are kernel parameters fixed per pool.
TEST(DecodeFp8Gpu, CudaGraphReplayMatchesDirectLaunch) {
  DecodeCase c(dshape({9000, 3, 700}, 32, 8, 128, 16, DType::kBF16), false, 256, 0, false, true);
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c.prepare(stream);
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  CaseResult direct = c.check();
  EXPECT_EQ(direct.status, Status::kOk) << direct.detail;
  replay_in_graph(c, stream, [&] { c.reset_outputs(); });
  CaseResult replay = c.check();
  EXPECT_EQ(replay.status, Status::kOk) << replay.detail;
  EXPECT_EQ(replay.max_abs_out, direct.max_abs_out);
  cudaStreamDestroy(stream);
}

// A reduced set for compute-sanitizer.
TEST(DecodeFp8Gpu, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<DecodeCase>(
      dshape({0, 1, 300, 700}, 8, 2, 128, 16, DType::kBF16), false, 64, 0, true, true));
  cases.push_back(std::make_unique<DecodeCase>(dshape({513, 5}, 3, 1, 64, 1, DType::kF16), false,
                                               256, 0, false, true));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 2);
}

kernels::DecodeTuning fp8_kernel_pin(kernels::DecodeFp8Kernel k) {
  kernels::DecodeTuning t;
  t.fp8_kernel = k;
  return t;
}

// The converting-tile FP8 kernel (DecodeFp8Kernel::kConvertTile, still selectable) over the
// mixed-batch grid and NaN tails.
TEST(DecodeFp8Gpu, ConvertTileKernelOverTheGrid) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 300;
  for (int page : {1, 16, 128})
    for (int group : {1, 4, 8})
      for (int d : {64, 128}) {
        const DType dt = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back(std::make_unique<DecodeCase>(
            dshape({0, 1, 7, 300, 1025, 4097}, 2 * group, 2, d, page, dt, seed % 3 != 0, seed),
            false, 64, 0, page > 1, true));
        ++seed;
      }
  set_tuning(cases, fp8_kernel_pin(kernels::DecodeFp8Kernel::kConvertTile));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// The FP8 kernels on the same pages, each against the CPU reference and against each other. The
// registers kernel's k-steps hold other dims than the converting tile's (its fragment order,
// decode.cu), so each score is the same fp32 sum in another order and a softmax weight may round
// to the neighbouring bf16 / f16 value; the page scales multiply outside the mma (exact). So the
// outputs agree to about an ulp of the output: |new - old| <= 2^-6 (|old| + max |old| / 16) per
// element, far inside the reference tolerance and relative to the outputs' own size, which the
// reference's absolute bound is not where the V scales are tiny. A wrong fragment layout would
// miss by O(|old|). Shapes: pages 1 / 7 / 16 / 128, head_dim 64 / 128, GQA 1, 2, 3, 8 and 16
// (two head tiles per kv head), ragged batches, split (min chunk 64) and unsplit, windows, and f16
// pages whose V scales straddle the bottom of f16's range (2^-19 x: some take the f32 route of the
// V operands) or whose K scales are large (2^10 x: scores in the hundreds). The deeper ring
// (kRegistersDeep) runs each case too, under the same pinned wave-model slots (so the same
// splits): only its ring depth differs from kRegisters, so its outputs must be bit for bit
// kRegisters'.
TEST(DecodeFp8Gpu, RegistersMatchConvertTile) {
  struct Pair {
    std::unique_ptr<DecodeCase> tile, regs, deep;
  };
  std::vector<Pair> pairs;
  auto add = [&](PagedCaseShape s, int min_chunk, bool nan_tail, int k_exp = 0, int v_exp = 0) {
    Pair p;
    for (auto* c : {&p.tile, &p.regs, &p.deep}) {
      *c = std::make_unique<DecodeCase>(s, false, min_chunk, 0, nan_tail, true);
      (*c)->set_fp8_scale_exponents(k_exp, v_exp);
    }
    p.tile->set_tuning(fp8_kernel_pin(kernels::DecodeFp8Kernel::kConvertTile));
    kernels::DecodeTuning regs = fp8_kernel_pin(kernels::DecodeFp8Kernel::kRegisters);
    regs.slots = 2;
    p.regs->set_tuning(regs);
    regs.fp8_kernel = kernels::DecodeFp8Kernel::kRegistersDeep;
    p.deep->set_tuning(regs);
    pairs.push_back(std::move(p));
  };
  uint64_t seed = 1100;
  const std::vector<int32_t> ragged = {1, 33, 64, 65, 700, 2049, 5000};
  for (int page : {1, 7, 16, 128})
    for (int d : {64, 128})
      for (auto [hq, hk] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{6, 2}, std::pair{16, 2}}) {
        const DType dt = seed % 2 ? DType::kBF16 : DType::kF16;
        add(dshape(ragged, hq, hk, d, page, dt, true, seed), seed % 3 == 0 ? 64 : 256, page > 1);
        ++seed;
      }
  add(dshape({40000}, 32, 8, 128, 128, DType::kBF16, true, seed++), 256, false);
  add(dshape({32768, 9, 3000}, 32, 2, 128, 16, DType::kBF16, true, seed++), 256, true);
  PagedCaseShape win = dshape({0, 1, 700, 9000}, 8, 2, 128, 16, DType::kBF16, true, seed++);
  win.window = 65;
  add(win, 64, false);
  for (int d : {64, 128}) {
    // V scales near 2^-24 (some pages above, some below: both V routes, key by key at page 1).
    add(dshape({300, 4097}, 8, 2, d, 1, DType::kF16, true, seed++), 64, false, 0, -19);
    add(dshape({300, 4097}, 8, 2, d, 7, DType::kF16, true, seed++), 64, true, 0, -19);
    add(dshape({300, 4097}, 8, 2, d, 128, DType::kF16, true, seed++), 64, false, 10, 0);
  }
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (Pair& p : pairs) {
    SCOPED_TRACE(p.regs->name());
    // Before the launches, flushed: a kernel that never returns names its case.
    std::printf("  %s\n", p.regs->name().c_str());
    std::fflush(stdout);
    std::vector<uint16_t> out[3];
    std::vector<float> lse[3];
    int i = 0;
    for (DecodeCase* c : {p.tile.get(), p.regs.get(), p.deep.get()}) {
      c->prepare(stream);
      c->launch(stream);
      LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
      const CaseResult r = c->check();
      EXPECT_EQ(r.status, Status::kOk) << (i == 0   ? "tile: "
                                           : i == 1 ? "registers: "
                                                    : "deep: ")
                                       << r.detail;
      out[i] = c->output();
      lse[i] = c->output_lse();
      ++i;
    }
    EXPECT_EQ(p.deep->plan().chunk_tokens, p.regs->plan().chunk_tokens);
    EXPECT_TRUE(out[2] == out[1]) << "the deeper ring's outputs differ from kRegisters'";
    EXPECT_EQ(std::memcmp(lse[2].data(), lse[1].data(), lse[1].size() * 4), 0)
        << "the deeper ring's lse differs from kRegisters'";
    const DType dt = p.regs->dtype();
    double max_old = 0;
    for (uint16_t x : out[0])
      max_old = std::max(max_old, std::fabs(double(half_bits_to_f32(x, dt))));
    // Plus two of f16's subnormal steps (2^-24): outputs of the tiny V scales are subnormal.
    int64_t bad = 0;
    double worst = 0;
    for (size_t e = 0; e < out[0].size(); ++e) {
      const double a = half_bits_to_f32(out[0][e], dt), b = half_bits_to_f32(out[1][e], dt);
      const double diff = std::fabs(a - b);
      if (!(diff <= 0x1p-6 * (std::fabs(a) + max_old / 16) + 0x1p-23)) ++bad;
      if (!(diff <= worst)) worst = diff;
    }
    EXPECT_EQ(bad, 0) << "outputs apart by up to " << worst << " (max |output| " << max_old << ")";
    int64_t lse_bad = 0;  // both unwritten (NaN: no lse), or both -inf (empty), or within 1e-4
    for (size_t e = 0; e < lse[0].size(); ++e) {
      const float a = lse[0][e], b = lse[1][e];
      if (a == b || (std::isnan(a) && std::isnan(b))) continue;
      if (!(std::fabs(double(a) - b) <= 1e-4)) ++lse_bad;
    }
    EXPECT_EQ(lse_bad, 0);
  }
  cudaStreamDestroy(stream);
}

// Timing only (LONGCTX_PERF=1): batch 1 and 8 at 32K and 128K keys, Llama-3.1-8B heads (32 / 8
// x 128), pages of 16 and 128, bf16 KV, then FP8 KV on the converting-tile kernel ("(tile)") and
// on the registers kernel (the default) and its deeper ring ("(deep)"), in the same process (the
// same GPU).
TEST(DecodeFp8Gpu, PerfBf16VsFp8) {
  if (!perf_mode()) GTEST_SKIP() << "set LONGCTX_PERF=1";
  std::vector<std::unique_ptr<OpCase>> cases;
  for (int32_t kv : {32768, 131072})
    for (int batch : {1, 8})
      for (int page : {16, 128})
        for (int kind : {0, 1, 2, 3}) {  // bf16, FP8 tile, FP8 registers, FP8 deeper ring
          auto c = std::make_unique<DecodeCase>(
              dshape(std::vector<int32_t>(batch, kv), 32, 8, 128, page, DType::kBF16, true, 7),
              true, 256, 0, false, kind > 0);
          if (kind == 1) c->set_tuning(fp8_kernel_pin(kernels::DecodeFp8Kernel::kConvertTile));
          if (kind == 3) c->set_tuning(fp8_kernel_pin(kernels::DecodeFp8Kernel::kRegistersDeep));
          cases.push_back(std::move(c));
        }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// Verify steps (several queries per request; kernels/decode_params.h's causal tail): the same
// case with query counts, against the CPU reference (itself checked against the paged prefill
// reference in tests/kernels/decode_verify_ref_test.cpp) under the tolerances above.
std::unique_ptr<DecodeCase> verify_case(std::vector<int32_t> q, std::vector<int32_t> kv, int hq,
                                        int hk, int d, int page, DType dt, uint64_t seed,
                                        int min_chunk = 256, bool nan_tail = false,
                                        bool fp8 = false,
                                        kernels::MaskMode mask = kernels::MaskMode::kCausal,
                                        int window = 0, int q_pad = 0) {
  PagedCaseShape s = dshape(std::move(kv), hq, hk, d, page, dt, seed % 3 != 0, seed);
  s.window = window;
  auto c = std::make_unique<DecodeCase>(s, false, min_chunk, q_pad, nan_tail, fp8);
  c->set_queries(std::move(q), mask);
  return c;
}

void expect_all_pass(std::vector<std::unique_ptr<OpCase>>& cases) {
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// Mixed query counts in one batch (0, 1, K + 1 up to 16; more queries than keys) over page
// sizes x GQA x head_dim x dtype, split and unsplit requests, NaN tails in the last pages.
TEST(DecodeVerifyGpu, MixedQueryCountsOverTheGrid) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 500;
  for (int page : {1, 16, 128})
    for (int group : {1, 4, 8})
      for (int d : {64, 128}) {
        const DType dt = seed % 2 ? DType::kBF16 : DType::kF16;
        cases.push_back(verify_case({3, 1, 9, 16, 2, 5, 0}, {0, 1, 7, 300, 1025, 4097, 50},
                                    2 * group, 2, d, page, dt, seed++, 64, page > 1));
      }
  expect_all_pass(cases);
}

// Every K + 1 of 1 .. 9 and 16 at one long request (split over the GPU: the fused merge of
// q_len x heads partial states) and a short batch, both loaders (pages of 16: the ring; 128: TMA).
TEST(DecodeVerifyGpu, QueryCountsOneToNineAndSixteen) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 600;
  for (int q : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
    cases.push_back(verify_case({q}, {40000}, 32, 8, 128, q % 2 ? 16 : 128, DType::kBF16, seed++));
    cases.push_back(verify_case({q, q, 1}, {100, 2049, 63}, 8, 2, 64, q % 2 ? 128 : 16, DType::kF16,
                                seed++, 64));
  }
  expect_all_pass(cases);
}

// Sliding windows per query, the no-mask rule (the offload path's ring items), q read in place
// from fused QKV rows, head_dim 256, GQA 16 (x 9 queries: 18 row tiles per kv head) and 3.
TEST(DecodeVerifyGpu, WindowsNoMaskStridedQAndOddShapes) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 700;
  for (int window : {1, 7, 65, 1000})
    for (int page : {16, 128})
      cases.push_back(verify_case({9, 1, 4}, {5000, 700, 3}, 8, 2, 128, page, DType::kBF16, seed++,
                                  64, false, false, kernels::MaskMode::kCausal, window));
  for (int page : {16, 128})
    cases.push_back(verify_case({9, 3, 1}, {3000, 17, 0}, 32, 8, 128, page, DType::kBF16, seed++,
                                256, false, false, kernels::MaskMode::kNone));
  cases.push_back(verify_case({9, 1}, {3000, 700}, 32, 8, 128, 128, DType::kBF16, seed++, 256,
                              false, false, kernels::MaskMode::kCausal, 0, 2 * 8 * 128));
  cases.push_back(verify_case({5, 9}, {1000, 40}, 16, 8, 256, 16, DType::kBF16, seed++, 64));
  cases.push_back(verify_case({9, 2}, {3000, 70}, 32, 2, 128, 128, DType::kBF16, seed++));
  cases.push_back(verify_case({7, 1}, {5000, 17}, 6, 2, 128, 16, DType::kF16, seed++, 64));
  cases.push_back(verify_case({16}, {131000}, 8, 8, 64, 16, DType::kBF16, seed++));
  expect_all_pass(cases);
}

// The plan's loaders and stage fills over verify rows.
TEST(DecodeVerifyGpu, OverTheLoaders) {
  for (const kernels::DecodeTuning& t :
       {decode_pins(kernels::DecodeLoader::kCpAsync, kAutoCopy),
        decode_pins(kernels::DecodeLoader::kTmaTile, kAutoCopy),
        decode_pins(kAutoLoader, kernels::DecodeStageCopy::kCpAsync),
        decode_pins(kAutoLoader, kernels::DecodeStageCopy::kTmaBoxes)}) {
    std::vector<std::unique_ptr<OpCase>> cases;
    uint64_t seed = 800;
    for (int page : {16, 64, 128})
      for (int d : {64, 128})
        cases.push_back(verify_case({9, 1, 16}, {4097, 33, 20000}, 32, 8, d, page, DType::kBF16,
                                    seed++, 64, true));
    set_tuning(cases, t);
    expect_all_pass(cases);
  }
}

// FP8 pages through the converting ring with verify rows.
TEST(DecodeVerifyFp8Gpu, MixedQueryCounts) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 900;
  for (int page : {1, 16, 128})
    for (int d : {64, 128})
      cases.push_back(verify_case({9, 1, 16, 0, 4}, {4097, 7, 300, 0, 20000}, 32, 8, d, page,
                                  DType::kBF16, seed++, 64, true, true));
  expect_all_pass(cases);
}

// A verify step's launch captured in a CUDA graph and replayed (the plan/run split unchanged).
TEST(DecodeVerifyGpu, CudaGraphReplayMatchesDirectLaunch) {
  for (int page : {16, 128}) {
    std::unique_ptr<DecodeCase> c =
        verify_case({9, 1, 5}, {9000, 3, 700}, 32, 8, 128, page, DType::kBF16, 1000);
    cudaStream_t stream;
    LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    c->prepare(stream);
    c->launch(stream);
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
    CaseResult direct = c->check();
    EXPECT_EQ(direct.status, Status::kOk) << direct.detail;
    replay_in_graph(*c, stream, [&] { c->reset_outputs(); });
    CaseResult replay = c->check();
    EXPECT_EQ(replay.status, Status::kOk) << replay.detail;
    EXPECT_EQ(replay.max_abs_out, direct.max_abs_out);
    cudaStreamDestroy(stream);
  }
}

// Timing only (LONGCTX_PERF=1): the needle model's verify step (batch 1, K + 1 = 9 queries over
// 131K keys, 32 / 8 heads of 128, bf16) on the split-KV decode, beside the plain decode step
// (1 query); PrefillGpu.PerfVerifyStep times the same step on the paged prefill. Run both in one
// process: --gtest_filter='*PerfVerifyStep*'.
TEST(DecodeVerifyGpu, PerfVerifyStep) {
  if (!perf_mode()) GTEST_SKIP() << "set LONGCTX_PERF=1";
  std::vector<std::unique_ptr<OpCase>> cases;
  for (int page : {16, 128})
    for (int q : {1, 9}) {
      auto c = std::make_unique<DecodeCase>(
          dshape({131072}, 32, 8, 128, page, DType::kBF16, true, 7), true);
      c->set_queries({q}, kernels::MaskMode::kCausal);
      cases.push_back(std::move(c));
    }
  expect_all_pass(cases);
}

}  // namespace
}  // namespace longctx::gpu_test
