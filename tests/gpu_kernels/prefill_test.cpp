// CUDA paged prefill (dense and block-sparse) against the CPU reference, through the op-test
// harness (harness.h). Tolerances (unit-variance q/k/v, sm_scale = 1/sqrt(head_dim)):
//   output max-abs <= 2e-2 (bf16) / 4e-3 (f16): the kernel rounds P to the input dtype before
//     P.V and the output once; the reference rounds only the output;
//   lse max-abs <= 1e-3 (fp32 online softmax with ex2.approx vs exp in fp32);
//   rows that see no key: o == 0 and lse == -inf exactly.
// Big cases compare a sample of query tokens (paged_prefill_case.h).
#include "kernels/cuda/prefill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "gpu_kernels/harness.h"
#include "gpu_kernels/paged_prefill_case.h"
#include "gpu_kernels/prefill_case.h"
#include "kernels/cuda/fp8_stage.h"
#include "kernels/cuda/func_attributes.h"
#include "kernels/paged_case.h"
#include "longctx/core/error.h"

namespace longctx::gpu_test {
namespace {

using kernels::MaskMode;
using testing::PagedCase;
using testing::PagedCaseShape;

// Single requests over the required grid of query lengths, cycling page size, GQA ratio,
// head_dim, dtype and LSE so that every value meets every query length and both masks.
TEST(PrefillHarness, DenseSingleRequests) {
  std::vector<std::unique_ptr<OpCase>> cases;
  const int pages[] = {1, 16, 128};
  const int groups[] = {1, 4, 8};
  int idx = 0;
  for (int q : {1, 7, 127, 128, 129, 1000}) {
    std::vector<int> kvs = {q, q + 517};
    if (q == 1 || q == 129) kvs.push_back(40000);
    for (int kv : kvs) {
      for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
        const int group = groups[(idx + idx / 3) % 3];
        const int hk = group == 8 ? 1 : 2;
        const int d = ((idx / 2) % 2) ? 64 : 128;
        const DType dt = (idx % 4 < 2) ? DType::kBF16 : DType::kF16;
        cases.push_back(std::make_unique<PrefillCase>(shape(
            {q}, {kv}, group * hk, hk, d, pages[idx % 3], dt, mode, idx % 5 != 4, 1000 + idx)));
        ++idx;
      }
    }
  }
  expect_no_failures(run_cases(cases), 28);
}

// Several requests in one launch: empty segments, kv < q under causal (rows that see nothing),
// a request with no KV at all, odd GQA ratios.
TEST(PrefillHarness, MixedBatches) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 2000;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (int d : {64, 128}) {
        cases.push_back(
            std::make_unique<PrefillCase>(shape({1, 7, 0, 300, 129, 5}, {1, 3, 10, 1000, 5000, 0},
                                                8, 2, d, 16, dt, mode, true, seed++)));
      }
    }
    cases.push_back(std::make_unique<PrefillCase>(
        shape({33, 200}, {700, 199}, 6, 2, 128, 7, DType::kBF16, mode, true, seed++)));  // GQA 3
    cases.push_back(std::make_unique<PrefillCase>(
        shape({64, 17}, {64, 2000}, 5, 5, 64, 256, DType::kF16, mode, true, seed++)));  // GQA 1
    cases.push_back(std::make_unique<PrefillCase>(
        shape({16, 1, 3}, {4096, 1, 77}, 32, 4, 128, 1, DType::kBF16, mode, false, seed++)));
  }
  expect_no_failures(run_cases(cases), 14);
}

TEST(PrefillHarness, BlockSparse) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 3000;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
    for (bool per_head : {false, true}) {
      for (int hk : {2, 1}) {
        PagedCaseShape s = shape({130, 1000}, {300, 4000}, hk == 2 ? 8 : 3, hk, 128, 16,
                                 DType::kBF16, mode, true, seed++);
        s.sparse_keep = 0.3;
        s.sparse_per_head = per_head;
        cases.push_back(std::make_unique<PrefillCase>(s));
      }
    }
    PagedCaseShape s =
        shape({7, 129}, {40000, 129}, 4, 1, 64, 128, DType::kF16, mode, true, seed++);
    s.sparse_keep = 0.1;
    s.sparse_per_head = true;
    cases.push_back(std::make_unique<PrefillCase>(s));
    // One mask per KV group written for each of its q heads (XAttention's default): the tiles
    // whose rows all keep a block skip the per-row masking. GQA 4 and 3 (tiles of 32 and 42.7
    // tokens, the latter straddling query blocks), dense-ish and sparse masks.
    for (double keep : {0.3, 0.9}) {
      for (int hq : {32, 6}) {
        PagedCaseShape g = shape({300, 2000}, {5000, 2000}, hq, hq == 32 ? 8 : 2, 128, 16,
                                 DType::kBF16, mode, true, seed++);
        g.sparse_keep = keep;
        g.sparse_per_head = true;
        g.sparse_same_in_group = true;
        cases.push_back(std::make_unique<PrefillCase>(g));
      }
    }
  }
  expect_no_failures(run_cases(cases), 18);
}

TEST(PrefillHarness, UnsupportedShapesAreReportedNotFailed) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<PrefillCase>(
      shape({7}, {20}, 4, 1, 96, 16, DType::kBF16, MaskMode::kCausal)));
  cases.push_back(
      std::make_unique<PrefillCase>(shape({7}, {20}, 4, 1, 512, 16, DType::kF16, MaskMode::kNone)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.unsupported, 2);
  EXPECT_EQ(s.failed, 0);
}

// head_dim 256 (Gemma 3: 16 q / 8 kv heads, windows of 1024 on five layers in six) on the default
// kernel (the Hopper one's 64-key tiling on sm_90, else the mma.sync kernel's 8-warp tiling; both
// forced: prefill_d256_test.cpp), dense and causal, odd lengths, pages of 1 / 16 / 128, windows,
// f16, a block-sparse mask and a long causal request.
TEST(PrefillHarness, HeadDim256) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 5000;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
    cases.push_back(
        std::make_unique<PrefillCase>(shape({1, 7, 129, 0, 300}, {1, 520, 129, 9, 2000}, 16, 8, 256,
                                            16, DType::kBF16, mode, true, seed++)));
    cases.push_back(std::make_unique<PrefillCase>(
        shape({64, 17}, {64, 1000}, 4, 4, 256, 1, DType::kF16, mode, true, seed++)));
  }
  cases.push_back(std::make_unique<PrefillCase>(
      shape({1000}, {6000}, 16, 8, 256, 128, DType::kBF16, MaskMode::kCausal, true, seed++)));
  for (int window : {1, 100, 1024}) {
    PagedCaseShape w = shape({1, 130, 1000}, {500, 130, 3100}, 16, 8, 256, 16, DType::kBF16,
                             MaskMode::kCausal, true, seed++);
    w.window = window;
    cases.push_back(std::make_unique<PrefillCase>(w));
  }
  PagedCaseShape sp =
      shape({130, 700}, {300, 3000}, 8, 2, 256, 16, DType::kBF16, MaskMode::kCausal, true, seed++);
  sp.sparse_keep = 0.3;
  sp.sparse_per_head = true;
  cases.push_back(std::make_unique<PrefillCase>(sp));
  expect_no_failures(run_cases(cases), 9);
}

// A reduced set for compute-sanitizer (memcheck, racecheck).
TEST(PrefillHarness, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<PrefillCase>(
      shape({7, 129}, {50, 300}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, 1)));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({3, 70}, {5, 70}, 3, 1, 64, 1, DType::kF16, MaskMode::kNone, true, 2)));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({5, 140}, {90, 300}, 4, 2, 256, 16, DType::kBF16, MaskMode::kCausal, true, 6)));
  PagedCaseShape s = shape({130}, {300}, 4, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, 3);
  s.sparse_keep = 0.4;
  s.sparse_per_head = true;
  cases.push_back(std::make_unique<PrefillCase>(s));
  s = shape({300}, {700}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, 4);
  s.sparse_keep = 0.7;
  s.sparse_per_head = true;
  s.sparse_same_in_group = true;
  cases.push_back(std::make_unique<PrefillCase>(s));
  // Pages of 128 (the TMA at head_dim 128, with a cp.async tail), dense and block-sparse.
  cases.push_back(std::make_unique<PrefillCase>(
      shape({7, 200}, {150, 333}, 8, 2, 128, 128, DType::kBF16, MaskMode::kCausal, true, 5)));
  s.page_size = 128;
  s.seed = 6;
  cases.push_back(std::make_unique<PrefillCase>(s));
  // Consecutive single-token pages (block-causal's layout: TMA boxes at page size 1).
  s = shape({64, 3}, {192, 70}, 8, 2, 128, 1, DType::kBF16, MaskMode::kNone, true, 7);
  s.contiguous_pages = true;
  cases.push_back(std::make_unique<PrefillCase>(s));
  // Head_dim 64 on pages of 128 (TMA).
  cases.push_back(std::make_unique<PrefillCase>(
      shape({7, 130}, {150, 333}, 4, 1, 64, 128, DType::kF16, MaskMode::kCausal, true, 8)));
  // Two long units: the stream-K split over every SM and the merge of their pieces; at head_dim
  // 64 of 192-row tiles on sm_90.
  cases.push_back(std::make_unique<PrefillCase>(
      shape({32}, {20000}, 8, 2, 128, 128, DType::kBF16, MaskMode::kCausal, true, 9)));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({50}, {20000}, 8, 2, 64, 128, DType::kBF16, MaskMode::kCausal, true, 10)));
  expect_no_failures(run_cases(cases), 10);
}

// Sliding windows (Mistral, Gemma 3's local layers) over both prefill kernels (Hopper and
// mma.sync): windows from one key to past the history, windows that end inside the first page,
// chunks that continue a history (the trimmed tables the paged backend passes start anywhere),
// GQA, head dims 64 / 128, pages of 1 / 16 / 128 (TMA), bf16 and f16.
TEST(PrefillHarness, SlidingWindow) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 100;
  for (kernels::PrefillKernel kernel :
       {kernels::PrefillKernel::kSm90, kernels::PrefillKernel::kFa2}) {
    kernels::PrefillTuning t;
    t.kernel = kernel;
    for (int window : {1, 17, 64, 100, 255, 1000, 5000}) {
      const int page = window % 3 == 0 ? 1 : window % 3 == 1 ? 16 : 128;
      const int d = window % 2 ? 128 : 64;
      const DType dt = window == 17 ? DType::kF16 : DType::kBF16;
      PagedCaseShape s = shape({1, 7, 130, 300, 1000}, {1, 500, 130, 2000, 3100}, 8, 2, d, page, dt,
                               MaskMode::kCausal, true, seed++);
      s.window = window;
      cases.push_back(std::make_unique<PrefillCase>(s, false, t));
    }
  }
  expect_no_failures(run_cases(cases), 10);
}

// A plan's row tiles belong to the kernel it was made for: run() refuses a plan of tiles the
// kernel it takes does not use (192-row tiles are the Hopper kernel's at head_dim 64 only).
TEST(PrefillHarness, PlanOfAnotherTileIsRefused) {
  kernels::PagedPrefillParams p;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.page_size = 16;
  p.dtype = DType::kBF16;
  p.mask_mode = MaskMode::kCausal;
  kernels::cuda::PrefillPlan plan;
  plan.num_qo_heads = 8;
  plan.num_kv_heads = 2;
  plan.mask_mode = MaskMode::kCausal;
  plan.tile_rows = kernels::cuda::kPrefillMaxTileRows;
  for (kernels::PrefillKernel kernel :
       {kernels::PrefillKernel::kFa2, kernels::PrefillKernel::kSm90})
    for (int d : {64, 128}) {
      plan.tuning.kernel = kernel;
      if (d == 64 && kernels::cuda::paged_prefill_tile_rows(64, plan.tuning) == plan.tile_rows)
        continue;  // the one kernel of 192-row tiles
      p.head_dim = plan.head_dim = d;
      p.sm_scale = 1.f / std::sqrt(float(d));
      EXPECT_THROW(kernels::cuda::paged_prefill_run(p, plan, nullptr), Error)
          << (kernel == kernels::PrefillKernel::kFa2 ? "fa2" : "sm90") << " head_dim " << d;
    }
}

// Each kernel path forced through PrefillTuning (the mma.sync kernel, and the sm_90a wgmma kernel
// where the device has it, in each of its variants; elsewhere kSm90 falls back to mma.sync), on a
// mix of page sizes (1 = the block-causal layout), GQA ratios, masks, dtypes and block-sparse
// rows. The other tests use the default tuning.
TEST(PrefillHarness, EachKernelPath) {
  using kernels::PrefillKernel;
  using kernels::PrefillLean;
  using kernels::PrefillSm90Variant;
  using kernels::PrefillSplitMode;
  constexpr auto kSm90 = PrefillKernel::kSm90;
  constexpr auto kPingpong = PrefillSm90Variant::kPingpong;
  constexpr auto kPersistent = PrefillSm90Variant::kPersistent;
  constexpr auto kAutoSplit = PrefillSplitMode::kAuto;
  constexpr auto kAlways = PrefillSplitMode::kAlways;
  constexpr auto kAutoLean = PrefillLean::kAuto;
  struct Path {
    PrefillKernel kernel;
    PrefillSm90Variant variant;
    bool tma;                // the default variant; pages of a multiple of 64 or consecutive
    PrefillSplitMode split;  // kAuto: the model decides
    int rows;                // head_dim64_rows: 192-row tiles at head_dim 64 on sm_90, or 128
    int heads;               // unit_heads (0: the default unit order)
    PrefillLean lean;  // kAuto: lean without a block mask; kFull; kLean2 / kLean3: that many stages
  };
  // At head_dim 64 the default rows take the three-warpgroup kernel (pingpong, or persistent
  // without turns); 128 the two-warpgroup one.
  const Path paths[] = {{PrefillKernel::kFa2, kPingpong, true, kAutoSplit, 192, 0, kAutoLean},
                        {kSm90, kPersistent, true, kAutoSplit, 192, 0, kAutoLean},
                        {kSm90, PrefillSm90Variant::kGrid, true, kAutoSplit, 128, 0, kAutoLean},
                        {kSm90, kPingpong, true, kAutoSplit, 192, 0, kAutoLean},
                        {kSm90, kPingpong, false, kAutoSplit, 192, 0, kAutoLean},
                        {kSm90, kPingpong, true, kAlways, 192, 0, kAutoLean},
                        {kSm90, kPingpong, false, kAlways, 192, 0, kAutoLean},
                        {kSm90, kPingpong, true, kAutoSplit, 128, 0, kAutoLean},
                        {kSm90, kPersistent, false, kAlways, 128, 0, kAutoLean},
                        {kSm90, kPingpong, true, kAutoSplit, 192, 1, kAutoLean},
                        {kSm90, kPingpong, false, kAlways, 192, 2, kAutoLean},
                        {kSm90, kPingpong, true, kAutoSplit, 192, 0, PrefillLean::kFull},
                        {kSm90, kPingpong, false, kAlways, 192, 0, PrefillLean::kFull},
                        {kSm90, kPingpong, true, kAlways, 192, 0, PrefillLean::kLean3},
                        {kSm90, kPingpong, false, kAutoSplit, 192, 0, PrefillLean::kLean2}};
  for (const Path& path : paths) {
    kernels::PrefillTuning tuning;
    tuning.kernel = path.kernel;
    tuning.variant = path.variant;
    tuning.tma = path.tma;
    tuning.split = path.split;
    tuning.head_dim64_rows = path.rows;
    tuning.unit_heads = path.heads;
    tuning.lean = path.lean;
    std::printf("kernel %d variant %d tma %d split %d rows %d unit_heads %d lean %d\n",
                int(path.kernel), int(path.variant), int(path.tma), int(path.split), path.rows,
                path.heads, int(path.lean));
    std::vector<std::unique_ptr<OpCase>> cases;
    uint64_t seed = 5000;
    for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
      for (DType dt : {DType::kBF16, DType::kF16}) {
        cases.push_back(
            std::make_unique<PrefillCase>(shape({1, 7, 0, 300, 129, 5}, {1, 3, 10, 1000, 5000, 0},
                                                8, 2, 128, 16, dt, mode, true, seed++),
                                          false, tuning));
        cases.push_back(std::make_unique<PrefillCase>(
            shape({64, 200, 1000}, {64, 700, 1517}, 32, 8, 128, 1, dt, mode, true, seed++), false,
            tuning));
        for (int page : {1, 16, 256})  // head_dim 64
          cases.push_back(
              std::make_unique<PrefillCase>(shape({1, 7, 300, 129, 1000}, {1, 10, 1000, 5000, 1517},
                                                  8, 2, 64, page, dt, mode, true, seed++),
                                            false, tuning));
      }
      cases.push_back(std::make_unique<PrefillCase>(
          shape({33, 200}, {700, 199}, 6, 2, 128, 7, DType::kBF16, mode, true, seed++), false,
          tuning));
      cases.push_back(std::make_unique<PrefillCase>(
          shape({129}, {40000}, 4, 4, 128, 256, DType::kBF16, mode, true, seed++), false, tuning));
      // TMA halves beside cp.async tails (kv_len % 64 != 0) at pages of 64 / 128; 16 / 32 copy
      // by cp.async.
      for (int page : {16, 32, 64, 128})
        for (int d : {128, 64})
          cases.push_back(
              std::make_unique<PrefillCase>(shape({1, 100, 300, 64}, {63, 700, 4133, 64}, 8, 2, d,
                                                  page, DType::kBF16, mode, true, seed++),
                                            false, tuning));
      // Consecutive pages (kv_contiguous, the TMA at any page size): pages of 1 (the
      // block-causal layout), 7 and 16, runs of 64 keys beside tails.
      for (int page : {1, 7, 16}) {
        for (int d : {128, 64}) {
          PagedCaseShape c = shape({64, 1, 300, 100, 0}, {64, 63, 4133, 1517, 5}, 32, 8, d, page,
                                   DType::kBF16, mode, true, seed++);
          c.contiguous_pages = true;
          cases.push_back(std::make_unique<PrefillCase>(c, false, tuning));
        }
      }
      PagedCaseShape s =
          shape({130, 1000}, {300, 4000}, 8, 2, 128, 16, DType::kBF16, mode, true, seed++);
      s.sparse_keep = 0.3;
      s.sparse_per_head = true;
      cases.push_back(std::make_unique<PrefillCase>(s, false, tuning));
      s.seed = seed++;
      s.sparse_keep = 0.7;
      s.sparse_same_in_group = true;
      cases.push_back(std::make_unique<PrefillCase>(s, false, tuning));
      s.seed = seed++;
      s.page_size = 128;  // the TMA's boxes (head_dim 128)
      cases.push_back(std::make_unique<PrefillCase>(s, false, tuning));
      s.seed = seed++;
      s.head_dim = 64;
      cases.push_back(std::make_unique<PrefillCase>(s, false, tuning));
      s.seed = seed++;
      s.head_dim = 128;
      s.page_size = 1;
      s.contiguous_pages = true;  // block-sparse over the TMA's boxes of single-token pages
      cases.push_back(std::make_unique<PrefillCase>(s, false, tuning));
    }
    expect_no_failures(run_cases(cases), 16);
  }
}

// The stream-K split where the model takes it (the default PrefillTuning::split): units that leave
// SMs idle (a few long units; a last round that does not fill the GPU), cut units merged across
// pieces, with and without LSE, both head dims, the TMA and cp.async loaders, block-sparse; the
// plan must have split (on sm_90 only: elsewhere the path is the mma.sync kernel).
TEST(PrefillHarness, StreamKSplitWhereItPays) {
  std::vector<std::unique_ptr<OpCase>> cases;
  std::vector<PrefillCase*> split_cases;
  uint64_t seed = 7000;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
    for (int d : {128, 64}) {
      for (int page : {16, 128}) {
        // 32 tokens x 4 heads = one row tile per kv head over 60K keys: 2 units on 132 SMs.
        cases.push_back(std::make_unique<PrefillCase>(
            shape({32}, {60000}, 8, 2, d, page, DType::kBF16, mode, true, seed++)));
        // 3 requests, 9 row tiles x 8 kv heads of unequal length: 72 units.
        cases.push_back(
            std::make_unique<PrefillCase>(shape({200, 64, 70}, {9000, 3000, 20000}, 32, 8, d, page,
                                                DType::kF16, mode, (seed & 1) != 0, seed++)));
      }
    }
    PagedCaseShape s = shape({130}, {50000}, 8, 2, 128, 128, DType::kBF16, mode, true, seed++);
    s.sparse_keep = 0.4;
    s.sparse_per_head = true;
    cases.push_back(std::make_unique<PrefillCase>(s));
  }
  for (auto& c : cases) split_cases.push_back(static_cast<PrefillCase*>(c.get()));
  // 5 row tiles of tokens x 4 heads = 20 row tiles x 8 kv heads = 160 units, 1.2 rounds on 132
  // SMs. Non-causal (equal units) the model must run a whole round, then cut the other 28 units
  // over every CTA; causal, the units' lengths differ and the model may rather cut every unit
  // (at head_dim 64's 192-row tiles it does), so those cases check whatever it chose.
  std::vector<PrefillCase*> hybrid_cases;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal})
    for (auto [d, page] : {std::pair{128, 128}, std::pair{64, 16}}) {
      const int tokens = 5 * kernels::cuda::paged_prefill_tile_rows(d);
      cases.push_back(std::make_unique<PrefillCase>(
          shape({tokens}, {2000}, 32, 8, d, page, DType::kBF16, mode, true, seed++)));
      if (mode == MaskMode::kNone)
        hybrid_cases.push_back(static_cast<PrefillCase*>(cases.back().get()));
    }
  // A 2K chunk over 30K keys (K/V 120 MB, over 1.5 times the L2 of an H100 / H200): 512 equal
  // units, 3.88 rounds, one kv head per block of units and the last rounds cut
  // (plan_prefill_schedule).
  cases.push_back(std::make_unique<PrefillCase>(
      shape({2048}, {30720}, 32, 8, 128, 128, DType::kBF16, MaskMode::kNone, true, seed++)));
  const PrefillCase* one_head_case = static_cast<PrefillCase*>(cases.back().get());
  expect_no_failures(run_cases(cases), 23);
  if (kernels::cuda::paged_prefill_sm90_path(128)) {
    for (const PrefillCase* c : split_cases)
      EXPECT_GT(c->plan().split_ctas, 0) << "a shape that leaves SMs idle was not split";
    if (kernels::cuda::current_sm_count() == 132) {  // the H100 / H200 count the shapes assume
      for (const PrefillCase* c : hybrid_cases)
        EXPECT_GT(c->plan().split_dp_rounds, 0) << "a short last round was not cut alone";
      if (kernels::cuda::current_l2_bytes() <= (int64_t(64) << 20)) {
        EXPECT_EQ(one_head_case->plan().unit_heads, 1);
        EXPECT_EQ(one_head_case->plan().split_dp_rounds, 3);
      }
    }
  }
}

// run() must be capturable in a CUDA graph and replay to the same bits (head_dim 64: the
// 192-row tiles on sm_90).
TEST(PrefillHarness, CudaGraphReplayMatchesDirectLaunch) {
  for (int d : {128, 64}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << d);
    PrefillCase c(shape({100, 300}, {700, 300}, 8, 2, d, 16, DType::kBF16, MaskMode::kCausal));
    expect_graph_replay_matches_direct_launch(c);
  }
}

// Perf mode only (LONGCTX_PERF=1): the timing points, 32 q / 8 kv heads, head_dim 128
// (and 64 where named).
TEST(PrefillHarness, Perf) {
  if (!perf_mode()) GTEST_SKIP() << "set LONGCTX_PERF=1";
  std::vector<std::unique_ptr<OpCase>> cases;
  const DType bf = DType::kBF16;
  cases.push_back(std::make_unique<PrefillCase>(
      shape({8192}, {8192}, 32, 8, 128, 16, bf, MaskMode::kCausal, false), true));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({32768}, {32768}, 32, 8, 128, 16, bf, MaskMode::kCausal, false), true));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({32768}, {32768}, 32, 8, 128, 128, bf, MaskMode::kCausal, false), true));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({2048}, {30720}, 32, 8, 128, 16, bf, MaskMode::kNone, true), true));
  for (int n : {8192, 32768})  // head_dim 64 (Llama-3.2-1B class heads)
    cases.push_back(std::make_unique<PrefillCase>(
        shape({n}, {n}, 32, 8, 64, 16, bf, MaskMode::kCausal, false), true));
  PagedCaseShape sp = shape({32768}, {32768}, 32, 8, 128, 128, bf, MaskMode::kCausal, true);
  sp.sparse_keep = 0.25;
  cases.push_back(std::make_unique<PrefillCase>(sp, true));
  sp.sparse_per_head = true;  // one mask per KV group, written per q head (XAttention's)
  sp.sparse_same_in_group = true;
  cases.push_back(std::make_unique<PrefillCase>(sp, true));
  expect_no_failures(run_cases(cases), 8);
}

// The FP8 readers: the default tuning (staged, then the 16-bit Hopper kernel on sm_90, else the
// mma.sync kernel), the in-kernel conversion of the default kernel (fp8_stage_mib 0: the Hopper
// kernel's converting producer on sm_90) and of the mma.sync kernel (PrefillKernel::kFa2).
kernels::PrefillTuning in_kernel_tuning() {
  kernels::PrefillTuning t;
  t.fp8_stage_mib = 0;
  return t;
}
kernels::PrefillTuning fa2_tuning() {
  kernels::PrefillTuning t = in_kernel_tuning();
  t.kernel = kernels::PrefillKernel::kFa2;
  return t;
}

// FP8 pages against the CPU reference on the same codes: single requests and mixed batches over
// head_dim 64 / 128, GQA 1 .. 8, pages 1 .. 256, both masks, partial last pages, block-sparse
// masks and windows (sampled checks for the long ones), on each reader (the default one first).
// Tolerances: the 16-bit kernel's, doubled (V rows up to 2x larger in fp8_pages.h).
std::vector<PagedCaseShape> fp8_shapes() {
  std::vector<PagedCaseShape> shapes;
  uint64_t seed = 5000;
  int idx = 0;
  for (int q : {1, 7, 129, 1000}) {
    for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
      const int group = (idx % 3 == 0) ? 1 : (idx % 3 == 1) ? 4 : 8;
      const int hk = group == 8 ? 1 : 2;
      const int d = idx % 2 ? 64 : 128;
      const DType dt = idx % 4 < 2 ? DType::kBF16 : DType::kF16;
      const int page = idx % 3 == 0 ? 1 : idx % 3 == 1 ? 16 : 128;
      shapes.push_back(
          shape({q}, {q + 517}, group * hk, hk, d, page, dt, mode, idx % 5 != 4, seed++));
      ++idx;
    }
  }
  for (int d : {64, 128})
    shapes.push_back(shape({1, 7, 0, 300, 129, 5}, {1, 3, 10, 1000, 5000, 0}, 8, 2, d, 16,
                           DType::kBF16, MaskMode::kCausal, true, seed++));
  shapes.push_back(
      shape({33, 200}, {700, 199}, 6, 2, 128, 7, DType::kBF16, MaskMode::kCausal, true, seed++));
  shapes.push_back(
      shape({64, 17}, {64, 2000}, 5, 5, 64, 256, DType::kF16, MaskMode::kNone, true, seed++));
  shapes.push_back(
      shape({2048}, {9000}, 32, 8, 128, 16, DType::kBF16, MaskMode::kCausal, true, seed++));
  // The needle model's heads (head_dim 64, the 192-row tiles on sm_90) over a chunk continuing a
  // long context, pages of 64 tokens.
  shapes.push_back(
      shape({1500}, {12000}, 16, 4, 64, 64, DType::kBF16, MaskMode::kCausal, true, seed++));
  for (int d : {64, 128}) {  // consecutive pages (kv_contiguous)
    PagedCaseShape c =
        shape({300, 1}, {2000, 900}, 8, 2, d, 16, DType::kBF16, MaskMode::kCausal, true, seed++);
    c.contiguous_pages = true;
    shapes.push_back(c);
  }
  PagedCaseShape sp =
      shape({130, 1000}, {300, 4000}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, seed++);
  sp.sparse_keep = 0.3;
  sp.sparse_per_head = true;
  shapes.push_back(sp);
  PagedCaseShape sp64 =
      shape({700}, {3000}, 8, 2, 64, 16, DType::kF16, MaskMode::kCausal, true, seed++);
  sp64.sparse_keep = 0.4;  // one mask for every head
  shapes.push_back(sp64);
  PagedCaseShape win =
      shape({300, 50}, {3000, 700}, 8, 2, 64, 16, DType::kBF16, MaskMode::kCausal, true, seed++);
  win.window = 200;
  shapes.push_back(win);
  PagedCaseShape win128 =
      shape({200}, {2500}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, seed++);
  win128.window = 333;
  shapes.push_back(win128);
  return shapes;
}

TEST(PrefillFp8Harness, DenseSparseAndWindowed) {
  std::vector<std::unique_ptr<OpCase>> cases;
  for (const PagedCaseShape& s : fp8_shapes()) {
    cases.push_back(PrefillCase::fp8(s));
    cases.push_back(PrefillCase::fp8(s, false, in_kernel_tuning()));
    cases.push_back(PrefillCase::fp8(s, false, fa2_tuning()));
  }
  expect_no_failures(run_cases(cases), int(cases.size()));
}

// The Hopper kernel's in-kernel FP8 variants beyond the default choices (fp8_stage_mib 0): the
// full tiling without a block mask (PrefillLean::kFull), the lean one with 3 code slots
// (PrefillLean::kLean3, the ring kept for measurement; the default lean tiling has 2), head_dim
// 64 in 128-row tiles, and stream-K splits forced everywhere (pieces of items whose partial
// states are merged), in-kernel and staged. Where the Hopper kernel does not run, these run the
// mma.sync kernel (same expectations).
TEST(PrefillFp8Harness, Sm90Variants) {
  if (!kernels::cuda::paged_prefill_sm90_path(128))
    std::printf("[ note ] no sm_90 here: the variants run the mma.sync kernel\n");
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 7000;
  const std::vector<PagedCaseShape> shapes = {
      shape({1000, 129}, {1517, 129}, 16, 4, 128, 16, DType::kBF16, MaskMode::kCausal, true,
            seed++),
      shape({700}, {5000}, 16, 2, 64, 128, DType::kF16, MaskMode::kCausal, true, seed++),
      shape({1, 300, 64}, {4000, 300, 64}, 8, 8, 64, 1, DType::kBF16, MaskMode::kNone, true,
            seed++),
      shape({2048}, {2048}, 32, 8, 128, 64, DType::kBF16, MaskMode::kCausal, false, seed++),
  };
  for (const PagedCaseShape& s : shapes) {
    kernels::PrefillTuning full = in_kernel_tuning();
    full.lean = kernels::PrefillLean::kFull;
    cases.push_back(PrefillCase::fp8(s, false, full));
    kernels::PrefillTuning slots3 = in_kernel_tuning();
    slots3.lean = kernels::PrefillLean::kLean3;
    cases.push_back(PrefillCase::fp8(s, false, slots3));
    kernels::PrefillTuning rows128 = in_kernel_tuning();
    rows128.head_dim64_rows = 128;
    if (s.head_dim == 64) cases.push_back(PrefillCase::fp8(s, false, rows128));
    kernels::PrefillTuning split = in_kernel_tuning();
    split.split = kernels::PrefillSplitMode::kAlways;
    cases.push_back(PrefillCase::fp8(s, false, split));
    kernels::PrefillTuning staged_split;
    staged_split.split = kernels::PrefillSplitMode::kAlways;
    cases.push_back(PrefillCase::fp8(s, false, staged_split));
  }
  expect_no_failures(run_cases(cases), int(cases.size()));
}

// Extreme page scales: K pages scaled by 2^-20 (their keys score ~0) or 2^3, V pages by 2^-16
// (tiny values, still normal in bf16), and NaN codes in K and V slots past a request's kv_len
// (its last page's unused rows): the kernels zero-fill those rows, so the output stays finite and
// matches the reference, which reads the same codes.
TEST(PrefillFp8Harness, ExtremeScalesAndUnseenNanCodes) {
  for (const int reader : {0, 1, 2}) {
    SCOPED_TRACE(::testing::Message() << (reader == 0   ? "staged"
                                          : reader == 1 ? "in-kernel"
                                                        : "mma.sync"));
    auto c = PrefillCase::fp8(
        shape({200, 37}, {1000, 37}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, 77),
        false,
        reader == 0   ? kernels::PrefillTuning{}
        : reader == 1 ? in_kernel_tuning()
                      : fa2_tuning());
    c->edit_fp8_pages([](Fp8Pages& pages, const PagedCase& h) {
      const int hk = h.shape.num_kv_heads;
      for (size_t i = 0; i < pages.k_scale.size(); ++i) {
        if (i % 5 == 1) pages.k_scale[i] *= 0x1p-20f;
        if (i % 5 == 3) pages.k_scale[i] *= 0x1p3f;
        if (i % 7 == 2) pages.v_scale[i] *= 0x1p-16f;
      }
      // The last page of request 1 holds 37 % 16 = 5 valid keys: NaN codes in slot 9 of its
      // head 1, which no query sees.
      const int32_t page = h.kv_indices[h.kv_indptr[2] - 1];
      const int64_t slot = int64_t(page) * h.shape.page_size + 9;
      pages.k[(slot * hk + 1) * h.shape.head_dim + 3] = 0x7f;
      pages.v[(slot * hk + 1) * h.shape.head_dim + 5] = 0xff;
    });
    std::vector<std::unique_ptr<OpCase>> cases;
    cases.push_back(std::move(c));
    expect_no_failures(run_cases(cases), 1);
  }
}

TEST(PrefillFp8Harness, CudaGraphReplayMatchesDirectLaunch) {
  for (int d : {128, 64}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << d);
    auto c = PrefillCase::fp8(
        shape({100, 300}, {700, 300}, 8, 2, d, 16, DType::kBF16, MaskMode::kCausal));
    expect_graph_replay_matches_direct_launch(*c);
  }
}

// On sm_90 the default tuning reads an FP8 cache with the Hopper kernel, as it reads a 16-bit
// one (the plan has its tiles and may split), staged; the mma.sync kernel remains for other GPUs.
TEST(PrefillFp8Harness, DefaultTuningTakesTheHopperKernel) {
  if (!kernels::cuda::paged_prefill_sm90_path(128)) GTEST_SKIP() << "not an sm_90 device";
  auto c = PrefillCase::fp8(shape({100}, {700}, 8, 2, 64, 16, DType::kBF16, MaskMode::kCausal));
  c->prepare(nullptr);
  EXPECT_TRUE(c->staged());
  EXPECT_EQ(c->plan().tile_rows, kernels::cuda::kPrefillMaxTileRows);
  c->launch(nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
}

// Timing only (LONGCTX_PERF=1): causal prefills of Llama-3.1-8B heads (32 / 8 x 128) and the
// needle model's (head_dim 64) at 32K, 16-bit pages on the default kernel against FP8 pages
// staged (the conversion timed with the kernel), converted in the Hopper kernel and in the
// mma.sync one, pages of 16 and 128, same process.
TEST(PrefillFp8Harness, Perf) {
  if (!perf_mode()) GTEST_SKIP() << "set LONGCTX_PERF=1";
  std::vector<std::unique_ptr<OpCase>> cases;
  for (int d : {128, 64}) {
    for (int page : {16, 128}) {
      const PagedCaseShape s =
          shape({32768}, {32768}, 32, 8, d, page, DType::kBF16, MaskMode::kCausal, false);
      cases.push_back(std::make_unique<PrefillCase>(s, true));
      cases.push_back(PrefillCase::fp8(s, true));
      cases.push_back(PrefillCase::fp8(s, true, in_kernel_tuning()));
      if (page == 16) cases.push_back(PrefillCase::fp8(s, true, fa2_tuning()));
    }
  }
  expect_no_failures(run_cases(cases), int(cases.size()));
}

// Timing only (LONGCTX_PERF=1): a speculative verify step (batch 1, K + 1 = 9 queries over 131K
// keys, 32 / 8 heads of 128, bf16) on the paged prefill, the kernel such steps took before the
// split-KV decode served them; DecodeVerifyGpu.PerfVerifyStep times the decode path. Run both in
// one process: --gtest_filter='*PerfVerifyStep*'.
TEST(PrefillGpu, PerfVerifyStep) {
  if (!perf_mode()) GTEST_SKIP() << "set LONGCTX_PERF=1";
  std::vector<std::unique_ptr<OpCase>> cases;
  for (int page : {16, 128})
    cases.push_back(std::make_unique<PrefillCase>(
        shape({9}, {131072}, 32, 8, 128, page, DType::kBF16, MaskMode::kCausal, true, 7), true));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

}  // namespace
}  // namespace longctx::gpu_test
