// CUDA generic paged attention (kernels/cuda/paged_generic.h) against the CPU reference
// paged_prefill_ref, through the op-test harness, over head_dim 8..256, page sizes 1..256, GQA
// ratios 1..12, both masks, bf16/f16, mixed batches with q_len 1 (decode), empty segments,
// requests without KV, causal rows that see no key, and block-sparse masks. Tolerances
// (unit-variance q/k/v, sm_scale = 1/sqrt(head_dim)), the decode kernel's (this kernel keeps P in
// fp32 like it and rounds the output once, like the reference):
//   output max-abs <= 1e-2 (bf16) / 2e-3 (f16); lse max-abs <= 1e-3;
//   rows that see no key: o == 0 and lse == -inf exactly (the -inf part by compare_lse_rows).
// Big cases compare a sample of query tokens (segment edges, 128-block boundaries, an even
// stride); the NaN/Inf and guard checks always cover the whole output.
#include "kernels/cuda/paged_generic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/paged_case.h"
#include "longctx/core/error.h"

namespace longctx::gpu_test {
namespace {

using kernels::MaskMode;
using testing::PagedCase;
using testing::PagedCaseShape;

constexpr double kOutTolBf16 = 1e-2;
constexpr double kOutTolF16 = 2e-3;
constexpr double kLseTol = 1e-3;
constexpr double kFullCheckBudget = 3e8;  // q*kv*heads*head_dim MACs checked in full
constexpr int kSampledTokensPerRequest = 48;

class GenericCase : public OpCase {
 public:
  explicit GenericCase(PagedCaseShape s, bool perf_only = false)
      : s_(std::move(s)), perf_only_(perf_only) {}

  std::string name() const override {
    std::ostringstream os;
    auto list = [&](const std::vector<int32_t>& v) {
      os << "[";
      for (size_t i = 0; i < v.size() && i < 7; ++i) os << (i ? "," : "") << v[i];
      if (v.size() > 7) os << ",...";
      os << "]";
    };
    os << "generic(q=";
    list(s_.q_lens);
    os << " kv=";
    list(s_.kv_lens);
    os << " h=" << s_.num_qo_heads << "/" << s_.num_kv_heads << " d=" << s_.head_dim
       << " page=" << s_.page_size << " " << dtype_name(s_.dtype)
       << (s_.mask_mode == MaskMode::kCausal ? " causal" : " full") << (s_.with_lse ? " lse" : "");
    if (s_.sparse_keep > 0)
      os << " sparse=" << s_.sparse_keep << (s_.sparse_per_head ? "/head" : "");
    os << ")";
    return os.str();
  }

  bool supported() const override {
    kernels::PagedPrefillParams p;
    s_.set_head_fields(p);
    p.mask_mode = s_.mask_mode;
    return kernels::cuda::paged_generic_supported(p);
  }
  bool perf_only() const override { return perf_only_; }

  void prepare(cudaStream_t) override {
    host_ = std::make_unique<PagedCase>(s_);
    const PagedCase& h = *host_;
    d_q_ = upload_vector(h.q);
    d_k_ = upload_vector(h.k_cache);
    d_v_ = upload_vector(h.v_cache);
    d_qo_ = upload_vector(h.qo_indptr);
    d_kvp_ = upload_vector(h.kv_indptr);
    d_kvi_ = upload_vector(h.kv_indices);
    d_last_ = upload_vector(h.kv_last_page_len);
    d_mask_ = upload_vector(h.block_mask);
    d_mask_indptr_ = upload_vector(h.block_mask_indptr);
    // Outputs pre-filled with 0xFF bytes (NaN in bf16, f16 and f32): every row must be written.
    d_o_ = GuardedBuffer(std::max<size_t>(h.q.size() * 2, 2), 0xFF);
    d_lse_ = GuardedBuffer(std::max<size_t>(h.total_q * s_.num_qo_heads * 4, 4), 0xFF);
    params_ = h.params(d_o_.data(), static_cast<float*>(d_lse_.data()));
    params_.q = d_q_.data();
    params_.k_cache = d_k_.data();
    params_.v_cache = d_v_.data();
    params_.qo_indptr = static_cast<const int32_t*>(d_qo_.data());
    params_.kv_indptr = static_cast<const int32_t*>(d_kvp_.data());
    params_.kv_indices = static_cast<const int32_t*>(d_kvi_.data());
    params_.kv_last_page_len = static_cast<const int32_t*>(d_last_.data());
    if (!h.block_mask.empty()) {
      params_.block_mask = static_cast<const uint8_t*>(d_mask_.data());
      params_.block_mask_indptr = static_cast<const int64_t*>(d_mask_indptr_.data());
    }
  }

  void launch(cudaStream_t stream) override {
    kernels::cuda::paged_generic_run(params_, int(host_->total_q), stream);
  }

  void reset_outputs() {
    LONGCTX_CUDA_CHECK(cudaMemset(d_o_.data(), 0xFF, d_o_.bytes()));
    LONGCTX_CUDA_CHECK(cudaMemset(d_lse_.data(), 0xFF, d_lse_.bytes()));
  }

  CaseResult check() override {
    const PagedCase& h = *host_;
    CaseResult r;
    std::vector<uint16_t> o = d_o_.download<uint16_t>();
    o.resize(h.q.size());
    std::vector<float> lse = d_lse_.download<float>();
    lse.resize(h.total_q * s_.num_qo_heads);

    const std::vector<int32_t> tokens = tokens_to_check();
    std::vector<uint16_t> o_ref(h.q.size(), 0);
    std::vector<float> lse_ref(lse.size(), 0.f);
    kernels::cpu::paged_prefill_ref(h.params(o_ref.data(), lse_ref.data()),
                                    tokens.empty() ? nullptr : tokens.data(),
                                    int64_t(tokens.size()));
    const std::vector<int64_t> rows(tokens.begin(), tokens.end());
    const int64_t row_elems = int64_t(s_.num_qo_heads) * s_.head_dim;
    const HalfCompare co = compare_half_rows(o, o_ref, s_.dtype, row_elems, rows);
    r.max_abs_out = co.max_abs;
    const double tol = s_.dtype == DType::kBF16 ? kOutTolBf16 : kOutTolF16;
    std::ostringstream why;
    if (!tokens.empty()) why << "[sampled " << tokens.size() << " of " << h.total_q << " tokens] ";
    bool ok = true;
    if (co.non_finite) ok = false, why << co.non_finite << " non-finite outputs; ";
    if (co.max_abs > tol) ok = false, why << "out max-abs " << co.max_abs << " > " << tol << "; ";
    // Rows that see no key must be exactly zero (+0 or -0), not merely within tolerance.
    int64_t nonzero_empty = 0;
    for (int64_t t = 0; t < h.total_q; ++t) {
      if (!row_sees_nothing(t)) continue;
      for (int64_t e = t * row_elems; e < (t + 1) * row_elems; ++e)
        nonzero_empty += o[e] != 0 && o[e] != 0x8000;
    }
    if (nonzero_empty) ok = false, why << nonzero_empty << " nonzero outputs of keyless rows; ";
    if (s_.with_lse) {
      const LseCompare cl = compare_lse_rows(lse, lse_ref, s_.num_qo_heads, rows);
      r.max_abs_lse = cl.max_abs;
      if (cl.bad) ok = false, why << cl.bad << " bad lse (nan/inf mismatch); ";
      if (cl.max_abs > kLseTol) ok = false, why << "lse max-abs " << cl.max_abs << "; ";
    } else {
      // lse == nullptr: the buffer must keep its NaN fill.
      const std::vector<uint32_t> bits = d_lse_.download<uint32_t>();
      if (std::any_of(bits.begin(), bits.end(), [](uint32_t b) { return b != 0xFFFFFFFFu; }))
        ok = false, why << "lse written although params.lse == nullptr; ";
    }
    if (!d_o_.guards_intact()) ok = false, why << "output guard bytes overwritten; ";
    if (!d_lse_.guards_intact()) ok = false, why << "lse guard bytes overwritten; ";
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }

  // 4 * head_dim FLOPs per visible (query, key, q head); causal counts only the visible part,
  // block-sparse scales by the kept fraction of blocks.
  double flops() const override {
    double pairs = 0;
    for (size_t b = 0; b < s_.q_lens.size(); ++b) {
      const double q = s_.q_lens[b], kv = s_.kv_lens[b];
      if (s_.mask_mode == MaskMode::kNone) {
        pairs += q * kv;
      } else {
        for (int64_t i = 0; i < s_.q_lens[b]; ++i)
          pairs += std::clamp<double>(kv - q + double(i) + 1, 0, kv);
      }
    }
    double keep = 1.0;
    if (host_ && !host_->block_mask.empty()) {
      keep = double(std::count_if(host_->block_mask.begin(), host_->block_mask.end(),
                                  [](uint8_t m) { return m != 0; })) /
             double(host_->block_mask.size());
    }
    return 4.0 * s_.head_dim * s_.num_qo_heads * pairs * keep;
  }

  const GuardedBuffer& out() const { return d_o_; }

 private:
  // Token t sees no key: its request has no KV, or causal with kv_len - q_len + i < 0.
  bool row_sees_nothing(int64_t t) const {
    const PagedCase& h = *host_;
    size_t b = 0;
    while (h.qo_indptr[b + 1] <= t) ++b;
    const int64_t i = t - h.qo_indptr[b];
    const int64_t kv = s_.kv_lens[b], q = s_.q_lens[b];
    return kv == 0 || (s_.mask_mode == MaskMode::kCausal && kv - q + i < 0);
  }

  // Empty = all tokens. Otherwise segment edges, block boundaries and an even stride.
  std::vector<int32_t> tokens_to_check() const {
    double macs = 0;
    for (size_t b = 0; b < s_.q_lens.size(); ++b)
      macs += double(s_.q_lens[b]) * s_.kv_lens[b] * s_.num_qo_heads * s_.head_dim;
    if (macs <= kFullCheckBudget) return {};
    std::set<int32_t> picked;
    for (size_t b = 0; b < s_.q_lens.size(); ++b) {
      const int32_t q0 = host_->qo_indptr[b], n = s_.q_lens[b];
      for (int32_t i :
           {0, 1, 2, 63, 64, 127, 128, 129, n / 2, n - 129, n - 128, n - 3, n - 2, n - 1})
        if (i >= 0 && i < n) picked.insert(q0 + i);
      const int32_t stride = std::max(1, n / kSampledTokensPerRequest);
      for (int32_t i = stride / 2; i < n; i += stride) picked.insert(q0 + i);
    }
    return {picked.begin(), picked.end()};
  }

  PagedCaseShape s_;
  bool perf_only_;
  std::unique_ptr<PagedCase> host_;
  GuardedBuffer d_q_, d_k_, d_v_, d_o_, d_lse_, d_qo_, d_kvp_, d_kvi_, d_last_, d_mask_,
      d_mask_indptr_;
  kernels::PagedPrefillParams params_;
};

PagedCaseShape gshape(std::vector<int32_t> q, std::vector<int32_t> kv, int hq, int hk, int d,
                      int page, DType dt, MaskMode mode, bool lse = true, uint64_t seed = 1) {
  PagedCaseShape s;
  s.q_lens = std::move(q);
  s.kv_lens = std::move(kv);
  s.num_qo_heads = hq;
  s.num_kv_heads = hk;
  s.head_dim = d;
  s.page_size = page;
  s.dtype = dt;
  s.mask_mode = mode;
  s.with_lse = lse;
  s.seed = seed;
  return s;
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
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c.prepare(stream);
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<uint16_t> direct = c.out().download<uint16_t>();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  c.reset_outputs();  // NaN bytes again: the replay must write every row
  LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(c.out().download<uint16_t>(), direct);
  const CaseResult r = c.check();
  EXPECT_EQ(r.status, Status::kOk) << r.detail;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
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

}  // namespace
}  // namespace longctx::gpu_test
