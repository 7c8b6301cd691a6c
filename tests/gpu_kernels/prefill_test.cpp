// CUDA paged prefill (dense and block-sparse) against the CPU reference, through the op-test
// harness (harness.h). Tolerances (unit-variance q/k/v, sm_scale = 1/sqrt(head_dim)):
//   output max-abs <= 2e-2 (bf16) / 4e-3 (f16): the kernel rounds P to the input dtype before
//     P.V and the output once; the reference rounds only the output;
//   lse max-abs <= 1e-3 (fp32 online softmax with ex2.approx vs exp in fp32);
//   rows that see no key: o == 0 and lse == -inf exactly.
// Big cases (q_len * kv_len * heads * head_dim above kFullCheckBudget) compare a sampled subset
// of query tokens (segment edges, 128-block boundaries, and an even stride) against the
// reference; the NaN/Inf and guard checks still cover the whole output.
#include "kernels/cuda/prefill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/paged_case.h"

namespace longctx::gpu_test {
namespace {

using kernels::MaskMode;
using testing::PagedCase;
using testing::PagedCaseShape;

constexpr double kOutTolBf16 = 2e-2;
constexpr double kOutTolF16 = 4e-3;
constexpr double kLseTol = 1e-3;
constexpr double kFullCheckBudget = 3e8;  // q*kv*heads*head_dim MACs checked in full
constexpr int kSampledTokensPerRequest = 48;

class PrefillCase : public OpCase {
 public:
  explicit PrefillCase(PagedCaseShape s, bool perf_only = false)
      : s_(std::move(s)), perf_only_(perf_only) {}

  std::string name() const override {
    std::ostringstream os;
    auto list = [&](const std::vector<int32_t>& v) {
      os << "[";
      for (size_t i = 0; i < v.size() && i < 6; ++i) os << (i ? "," : "") << v[i];
      if (v.size() > 6) os << ",...";
      os << "]";
    };
    os << "prefill(q=";
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
    return kernels::cuda::paged_prefill_supported(p);
  }

  bool perf_only() const override { return perf_only_; }

  void prepare(cudaStream_t stream) override {
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
    // Outputs pre-filled with 0xFF bytes (NaN in bf16, f16 and f32).
    d_o_ = GuardedBuffer(h.q.size() * 2, 0xFF);
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
    const int group = s_.num_qo_heads / s_.num_kv_heads;
    d_ws_ = GuardedBuffer(
        kernels::cuda::paged_prefill_workspace_bytes(int(s_.q_lens.size()), h.total_q, group), 0);
    plan_ = kernels::cuda::paged_prefill_plan(
        h.qo_indptr.data(), s_.kv_lens.data(), int(s_.q_lens.size()), s_.num_qo_heads,
        s_.num_kv_heads, s_.head_dim, s_.mask_mode, d_ws_.data(), d_ws_.bytes(), stream);
  }

  void launch(cudaStream_t stream) override {
    kernels::cuda::paged_prefill_run(params_, plan_, stream);
  }

  CaseResult check() override {
    const PagedCase& h = *host_;
    CaseResult r;
    const std::vector<uint16_t> o = d_o_.download<uint16_t>();
    std::vector<float> lse = d_lse_.download<float>();
    lse.resize(h.total_q * s_.num_qo_heads);

    // Reference over all tokens or a sample.
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
    if (s_.with_lse) {
      const LseCompare cl = compare_lse_rows(lse, lse_ref, s_.num_qo_heads, rows);
      r.max_abs_lse = cl.max_abs;
      if (cl.bad) ok = false, why << cl.bad << " bad lse (nan/inf mismatch); ";
      if (cl.max_abs > kLseTol) ok = false, why << "lse max-abs " << cl.max_abs << "; ";
    }
    if (!d_o_.guards_intact()) ok = false, why << "output guard bytes overwritten; ";
    if (!d_lse_.guards_intact()) ok = false, why << "lse guard bytes overwritten; ";
    if (!d_ws_.guards_intact()) ok = false, why << "workspace guard bytes overwritten; ";
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }

  // 4 * head_dim FLOPs (QK and PV multiply-adds) per visible (query, key, q head) triple;
  // causal counts only the visible half. Block-sparse scales by the kept fraction of blocks.
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

  const kernels::PagedPrefillParams& params() const { return params_; }
  const GuardedBuffer& out() const { return d_o_; }

 private:
  // Empty = all tokens. Otherwise segment edges, block boundaries and an even stride.
  std::vector<int32_t> tokens_to_check() const {
    double macs = 0;
    for (size_t b = 0; b < s_.q_lens.size(); ++b)
      macs += double(s_.q_lens[b]) * s_.kv_lens[b] * s_.num_qo_heads * s_.head_dim;
    if (macs <= kFullCheckBudget) return {};
    std::set<int32_t> picked;
    for (size_t b = 0; b < s_.q_lens.size(); ++b) {
      const int32_t q0 = host_->qo_indptr[b], n = s_.q_lens[b];
      if (n == 0) continue;
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
      d_mask_indptr_, d_ws_;
  kernels::PagedPrefillParams params_;
  kernels::cuda::PrefillPlan plan_;
};

PagedCaseShape shape(std::vector<int32_t> q, std::vector<int32_t> kv, int hq, int hk, int d,
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

void expect_no_failures(const RunSummary& s, int min_ok) {
  EXPECT_EQ(s.failed, 0);
  EXPECT_GE(s.ok, min_ok);  // the suite must actually have run cases
}

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
  }
  expect_no_failures(run_cases(cases), 10);
}

TEST(PrefillHarness, UnsupportedShapesAreReportedNotFailed) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<PrefillCase>(
      shape({7}, {20}, 4, 1, 96, 16, DType::kBF16, MaskMode::kCausal)));
  cases.push_back(
      std::make_unique<PrefillCase>(shape({7}, {20}, 4, 1, 256, 16, DType::kF16, MaskMode::kNone)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.unsupported, 2);
  EXPECT_EQ(s.failed, 0);
}

// A reduced set for compute-sanitizer (memcheck, racecheck).
TEST(PrefillHarness, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<PrefillCase>(
      shape({7, 129}, {50, 300}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, 1)));
  cases.push_back(std::make_unique<PrefillCase>(
      shape({3, 70}, {5, 70}, 3, 1, 64, 1, DType::kF16, MaskMode::kNone, true, 2)));
  PagedCaseShape s = shape({130}, {300}, 4, 2, 128, 16, DType::kBF16, MaskMode::kCausal, true, 3);
  s.sparse_keep = 0.4;
  s.sparse_per_head = true;
  cases.push_back(std::make_unique<PrefillCase>(s));
  expect_no_failures(run_cases(cases), 3);
}

// Each kernel path forced through LONGCTX_PREFILL_KERNEL (the mma.sync kernel, and the sm_90a
// wgmma kernel where the device has it; elsewhere "sm90" falls back to mma.sync), on a mix of
// page sizes (1 = the block-causal layout), GQA ratios, masks, dtypes and block-sparse rows.
// The other tests use the default dispatch.
TEST(PrefillHarness, EachKernelPath) {
  const char* saved = std::getenv("LONGCTX_PREFILL_KERNEL");
  const std::string restore = saved ? saved : "";
  for (const char* path : {"fa2", "sm90"}) {
    setenv("LONGCTX_PREFILL_KERNEL", path, 1);
    std::printf("LONGCTX_PREFILL_KERNEL=%s\n", path);
    std::vector<std::unique_ptr<OpCase>> cases;
    uint64_t seed = 5000;
    for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
      for (DType dt : {DType::kBF16, DType::kF16}) {
        cases.push_back(
            std::make_unique<PrefillCase>(shape({1, 7, 0, 300, 129, 5}, {1, 3, 10, 1000, 5000, 0},
                                                8, 2, 128, 16, dt, mode, true, seed++)));
        cases.push_back(std::make_unique<PrefillCase>(
            shape({64, 200, 1000}, {64, 700, 1517}, 32, 8, 128, 1, dt, mode, true, seed++)));
      }
      cases.push_back(std::make_unique<PrefillCase>(
          shape({33, 200}, {700, 199}, 6, 2, 128, 7, DType::kBF16, mode, true, seed++)));
      cases.push_back(std::make_unique<PrefillCase>(
          shape({129}, {40000}, 4, 4, 128, 256, DType::kBF16, mode, true, seed++)));
      PagedCaseShape s =
          shape({130, 1000}, {300, 4000}, 8, 2, 128, 16, DType::kBF16, mode, true, seed++);
      s.sparse_keep = 0.3;
      s.sparse_per_head = true;
      cases.push_back(std::make_unique<PrefillCase>(s));
    }
    expect_no_failures(run_cases(cases), 14);
  }
  if (saved)
    setenv("LONGCTX_PREFILL_KERNEL", restore.c_str(), 1);
  else
    unsetenv("LONGCTX_PREFILL_KERNEL");
}

// run() must be capturable in a CUDA graph and replay to the same bits.
TEST(PrefillHarness, CudaGraphReplayMatchesDirectLaunch) {
  PrefillCase c(shape({100, 300}, {700, 300}, 8, 2, 128, 16, DType::kBF16, MaskMode::kCausal));
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c.prepare(stream);
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<uint16_t> direct = c.out().download<uint16_t>();
  LONGCTX_CUDA_CHECK(cudaMemset(c.out().data(), 0, c.out().bytes()));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(c.out().download<uint16_t>(), direct);
  EXPECT_EQ(c.check().status, Status::kOk);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Perf mode only (LONGCTX_PERF=1): the timing points, 32 q / 8 kv heads, head_dim 128.
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
  cases.push_back(std::make_unique<PrefillCase>(
      shape({8192}, {8192}, 32, 8, 64, 16, bf, MaskMode::kCausal, false), true));
  PagedCaseShape sp = shape({32768}, {32768}, 32, 8, 128, 128, bf, MaskMode::kCausal, true);
  sp.sparse_keep = 0.25;
  cases.push_back(std::make_unique<PrefillCase>(sp, true));
  expect_no_failures(run_cases(cases), 6);
}

}  // namespace
}  // namespace longctx::gpu_test
