#include "attention/backends/paged_dispatch.h"

namespace longctx {

PlannedKernels paged_planned_kernels(const PagedShape& s, const kernels::KernelTuning& tuning) {
  PlannedKernels k;
  if (tuning.attention == kernels::AttentionKernel::kGeneric) return k;
  const bool common = (s.dtype == DType::kBF16 || s.dtype == DType::kF16) && s.num_kv_heads > 0 &&
                      s.num_qo_heads > 0 && s.num_qo_heads % s.num_kv_heads == 0 &&
                      s.page_size >= 1 && s.page_size <= 256 && s.sm_scale > 0.f;
  k.decode = k.prefill = common && (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256);
  return k;
}

PagedKernel choose_paged_kernel(const PlannedKernels& planned, bool all_decode) {
  if (all_decode) return planned.decode ? PagedKernel::kDecode : PagedKernel::kGeneric;
  return planned.prefill ? PagedKernel::kPrefill : PagedKernel::kGeneric;
}

}  // namespace longctx
