#include "attention/backends/paged_dispatch.h"

namespace longctx {

bool paged_planned_kernels(const PagedShape& s, const kernels::KernelTuning& tuning) {
  if (tuning.attention == kernels::AttentionKernel::kGeneric) return false;
  return (s.head_dim == 64 || s.head_dim == 128) &&
         (s.dtype == DType::kBF16 || s.dtype == DType::kF16) && s.num_kv_heads > 0 &&
         s.num_qo_heads > 0 && s.num_qo_heads % s.num_kv_heads == 0 && s.page_size >= 1 &&
         s.page_size <= 256 && s.sm_scale > 0.f;
}

PagedKernel choose_paged_kernel(bool planned_kernels, bool all_decode) {
  if (!planned_kernels) return PagedKernel::kGeneric;
  return all_decode ? PagedKernel::kDecode : PagedKernel::kPrefill;
}

kernels::PrefillTuning prefill_tuning_for(const PagedShape& shape,
                                          const kernels::PrefillTuning& tuning) {
  kernels::PrefillTuning t = tuning;
  switch (shape.kv_format) {
    case kernels::KvCacheFormat::kFp8E4M3:
      t.kernel = kernels::PrefillKernel::kFa2;
      break;
    case kernels::KvCacheFormat::kDtype:
      break;
  }
  return t;
}

}  // namespace longctx
