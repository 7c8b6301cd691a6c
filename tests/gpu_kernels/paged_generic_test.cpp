// CUDA generic paged attention (kernels/cuda/paged_generic.h) against the CPU reference
// paged_prefill_ref, through the op-test harness, over head_dim 8..256, page sizes 1..256, GQA
// ratios 1..12, both masks, bf16/f16, mixed batches with q_len 1 (decode), empty segments,
// requests without KV, causal rows that see no key, and block-sparse masks. Tolerances
// (unit-variance q/k/v, sm_scale = 1/sqrt(head_dim)), the decode kernel's (this kernel keeps P in
// fp32 like it and rounds the output once, like the reference):
//   output max-abs <= 1e-2 (bf16) / 2e-3 (f16); lse max-abs <= 1e-3;
//   rows that see no key: o == 0 and lse == -inf exactly (the -inf part by compare_lse_rows).
// Big cases compare a sample of query tokens (paged_prefill_case.h).
#include "kernels/cuda/paged_generic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "gpu_kernels/harness.h"
#include "gpu_kernels/paged_prefill_case.h"
#include "kernels/paged_case.h"
#include "longctx/core/error.h"

namespace longctx::gpu_test {
namespace {

using kernels::MaskMode;
using testing::PagedCase;
using testing::PagedCaseShape;

constexpr double kOutTolBf16 = 1e-2;
constexpr double kOutTolF16 = 2e-3;

class GenericCase : public PagedPrefillCase {
 public:
  explicit GenericCase(PagedCaseShape s, bool perf_only = false, bool fp8 = false)
      : PagedPrefillCase(std::move(s), perf_only, fp8 ? "generic fp8" : "generic", 7, kOutTolBf16,
                         kOutTolF16) {
    if (fp8) use_fp8();
  }

  bool supported() const override {
    kernels::PagedPrefillParams p;
    s_.set_head_fields(p);
    p.mask_mode = s_.mask_mode;
    return kernels::cuda::paged_generic_supported(p);
  }

  void prepare(cudaStream_t) override { upload_inputs(); }

  void launch(cudaStream_t stream) override {
    kernels::cuda::paged_generic_run(params_, int(host_->total_q), stream);
  }
  const kernels::PagedPrefillParams& params() const { return params_; }

 private:
  void check_more(const std::vector<uint16_t>& o, std::ostringstream& why,
                  bool& ok) const override {
    // Rows that see no key must be exactly zero (+0 or -0), not merely within tolerance.
    const int64_t row_elems = int64_t(s_.num_qo_heads) * s_.head_dim;
    int64_t nonzero_empty = 0;
    for (int64_t t = 0; t < host_->total_q; ++t) {
      if (!row_sees_nothing(t)) continue;
      for (int64_t e = t * row_elems; e < (t + 1) * row_elems; ++e)
        nonzero_empty += o[e] != 0 && o[e] != 0x8000;
    }
    if (nonzero_empty) ok = false, why << nonzero_empty << " nonzero outputs of keyless rows; ";
    if (!s_.with_lse) {
      // lse == nullptr: the buffer must keep its NaN fill.
      const std::vector<uint32_t> bits = d_lse_.download<uint32_t>();
      if (std::any_of(bits.begin(), bits.end(), [](uint32_t b) { return b != 0xFFFFFFFFu; }))
        ok = false, why << "lse written although params.lse == nullptr; ";
    }
  }

  // Token t sees no key: its request has no KV, or causal with kv_len - q_len + i < 0.
  bool row_sees_nothing(int64_t t) const {
    const PagedCase& h = *host_;
    size_t b = 0;
    while (h.qo_indptr[b + 1] <= t) ++b;
    const int64_t i = t - h.qo_indptr[b];
    const int64_t kv = s_.kv_lens[b], q = s_.q_lens[b];
    return kv == 0 || (s_.mask_mode == MaskMode::kCausal && kv - q + i < 0);
  }
};

PagedCaseShape gshape(std::vector<int32_t> q, std::vector<int32_t> kv, int hq, int hk, int d,
                      int page, DType dt, MaskMode mode, bool lse = true, uint64_t seed = 1) {
  return paged_shape(std::move(q), std::move(kv), hq, hk, d, page, dt, mode, lse, seed);
}

// head_dim x page size x GQA ratio x mask, each over one mixed batch: decode rows (q_len 1, one
// of them over 2000 keys), a short segment over fewer keys than queries (causal rows that see
// nothing), an empty segment, a request with no KV, 128-block boundaries. dtype and lse cycle.
TEST(PagedGenericGpu, HeadDimPageGqaGrid) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 1;
  int idx = 0;
  for (int d : {8, 16, 32, 64, 96, 128, 256})
    for (int page : {1, 16, 64})
      for (int group : {1, 2, 4})
        for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
          const DType dt = (idx % 2) ? DType::kF16 : DType::kBF16;
          cases.push_back(std::make_unique<GenericCase>(
              gshape({1, 7, 0, 40, 1, 130, 5}, {1, 3, 10, 300, 2000, 200, 0}, 2 * group, 2, d, page,
                     dt, mode, idx % 5 != 4, seed++)));
          ++idx;
        }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 7 * 3 * 3 * 2);
}

// GQA ratios that are not powers of two or above 8 (several q-head tiles per kv head, the last
// one partial), odd page sizes, page size 256, batches of q_len 1 (decode) only.
TEST(PagedGenericGpu, OddGroupsPagesAndDecode) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 500;
  const DType bf = DType::kBF16, f16 = DType::kF16;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
    cases.push_back(std::make_unique<GenericCase>(
        gshape({33, 200}, {700, 199}, 6, 2, 16, 7, bf, mode, true, seed++)));  // GQA 3
    cases.push_back(std::make_unique<GenericCase>(
        gshape({17, 64}, {2000, 64}, 10, 2, 32, 3, f16, mode, true, seed++)));  // GQA 5
    cases.push_back(std::make_unique<GenericCase>(
        gshape({5, 129}, {1000, 129}, 8, 1, 96, 256, bf, mode, true, seed++)));  // GQA 8
    cases.push_back(std::make_unique<GenericCase>(
        gshape({9, 1, 100}, {9, 3000, 77}, 12, 1, 16, 16, f16, mode, true, seed++)));  // GQA 12
    cases.push_back(std::make_unique<GenericCase>(
        gshape({3, 40}, {300, 41}, 24, 2, 256, 5, bf, mode, false, seed++)));  // GQA 12, d 256
    cases.push_back(std::make_unique<GenericCase>(
        gshape({1, 1, 1, 1, 1, 1}, {0, 1, 7, 300, 1025, 4097}, 8, 2, 16, 16, bf, mode, true,
               seed++)));  // decode batch, tiny-llama3 heads
    cases.push_back(std::make_unique<GenericCase>(
        gshape({1, 1, 1}, {40000, 5, 12000}, 4, 2, 32, 64, f16, mode, true, seed++)));
    cases.push_back(std::make_unique<GenericCase>(
        gshape({1}, {33000}, 32, 8, 128, 16, bf, mode, true, seed++)));  // Llama-8B decode
  }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 16);
}

// Longer prefills of the test models' shapes (sampled check) and of the fallback shapes.
TEST(PagedGenericGpu, LongerPrefills) {
  std::vector<std::unique_ptr<OpCase>> cases;
  const DType bf = DType::kBF16;
  const MaskMode causal = MaskMode::kCausal;
  cases.push_back(std::make_unique<GenericCase>(
      gshape({2048}, {2048}, 8, 2, 16, 16, bf, causal, true, 900)));  // tiny-llama3
  cases.push_back(std::make_unique<GenericCase>(
      gshape({1000, 300}, {1517, 4300}, 4, 2, 32, 16, bf, causal, true, 901)));  // tiny-qwen2
  cases.push_back(std::make_unique<GenericCase>(
      gshape({512}, {8192}, 4, 2, 64, 64, DType::kF16, causal, true, 902)));  // chunked prefill
  cases.push_back(std::make_unique<GenericCase>(
      gshape({700}, {700}, 16, 4, 96, 16, bf, MaskMode::kNone, true, 903)));
  cases.push_back(
      std::make_unique<GenericCase>(gshape({300}, {1300}, 8, 8, 256, 1, bf, causal, true, 904)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 5);
}

// Sliding windows: each row's keys start at its window (the loop starts there), at the small
// head dims the test models use.
TEST(PagedGenericGpu, SlidingWindow) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 300;
  for (int window : {1, 5, 33, 128, 700})
    for (int d : {16, 32, 128}) {
      PagedCaseShape s = gshape({1, 9, 140, 1}, {1, 300, 140, 900}, 4, 2, d, window % 2 ? 16 : 1,
                                DType::kBF16, MaskMode::kCausal, true, seed++);
      s.window = window;
      cases.push_back(std::make_unique<GenericCase>(s));
    }
  const RunSummary r = run_cases(cases);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.ok, 15);
}

TEST(PagedGenericGpu, BlockSparse) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 700;
  for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
    for (bool per_head : {false, true}) {
      PagedCaseShape s =
          gshape({130, 400}, {300, 1000}, 6, 2, 32, 16, DType::kBF16, mode, true, seed++);
      s.sparse_keep = 0.3;
      s.sparse_per_head = per_head;
      cases.push_back(std::make_unique<GenericCase>(s));
      PagedCaseShape t = gshape({7, 260}, {3000, 260}, 12, 1, 96, 64, DType::kF16, mode, true,
                                seed++);  // two q-head tiles: per-head rows past tile 0
      t.sparse_keep = 0.2;
      t.sparse_per_head = per_head;
      cases.push_back(std::make_unique<GenericCase>(t));
    }
  }
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 8);
}

TEST(PagedGenericGpu, UnsupportedShapesAreReportedAndRefused) {
  std::vector<std::unique_ptr<OpCase>> cases;
  for (int d : {4, 12, 264})
    cases.push_back(std::make_unique<GenericCase>(
        gshape({7}, {20}, 4, 1, d, 16, DType::kBF16, MaskMode::kCausal)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.unsupported, 3);
  EXPECT_EQ(s.failed, 0);

  // run() refuses them with a clear error instead of launching.
  GuardedBuffer buf(1 << 16, 0);
  kernels::PagedPrefillParams p;
  gshape({7}, {20}, 4, 1, 12, 16, DType::kBF16, MaskMode::kCausal).set_head_fields(p);
  p.q = p.k_cache = p.v_cache = buf.data();
  p.o = buf.data();
  const int32_t* idx = static_cast<const int32_t*>(buf.data());
  p.qo_indptr = p.kv_indptr = p.kv_indices = p.kv_last_page_len = idx;
  p.batch_size = 1;
  try {
    kernels::cuda::paged_generic_run(p, 7, nullptr);
    ADD_FAILURE() << "head_dim 12 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
  p.head_dim = 16;
  p.q = static_cast<const char*>(buf.data()) + 2;  // not 16-byte aligned
  try {
    kernels::cuda::paged_generic_run(p, 7, nullptr);
    ADD_FAILURE() << "misaligned q accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  p.q = buf.data();
  p.batch_size = 0;  // total_q 7 with no request
  EXPECT_THROW(kernels::cuda::paged_generic_run(p, 7, nullptr), Error);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
}

// run() must be capturable in a CUDA graph and replay to the same bits.
TEST(PagedGenericGpu, CudaGraphReplayMatchesDirectLaunch) {
  GenericCase c(
      gshape({100, 1, 300}, {700, 5000, 300}, 8, 2, 16, 16, DType::kBF16, MaskMode::kCausal));
  expect_graph_replay_matches_direct_launch(c);
}

// A reduced set for compute-sanitizer.
TEST(PagedGenericGpu, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<GenericCase>(
      gshape({1, 7, 0, 40, 5}, {1, 3, 10, 300, 0}, 8, 2, 16, 16, DType::kBF16, MaskMode::kCausal)));
  cases.push_back(std::make_unique<GenericCase>(
      gshape({3, 70}, {500, 70}, 12, 1, 96, 7, DType::kF16, MaskMode::kNone, true, 2)));
  cases.push_back(std::make_unique<GenericCase>(
      gshape({2, 9}, {100, 9}, 2, 2, 8, 1, DType::kBF16, MaskMode::kCausal, true, 3)));
  cases.push_back(std::make_unique<GenericCase>(
      gshape({1, 20}, {64, 200}, 4, 2, 256, 64, DType::kBF16, MaskMode::kCausal, false, 4)));
  PagedCaseShape s = gshape({130}, {300}, 4, 2, 32, 16, DType::kBF16, MaskMode::kCausal, true, 5);
  s.sparse_keep = 0.4;
  s.sparse_per_head = true;
  cases.push_back(std::make_unique<GenericCase>(s));
  const RunSummary sum = run_cases(cases);
  EXPECT_EQ(sum.failed, 0);
  EXPECT_EQ(sum.ok, 5);
}

// Perf mode only (LONGCTX_PERF=1): the test models' prefill / decode and fallback shapes.
TEST(PagedGenericGpu, Perf) {
  if (!perf_mode()) GTEST_SKIP() << "set LONGCTX_PERF=1";
  std::vector<std::unique_ptr<OpCase>> cases;
  const DType bf = DType::kBF16;
  const MaskMode causal = MaskMode::kCausal;
  cases.push_back(std::make_unique<GenericCase>(
      gshape({8192}, {8192}, 8, 2, 16, 16, bf, causal, false), true));  // tiny-llama3
  cases.push_back(std::make_unique<GenericCase>(
      gshape({8192}, {8192}, 4, 2, 32, 16, bf, causal, false), true));  // tiny-qwen2
  cases.push_back(
      std::make_unique<GenericCase>(gshape({1}, {32768}, 8, 2, 16, 16, bf, causal, true), true));
  cases.push_back(std::make_unique<GenericCase>(
      gshape({8192}, {8192}, 32, 8, 96, 16, bf, causal, false), true));  // no fast kernel
  cases.push_back(std::make_unique<GenericCase>(
      gshape({8192}, {8192}, 32, 8, 128, 16, bf, causal, false), true));  // vs paged_prefill
  cases.push_back(std::make_unique<GenericCase>(
      gshape({1}, {32768}, 32, 8, 128, 16, bf, causal, true), true));  // vs decode_run
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 6);
}

// FP8 pages (fp8_pages.h) against the CPU reference reading the same codes: head_dim 8 .. 256,
// pages 1 / 7 / 16 / 128, GQA 1 .. 12, both masks, windows, block-sparse masks, decode batches
// and long prefills (sampled), partial last pages.
TEST(PagedGenericFp8Gpu, Grid) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint64_t seed = 900;
  int idx = 0;
  for (int d : {8, 16, 64, 128, 256})
    for (int page : {1, 7, 16})
      for (int group : {1, 4})
        for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
          const DType dt = (idx % 2) ? DType::kF16 : DType::kBF16;
          cases.push_back(std::make_unique<GenericCase>(
              gshape({1, 7, 0, 40, 1, 130, 5}, {1, 3, 10, 300, 2000, 200, 0}, 2 * group, 2, d, page,
                     dt, mode, idx % 5 != 4, seed++),
              false, true));
          ++idx;
        }
  const DType bf = DType::kBF16;
  cases.push_back(std::make_unique<GenericCase>(
      gshape({33, 200}, {700, 199}, 6, 2, 16, 7, bf, MaskMode::kCausal, true, seed++), false,
      true));  // GQA 3
  cases.push_back(
      std::make_unique<GenericCase>(gshape({9, 1, 100}, {9, 3000, 77}, 12, 1, 16, 16, DType::kF16,
                                           MaskMode::kCausal, true, seed++),
                                    false, true));  // GQA 12
  cases.push_back(std::make_unique<GenericCase>(
      gshape({1}, {33000}, 32, 8, 128, 16, bf, MaskMode::kCausal, true, seed++), false, true));
  cases.push_back(std::make_unique<GenericCase>(
      gshape({2048, 1000}, {2048, 3000}, 32, 8, 128, 128, bf, MaskMode::kCausal, true, seed++),
      false, true));  // prefill chunks, sampled check
  PagedCaseShape win =
      gshape({300, 1}, {1000, 5000}, 8, 2, 64, 16, bf, MaskMode::kCausal, true, seed++);
  win.window = 100;
  cases.push_back(std::make_unique<GenericCase>(win, false, true));
  PagedCaseShape sparse =
      gshape({300, 600}, {900, 600}, 8, 2, 128, 16, bf, MaskMode::kCausal, true, seed++);
  sparse.sparse_keep = 0.4;
  sparse.sparse_per_head = true;
  cases.push_back(std::make_unique<GenericCase>(sparse, false, true));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

TEST(PagedGenericFp8Gpu, CudaGraphReplayMatchesDirectLaunch) {
  GenericCase c(
      gshape({1, 40, 1}, {300, 200, 4000}, 8, 2, 64, 16, DType::kBF16, MaskMode::kCausal, true, 77),
      false, true);
  expect_graph_replay_matches_direct_launch(c);
}

TEST(PagedGenericFp8Gpu, MissingScalesThrow) {
  GenericCase c(gshape({1}, {30}, 4, 2, 64, 16, DType::kBF16, MaskMode::kCausal, true, 5), false,
                true);
  c.prepare(nullptr);
  kernels::PagedPrefillParams p = c.params();
  p.k_scale = nullptr;
  try {
    kernels::cuda::paged_generic_run(p, 1, nullptr);
    ADD_FAILURE() << "FP8 params without k_scale accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace longctx::gpu_test
