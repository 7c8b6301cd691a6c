// The split-KV decode's op-test case (kernels/cuda/decode.h) against the CPU decode reference
// (kernels/cpu/decode_cpu.h): device copies of a host PagedCase, the plan and its pins (tuning,
// merge group, prefetch), NaN-filled outputs inside guard bytes, the tolerances of
// decode_test.cpp's header, and both merge levels' counters back at 0 after a run. Shared by the
// decode test files.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_kernels/fp8_pages.h"
#include "gpu_kernels/harness.h"
#include "gpu_kernels/paged_prefill_case.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/cuda/decode.h"
#include "kernels/paged_case.h"

namespace longctx::gpu_test {

class DecodeCase : public OpCase {
 public:
  using PagedCase = testing::PagedCase;
  using PagedCaseShape = testing::PagedCaseShape;

  // min_chunk: decode_plan's min_chunk_tokens (small values force many splits on short requests).
  // q_pad > 0: q rows sit q_pad elements (NaN) apart, as in a view of a fused QKV output.
  // nan_tail: the slots past each request's last key in its last page hold NaN in K and V (a
  // kernel that reads whole pages must keep them out of the result).
  // fp8: the caches are FP8 pages (fp8_pages.h) and the reference reads the same codes.
  DecodeCase(PagedCaseShape s, bool perf_only = false, int min_chunk = 256, int q_pad = 0,
             bool nan_tail = false, bool fp8 = false)
      : s_(std::move(s)),
        perf_only_(perf_only),
        min_chunk_(min_chunk),
        q_pad_(q_pad),
        nan_tail_(nan_tail),
        fp8_(fp8) {
    s_.q_lens.assign(s_.kv_lens.size(), 1);
  }
  std::string name() const override {
    std::ostringstream os;
    os << "decode(batch=" << s_.kv_lens.size();
    if (std::any_of(s_.q_lens.begin(), s_.q_lens.end(), [](int32_t n) { return n != 1; })) {
      os << " q=[";
      for (size_t i = 0; i < s_.q_lens.size() && i < 6; ++i) os << (i ? "," : "") << s_.q_lens[i];
      os << (s_.q_lens.size() > 6 ? ",...]" : "]")
         << (s_.mask_mode == kernels::MaskMode::kCausal ? " causal" : " full");
    }
    os << " kv=[";
    for (size_t i = 0; i < s_.kv_lens.size() && i < 6; ++i) os << (i ? "," : "") << s_.kv_lens[i];
    os << (s_.kv_lens.size() > 6 ? ",...]" : "]") << " h=" << s_.num_qo_heads << "/"
       << s_.num_kv_heads << " d=" << s_.head_dim << " page=" << s_.page_size << " "
       << dtype_name(s_.dtype) << (fp8_ ? " fp8 kv" : "")
       << (fp8_ && tuning_.fp8_kernel == kernels::DecodeFp8Kernel::kConvertTile ? " (tile)" : "")
       << (fp8_ && tuning_.fp8_kernel == kernels::DecodeFp8Kernel::kRegistersDeep ? " (deep)" : "")
       << (fp8_ && (k_scale_exp_ || v_scale_exp_)
               ? " scales x2^" + std::to_string(k_scale_exp_) + "/2^" + std::to_string(v_scale_exp_)
               : "")
       << (s_.with_lse ? " lse" : "") << (q_pad_ ? " strided q" : "")
       << (nan_tail_ ? " nan tail" : "")
       << (s_.window > 0 ? " window=" + std::to_string(s_.window) : "") << ")";
    return os.str();
  }
  bool supported() const override {
    return s_.head_dim == 64 || s_.head_dim == 128 || s_.head_dim == 256;
  }
  bool perf_only() const override { return perf_only_; }
  // Several queries per request (a verify step; DecodeParams' rules under `mask`): before
  // prepare().
  void set_queries(std::vector<int32_t> q_lens, kernels::MaskMode mask) {
    s_.q_lens = std::move(q_lens);
    s_.mask_mode = mask;
  }
  // The plan's tuning (a variant's pins); the default: the measured choices.
  void set_tuning(const kernels::DecodeTuning& tuning) { tuning_ = tuning; }
  // DecodePlan::merge_group pinned after planning (0: the plan's rule).
  void set_merge_group(int g) { merge_group_ = g; }
  // DecodePlan::prefetch_tokens pinned after planning (-1: the plan's).
  void set_prefetch_tokens(int n) { prefetch_tokens_ = n; }
  // FP8: the page scales of K and V times 2^k_exp and 2^v_exp (still powers of two; the reference
  // reads the same), e.g. to put them outside f16's range: before prepare().
  void set_fp8_scale_exponents(int k_exp, int v_exp) {
    k_scale_exp_ = k_exp;
    v_scale_exp_ = v_exp;
  }
  // The outputs of the last launch (after a sync).
  std::vector<uint16_t> output() const { return d_o_.download<uint16_t>(); }
  std::vector<float> output_lse() const { return d_lse_.download<float>(); }
  const kernels::cuda::DecodePlan& plan() const { return plan_; }
  DType dtype() const { return s_.dtype; }

  void prepare(cudaStream_t stream) override {
    host_ = std::make_unique<PagedCase>(s_);
    const PagedCase& h = *host_;
    const int64_t row = int64_t(s_.num_qo_heads) * s_.head_dim;
    if (q_pad_ > 0) {
      std::vector<uint16_t> q(h.q.size() / row * (row + q_pad_), 0xFFFF);  // NaN padding
      for (size_t b = 0; b < h.q.size() / row; ++b)
        std::copy_n(h.q.begin() + b * row, row, q.begin() + b * (row + q_pad_));
      d_q_ = upload_vector(q);
    } else {
      d_q_ = upload_vector(h.q);
    }
    if (fp8_) {
      fp8_pages_ = make_fp8_pages(h, s_.seed);
      for (float& x : fp8_pages_.k_scale) x = std::ldexp(x, k_scale_exp_);
      for (float& x : fp8_pages_.v_scale) x = std::ldexp(x, v_scale_exp_);
      if (nan_tail_) {  // NaN codes in the slots past each request's last key
        const int64_t slot = int64_t(s_.num_kv_heads) * s_.head_dim;
        for (size_t b = 0; b + 1 < h.kv_indptr.size(); ++b) {
          if (h.kv_indptr[b + 1] == h.kv_indptr[b]) continue;
          const int64_t page = h.kv_indices[h.kv_indptr[b + 1] - 1];
          for (int sl = h.kv_last_page_len[b]; sl < s_.page_size; ++sl) {
            const int64_t at = (page * s_.page_size + sl) * slot;
            std::fill_n(fp8_pages_.k.begin() + at, slot, uint8_t(0x7f));
            std::fill_n(fp8_pages_.v.begin() + at, slot, uint8_t(0xff));
          }
        }
      }
      d_k_ = upload_vector(fp8_pages_.k);
      d_v_ = upload_vector(fp8_pages_.v);
      d_ks_ = upload_vector(fp8_pages_.k_scale);
      d_vs_ = upload_vector(fp8_pages_.v_scale);
    } else if (nan_tail_) {
      std::vector<uint16_t> k = h.k_cache, v = h.v_cache;
      const int64_t slot = int64_t(s_.num_kv_heads) * s_.head_dim;
      for (size_t b = 0; b + 1 < h.kv_indptr.size(); ++b) {
        if (h.kv_indptr[b + 1] == h.kv_indptr[b]) continue;
        const int64_t page = h.kv_indices[h.kv_indptr[b + 1] - 1];
        for (int sl = h.kv_last_page_len[b]; sl < s_.page_size; ++sl) {
          const int64_t at = (page * s_.page_size + sl) * slot;
          std::fill_n(k.begin() + at, slot, uint16_t(0xFFFF));
          std::fill_n(v.begin() + at, slot, uint16_t(0xFFFF));
        }
      }
      d_k_ = upload_vector(k);
      d_v_ = upload_vector(v);
    } else {
      d_k_ = upload_vector(h.k_cache);
      d_v_ = upload_vector(h.v_cache);
    }
    d_kvp_ = upload_vector(h.kv_indptr);
    d_kvi_ = upload_vector(h.kv_indices);
    d_last_ = upload_vector(h.kv_last_page_len);
    const int batch = int(s_.kv_lens.size());
    d_o_ = GuardedBuffer(h.q.size() * 2, 0xFF);  // NaN bytes: every row must be written
    d_lse_ = GuardedBuffer(size_t(h.total_q) * s_.num_qo_heads * 4, 0xFF);
    params_ =
        h.decode_params(d_o_.data(), s_.with_lse ? static_cast<float*>(d_lse_.data()) : nullptr);
    params_.q = d_q_.data();
    params_.q_token_stride = q_pad_ > 0 ? row + q_pad_ : 0;
    params_.k_cache = d_k_.data();
    params_.v_cache = d_v_.data();
    params_.kv_indptr = static_cast<const int32_t*>(d_kvp_.data());
    params_.kv_indices = static_cast<const int32_t*>(d_kvi_.data());
    params_.kv_last_page_len = static_cast<const int32_t*>(d_last_.data());
    if (fp8_)
      set_fp8(params_, d_k_.data(), d_v_.data(), static_cast<const float*>(d_ks_.data()),
              static_cast<const float*>(d_vs_.data()));
    const int max_q = std::max(1, *std::max_element(s_.q_lens.begin(), s_.q_lens.end()));
    d_ws_ = GuardedBuffer(kernels::cuda::decode_workspace_bytes(
                              batch, s_.num_qo_heads, s_.num_kv_heads, s_.head_dim, 0, max_q),
                          0);
    const kernels::DecodeQueries queries{params_.qo_indptr, params_.causal};
    plan_ = kernels::cuda::decode_plan(
        h.kv_indptr.data(), h.kv_last_page_len.data(), batch, s_.page_size, s_.num_qo_heads,
        s_.num_kv_heads, s_.head_dim, d_ws_.data(), d_ws_.bytes(), stream, 0, min_chunk_, {},
        tuning_, s_.window,
        fp8_ ? kernels::KvCacheFormat::kFp8E4M3 : kernels::KvCacheFormat::kDtype, queries);
    plan_.merge_group = merge_group_;
    if (prefetch_tokens_ >= 0) plan_.prefetch_tokens = prefetch_tokens_;
  }
  void launch(cudaStream_t stream) override { kernels::cuda::decode_run(params_, plan_, stream); }
  void reset_outputs() {
    LONGCTX_CUDA_CHECK(cudaMemset(d_o_.data(), 0xFF, d_o_.bytes()));
    LONGCTX_CUDA_CHECK(cudaMemset(d_lse_.data(), 0xFF, d_lse_.bytes()));
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());  // legacy stream: see GuardedBuffer
  }

  CaseResult check() override {
    const PagedCase& h = *host_;
    const int batch = int(s_.kv_lens.size());
    std::vector<uint16_t> o = d_o_.download<uint16_t>();
    std::vector<float> lse = d_lse_.download<float>();
    std::vector<uint16_t> o_ref(o.size());
    std::vector<float> lse_ref(size_t(h.total_q) * s_.num_qo_heads);
    kernels::DecodeParams ref = h.decode_params(o_ref.data(), lse_ref.data());
    if (fp8_)
      set_fp8(ref, fp8_pages_.k.data(), fp8_pages_.v.data(), fp8_pages_.k_scale.data(),
              fp8_pages_.v_scale.data());
    kernels::cpu::decode_attention(ref);
    CaseResult r;
    const int64_t row = int64_t(s_.num_qo_heads) * s_.head_dim;
    HalfCompare co = compare_half_rows(o, o_ref, s_.dtype, row, {});
    r.max_abs_out = co.max_abs;
    // FP8: the kernel's 16-bit tile holds the dequantized values exactly (a code times a power of
    // two), so the error is the 16-bit path's; V rows are up to 2x larger (fp8_pages.h), so is it.
    const double tol = (s_.dtype == DType::kBF16 ? 1e-2 : 2e-3) * (fp8_ ? 2 : 1);
    std::ostringstream why;
    why << "[chunk " << plan_.chunk_tokens << ", " << plan_.num_work_items << " items, "
        << plan_.num_partials << " partials, merge group " << plan_.merge_group << "] ";
    bool ok = true;
    if (co.non_finite) ok = false, why << co.non_finite << " non-finite outputs; ";
    if (co.max_abs > tol) ok = false, why << "out max-abs " << co.max_abs << " > " << tol << "; ";
    for (int b = 0; b < batch; ++b)  // empty requests: exactly zero
      if (s_.kv_lens[b] == 0)
        for (int64_t e = h.qo_indptr[b] * row; e < h.qo_indptr[b + 1] * row; ++e)
          if (o[e] != 0 && o[e] != 0x8000) {
            ok = false, why << "empty request " << b << " not zero; ";
            break;
          }
    if (s_.with_lse) {
      LseCompare cl = compare_lse_rows(lse, lse_ref, s_.num_qo_heads, {});
      r.max_abs_lse = cl.max_abs;
      if (cl.bad) ok = false, why << cl.bad << " bad lse; ";
      if (cl.max_abs > 1e-3) ok = false, why << "lse max-abs " << cl.max_abs << "; ";
    }
    if (!d_o_.guards_intact()) ok = false, why << "output guard bytes overwritten; ";
    if (!d_lse_.guards_intact()) ok = false, why << "lse guard bytes overwritten; ";
    if (!d_ws_.guards_intact()) ok = false, why << "workspace guard bytes overwritten; ";
    // The fused merge must leave its split counters (both levels) at 0 (the next run, or graph
    // replay, starts from there).
    const size_t ctas =
        size_t(s_.num_kv_heads) * ((s_.num_qo_heads / s_.num_kv_heads * plan_.max_q_len + 7) / 8);
    for (auto [counters, n] :
         {std::pair{plan_.counters, size_t(batch) * ctas},
          std::pair{plan_.group_counters, size_t(plan_.max_partials) * ctas}}) {
      if (counters == nullptr || n == 0) continue;
      std::vector<int32_t> cnt(n);
      LONGCTX_CUDA_CHECK(cudaMemcpy(cnt.data(), counters, n * 4, cudaMemcpyDeviceToHost));
      for (int32_t c : cnt)
        if (c != 0) {
          ok = false, why << "split counter left at " << c << "; ";
          break;
        }
    }
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }
  // 4 * head_dim FLOPs per (q head, query, key).
  double flops() const override {
    double keys = 0;
    for (size_t b = 0; b < s_.kv_lens.size(); ++b) keys += double(s_.kv_lens[b]) * s_.q_lens[b];
    return 4.0 * s_.head_dim * s_.num_qo_heads * keys;
  }
  double kv_bytes() const {
    double keys = 0;
    for (int32_t l : s_.kv_lens) keys += l;
    return 2.0 * keys * s_.num_kv_heads * s_.head_dim * 2;
  }

 private:
  PagedCaseShape s_;
  bool perf_only_;
  int min_chunk_;
  kernels::DecodeTuning tuning_;
  int merge_group_ = 0;
  int prefetch_tokens_ = -1;
  int k_scale_exp_ = 0, v_scale_exp_ = 0;
  int q_pad_;
  bool nan_tail_;
  bool fp8_;
  Fp8Pages fp8_pages_;
  std::unique_ptr<PagedCase> host_;
  GuardedBuffer d_ks_, d_vs_;
  GuardedBuffer d_q_, d_k_, d_v_, d_kvp_, d_kvi_, d_last_, d_o_, d_lse_, d_ws_;
  kernels::DecodeParams params_;
  kernels::cuda::DecodePlan plan_;
};

// q_lens are filled in by DecodeCase (one query per request).
inline testing::PagedCaseShape dshape(std::vector<int32_t> kv, int hq, int hk, int d, int page,
                                      DType dt, bool lse = true, uint64_t seed = 1) {
  return paged_shape({}, std::move(kv), hq, hk, d, page, dt, kernels::MaskMode::kNone, lse, seed);
}

}  // namespace longctx::gpu_test
