#include "attention/backends/paged_dispatch.h"

#include <algorithm>

#include "kernels/decode_params.h"
#include "kernels/fp8_stage_params.h"

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

PagedCallQueries paged_call_queries(const int32_t* qo_indptr, int batch, kernels::MaskMode mask,
                                    int window) {
  PagedCallQueries q;
  q.max_q_len = 0;
  for (int b = 0; b < batch; ++b)
    q.max_q_len = std::max(q.max_q_len, qo_indptr[b + 1] - qo_indptr[b]);
  q.mask = mask;
  q.window = window;
  return q;
}

PagedKernel choose_paged_kernel(const PlannedKernels& planned, const PagedCallQueries& q,
                                int decode_max_q_len) {
  if (q.max_q_len <= 1) return planned.decode ? PagedKernel::kDecode : PagedKernel::kGeneric;
  // The decode kernel's rules (kernels/decode_params.h): the causal tail (MaskMode::kCausal's),
  // or every key for every query, which a window would shift per query in the prefill's terms.
  bool rule = false;
  switch (q.mask) {
    case kernels::MaskMode::kCausal:
      rule = true;
      break;
    case kernels::MaskMode::kNone:
      rule = q.window == 0;
      break;
  }
  const int max_q = std::min(decode_max_q_len, kernels::kDecodeMaxQLen);
  if (planned.decode && rule && !q.block_sparse && q.max_q_len <= max_q)
    return PagedKernel::kDecode;
  return planned.prefill ? PagedKernel::kPrefill : PagedKernel::kGeneric;
}

size_t paged_fp8_stage_bytes(const PagedShape& s, const PlannedKernels& planned,
                             const kernels::KernelTuning& tuning, int64_t max_call_pages) {
  if (!planned.prefill || s.kv_format != kernels::KvCacheFormat::kFp8E4M3) return 0;
  return kernels::fp8_stage_pool_bytes(max_call_pages, tuning.prefill.fp8_stage_mib, s.page_size,
                                       s.num_kv_heads, s.head_dim, s.dtype);
}

bool paged_fp8_staged(const PagedShape& s, PagedKernel kernel, int64_t call_pages,
                      size_t pool_bytes) {
  return kernel == PagedKernel::kPrefill && s.kv_format == kernels::KvCacheFormat::kFp8E4M3 &&
         kernels::fp8_stage_fits(call_pages, pool_bytes, s.page_size, s.num_kv_heads, s.head_dim,
                                 s.dtype);
}

}  // namespace longctx
