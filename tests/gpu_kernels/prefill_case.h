// The paged prefill's op-test case (kernels/cuda/prefill.h) against the CPU reference, shared by
// the prefill test files: the plan (with the split's workspace) made in prepare(), FP8 pages
// staged or converted in the kernel as the tuning says, the workspace's guard bytes checked.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gpu_kernels/harness.h"
#include "gpu_kernels/paged_prefill_case.h"
#include "kernels/cuda/fp8_stage.h"
#include "kernels/cuda/prefill.h"
#include "kernels/paged_case.h"

namespace longctx::gpu_test {

inline constexpr double kPrefillOutTolBf16 = 2e-2;
inline constexpr double kPrefillOutTolF16 = 4e-3;

class PrefillCase : public PagedPrefillCase {
 public:
  explicit PrefillCase(testing::PagedCaseShape s, bool perf_only = false,
                       const kernels::PrefillTuning& tuning = {})
      : PagedPrefillCase(std::move(s), perf_only, "prefill", 6, kPrefillOutTolBf16,
                         kPrefillOutTolF16),
        tuning_(tuning) {}
  // FP8 pages (fp8_pages.h), read by whichever kernel `tuning` takes: by default staged (the
  // pages converted into a 16-bit pool, kernels/cuda/fp8_stage.h, then the 16-bit kernel: the
  // Hopper one on sm_90); PrefillTuning::fp8_stage_mib 0 converts in the kernel (the Hopper
  // kernel's converting producer, or with PrefillKernel::kFa2 the mma.sync kernel's loader).
  static std::unique_ptr<PrefillCase> fp8(testing::PagedCaseShape s, bool perf_only = false,
                                          const kernels::PrefillTuning& tuning = {}) {
    auto c = std::make_unique<PrefillCase>(std::move(s), perf_only, tuning);
    c->use_fp8();
    c->fp8_named_ = true;
    return c;
  }

  bool supported() const override {
    kernels::PagedPrefillParams p;
    s_.set_head_fields(p);
    return kernels::cuda::paged_prefill_supported(p);
  }

  void prepare(cudaStream_t stream) override {
    upload_inputs();
    const testing::PagedCase& h = *host_;
    const int group = s_.num_qo_heads / s_.num_kv_heads;
    // With the split's workspace: plan() takes the stream-K split wherever its model (or
    // PrefillTuning::split kAlways) says so.
    d_ws_ = GuardedBuffer(
        kernels::cuda::paged_prefill_workspace_bytes(int(s_.q_lens.size()), h.total_q, group) +
            kernels::cuda::paged_prefill_split_workspace_bytes(s_.head_dim),
        0);
    // A windowed call is planned without the split (run() refuses the pair).
    kernels::PrefillTuning tuning = tuning_;
    if (s_.window > 0) tuning.split = kernels::PrefillSplitMode::kNever;
    plan_ = kernels::cuda::paged_prefill_plan(
        h.qo_indptr.data(), s_.kv_lens.data(), int(s_.q_lens.size()), s_.num_qo_heads,
        s_.num_kv_heads, s_.head_dim, s_.mask_mode, d_ws_.data(), d_ws_.bytes(), stream, tuning);
    // FP8: the staged path where the call's pages fit the tuning's cap (as PagedDispatcher
    // decides), in a pool inside guard bytes.
    stage_pages_ = 0;
    prepared_ = true;
    if (params_.kv_format == kernels::KvCacheFormat::kFp8E4M3) {
      const int64_t pages = h.kv_indptr.back();
      const size_t pool = kernels::fp8_stage_pool_bytes(pages, tuning_.fp8_stage_mib, s_.page_size,
                                                        s_.num_kv_heads, s_.head_dim, s_.dtype);
      if (kernels::fp8_stage_fits(pages, pool, s_.page_size, s_.num_kv_heads, s_.head_dim,
                                  s_.dtype)) {
        d_stage_ = GuardedBuffer(pool, 0xFF);
        stage_pages_ = pages;
      }
    }
  }

  void launch(cudaStream_t stream) override {
    if (stage_pages_ > 0) {
      kernels::cuda::paged_prefill_run(
          kernels::cuda::fp8_stage_prefill(params_, stage_pages_, d_stage_.data(), stream), plan_,
          stream);
      return;
    }
    kernels::cuda::paged_prefill_run(params_, plan_, stream);
  }

  std::string name() const override {
    std::string n = PagedPrefillCase::name();
    if (params_.kv_format != kernels::KvCacheFormat::kFp8E4M3 && !fp8_named_) return n;
    // (Before prepare(): what the tuning asks for; every case here fits the default cap.)
    n += stage_pages_ > 0 || (!prepared_ && tuning_.fp8_stage_mib > 0) ? " fp8 staged"
                                                                       : " fp8 in-kernel";
    if (tuning_.kernel == kernels::PrefillKernel::kFa2) n += " fa2";
    return n;
  }

  const kernels::cuda::PrefillPlan& plan() const { return plan_; }
  bool staged() const { return stage_pages_ > 0; }

 private:
  void check_more(const std::vector<uint16_t>&, std::ostringstream& why, bool& ok) const override {
    if (!d_ws_.guards_intact()) ok = false, why << "workspace guard bytes overwritten; ";
    if (stage_pages_ > 0 && !d_stage_.guards_intact())
      ok = false, why << "staging pool guard bytes overwritten; ";
  }

  kernels::PrefillTuning tuning_;
  bool fp8_named_ = false;  // an FP8 case (named before prepare() sets params_)
  bool prepared_ = false;
  int64_t stage_pages_ = 0;  // > 0: launch() stages the FP8 pages first
  GuardedBuffer d_ws_, d_stage_;
  kernels::cuda::PrefillPlan plan_;
};

inline testing::PagedCaseShape shape(std::vector<int32_t> q, std::vector<int32_t> kv, int hq,
                                     int hk, int d, int page, DType dt, kernels::MaskMode mode,
                                     bool lse = true, uint64_t seed = 1) {
  return paged_shape(std::move(q), std::move(kv), hq, hk, d, page, dt, mode, lse, seed);
}

inline void expect_no_failures(const RunSummary& s, int min_ok) {
  EXPECT_EQ(s.failed, 0);
  EXPECT_GE(s.ok, min_ok);  // the suite must actually have run cases
}

}  // namespace longctx::gpu_test
