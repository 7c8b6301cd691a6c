// The op-test case shared by the CUDA kernels that take PagedPrefillParams (paged prefill,
// generic paged attention): device copies of a host PagedCase (tests/kernels/paged_case.h),
// outputs pre-filled with NaN bytes inside guard bytes, the comparison against the CPU reference
// paged_prefill_ref and flops(). Each kernel's case only adds what differs: supported(),
// prepare() (upload_inputs() and any plan), launch(), its tolerances and extra checks.
//
// Big cases (q_len * kv_len * heads * head_dim above kFullCheckBudget) compare a sample of query
// tokens (segment edges, 128-block boundaries, an even stride) against the reference; the
// NaN/Inf and guard checks always cover the whole output.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_kernels/fp8_pages.h"
#include "gpu_kernels/harness.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/paged_case.h"

namespace longctx::gpu_test {

constexpr double kLseTol = 1e-3;
constexpr double kFullCheckBudget = 3e8;  // q*kv*heads*head_dim MACs checked in full
constexpr int kSampledTokensPerRequest = 48;

inline testing::PagedCaseShape paged_shape(std::vector<int32_t> q, std::vector<int32_t> kv, int hq,
                                           int hk, int d, int page, DType dt,
                                           kernels::MaskMode mode, bool lse = true,
                                           uint64_t seed = 1) {
  testing::PagedCaseShape s;
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

class PagedPrefillCase : public OpCase {
 public:
  // label: the kernel's name in name(), which lists at most list_cap of the q / kv lengths.
  // out_tol_bf16 / out_tol_f16: output max-abs tolerances (the lse one is kLseTol).
  PagedPrefillCase(testing::PagedCaseShape s, bool perf_only, std::string label, size_t list_cap,
                   double out_tol_bf16, double out_tol_f16)
      : s_(std::move(s)),
        perf_only_(perf_only),
        label_(std::move(label)),
        list_cap_(list_cap),
        out_tol_bf16_(out_tol_bf16),
        out_tol_f16_(out_tol_f16) {}

  std::string name() const override {
    std::ostringstream os;
    auto list = [&](const std::vector<int32_t>& v) {
      os << "[";
      for (size_t i = 0; i < v.size() && i < list_cap_; ++i) os << (i ? "," : "") << v[i];
      if (v.size() > list_cap_) os << ",...";
      os << "]";
    };
    os << label_ << "(q=";
    list(s_.q_lens);
    os << " kv=";
    list(s_.kv_lens);
    os << " h=" << s_.num_qo_heads << "/" << s_.num_kv_heads << " d=" << s_.head_dim
       << " page=" << s_.page_size << " " << dtype_name(s_.dtype)
       << (s_.mask_mode == kernels::MaskMode::kCausal ? " causal" : " full")
       << (s_.with_lse ? " lse" : "");
    if (s_.window > 0) os << " window=" << s_.window;
    if (s_.sparse_keep > 0)
      os << " sparse=" << s_.sparse_keep << (s_.sparse_per_head ? "/head" : "")
         << (s_.sparse_same_in_group ? "/group" : "");
    if (s_.contiguous_pages) os << " contiguous";
    os << ")";
    return os.str();
  }

  bool perf_only() const override { return perf_only_; }

  // The caches become FP8 pages (fp8_pages.h), read by the kernel and the reference alike; the
  // output tolerances double (V rows up to 2x larger).
  void use_fp8() { fp8_ = true; }
  // With use_fp8(): `edit` changes the codes or scales after encoding (before the upload), for
  // values the KV store would not write; the reference reads the edited pages too.
  void edit_fp8_pages(std::function<void(Fp8Pages&, const testing::PagedCase&)> edit) {
    edit_fp8_ = std::move(edit);
  }

  CaseResult check() override {
    const testing::PagedCase& h = *host_;
    CaseResult r;
    std::vector<uint16_t> o = d_o_.download<uint16_t>();
    o.resize(h.q.size());
    std::vector<float> lse = d_lse_.download<float>();
    lse.resize(h.total_q * s_.num_qo_heads);

    // Reference over all tokens or a sample.
    const std::vector<int32_t> tokens = tokens_to_check();
    std::vector<uint16_t> o_ref(h.q.size(), 0);
    std::vector<float> lse_ref(lse.size(), 0.f);
    kernels::PagedPrefillParams ref = h.params(o_ref.data(), lse_ref.data());
    if (fp8_)
      set_fp8(ref, fp8_pages_.k.data(), fp8_pages_.v.data(), fp8_pages_.k_scale.data(),
              fp8_pages_.v_scale.data());
    kernels::cpu::paged_prefill_ref(ref, tokens.empty() ? nullptr : tokens.data(),
                                    int64_t(tokens.size()));
    const std::vector<int64_t> rows(tokens.begin(), tokens.end());
    const int64_t row_elems = int64_t(s_.num_qo_heads) * s_.head_dim;
    const HalfCompare co = compare_half_rows(o, o_ref, s_.dtype, row_elems, rows);
    r.max_abs_out = co.max_abs;
    const double tol = (s_.dtype == DType::kBF16 ? out_tol_bf16_ : out_tol_f16_) * (fp8_ ? 2 : 1);
    std::ostringstream why;
    if (fp8_) why << "[fp8 kv] ";
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
    check_more(o, why, ok);
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }

  // 4 * head_dim FLOPs (QK and PV multiply-adds) per visible (query, key, q head) triple; causal
  // counts only the visible part, block-sparse scales by the kept fraction of blocks.
  double flops() const override {
    double pairs = 0;
    for (size_t b = 0; b < s_.q_lens.size(); ++b) {
      const double q = s_.q_lens[b], kv = s_.kv_lens[b];
      if (s_.mask_mode == kernels::MaskMode::kNone) {
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

  // NaN bytes again (a graph replay must write every row).
  void reset_outputs() {
    LONGCTX_CUDA_CHECK(cudaMemset(d_o_.data(), 0xFF, d_o_.bytes()));
    LONGCTX_CUDA_CHECK(cudaMemset(d_lse_.data(), 0xFF, d_lse_.bytes()));
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());  // legacy stream: see GuardedBuffer
  }

 protected:
  // Builds the host case and fills the device inputs, the outputs and params_.
  void upload_inputs() {
    host_ = std::make_unique<testing::PagedCase>(s_);
    const testing::PagedCase& h = *host_;
    d_q_ = upload_vector(h.q);
    if (fp8_) {
      fp8_pages_ = make_fp8_pages(h, s_.seed);
      if (edit_fp8_) edit_fp8_(fp8_pages_, h);
      d_k_ = upload_vector(fp8_pages_.k);
      d_v_ = upload_vector(fp8_pages_.v);
      d_ks_ = upload_vector(fp8_pages_.k_scale);
      d_vs_ = upload_vector(fp8_pages_.v_scale);
    } else {
      d_k_ = upload_vector(h.k_cache);
      d_v_ = upload_vector(h.v_cache);
    }
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
    if (fp8_)
      set_fp8(params_, d_k_.data(), d_v_.data(), static_cast<const float*>(d_ks_.data()),
              static_cast<const float*>(d_vs_.data()));
    params_.qo_indptr = static_cast<const int32_t*>(d_qo_.data());
    params_.kv_indptr = static_cast<const int32_t*>(d_kvp_.data());
    params_.kv_indices = static_cast<const int32_t*>(d_kvi_.data());
    params_.kv_last_page_len = static_cast<const int32_t*>(d_last_.data());
    if (!h.block_mask.empty()) {
      params_.block_mask = static_cast<const uint8_t*>(d_mask_.data());
      params_.block_mask_indptr = static_cast<const int64_t*>(d_mask_indptr_.data());
    }
  }

  // A kernel's own checks after the shared ones; o is the whole downloaded output.
  virtual void check_more(const std::vector<uint16_t>& /*o*/, std::ostringstream& /*why*/,
                          bool& /*ok*/) const {}

  testing::PagedCaseShape s_;
  bool fp8_ = false;
  Fp8Pages fp8_pages_;
  std::function<void(Fp8Pages&, const testing::PagedCase&)> edit_fp8_;
  GuardedBuffer d_ks_, d_vs_;
  std::unique_ptr<testing::PagedCase> host_;
  GuardedBuffer d_q_, d_k_, d_v_, d_o_, d_lse_, d_qo_, d_kvp_, d_kvi_, d_last_, d_mask_,
      d_mask_indptr_;
  kernels::PagedPrefillParams params_;

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

  bool perf_only_;
  std::string label_;
  size_t list_cap_;
  double out_tol_bf16_, out_tol_f16_;
};

// run() must be capturable in a CUDA graph: a replay (outputs refilled with NaN bytes first)
// writes the same bits as a direct launch, and passes the reference check.
inline void expect_graph_replay_matches_direct_launch(PagedPrefillCase& c) {
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c.prepare(stream);
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<uint16_t> direct = c.out().download<uint16_t>();
  replay_in_graph(c, stream, [&] { c.reset_outputs(); });
  EXPECT_EQ(c.out().download<uint16_t>(), direct);
  const CaseResult r = c.check();
  EXPECT_EQ(r.status, Status::kOk) << r.detail;
  cudaStreamDestroy(stream);
}

}  // namespace longctx::gpu_test
