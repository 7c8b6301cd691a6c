#include "attention/backends/paged_dispatch.h"

namespace longctx {

PlannedKernels paged_planned_kernels(const PagedShape& s, const kernels::KernelTuning& tuning) {
  PlannedKernels k;
  if (tuning.attention == kernels::AttentionKernel::kGeneric) return k;
  const bool common = (s.dtype == DType::kBF16 || s.dtype == DType::kF16) && s.num_kv_heads > 0 &&
                      s.num_qo_heads > 0 && s.num_qo_heads % s.num_kv_heads == 0 &&
                      s.page_size >= 1 && s.page_size <= 256 && s.sm_scale > 0.f;
  // FP8 caches: the converting loaders exist at head_dim 64 / 128.
  const bool dims = s.head_dim == 64 || s.head_dim == 128 ||
                    (s.head_dim == 256 && s.kv_format == kernels::KvCacheFormat::kDtype);
  k.decode = k.prefill = common && dims;
  return k;
}

PagedKernel choose_paged_kernel(const PlannedKernels& planned, bool all_decode) {
  if (all_decode) return planned.decode ? PagedKernel::kDecode : PagedKernel::kGeneric;
  return planned.prefill ? PagedKernel::kPrefill : PagedKernel::kGeneric;
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
