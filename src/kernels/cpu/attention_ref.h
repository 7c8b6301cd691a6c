// CPU reference attention kernels: readable, naive, fp32 accumulation. They are the
// specification the CUDA kernels are tested against (tests/gpu_kernels), and are themselves
// tested in CI against dense_attention_masked_ref, the direct formula with an explicit mask
// (tests/kernels).
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace longctx::kernels::cpu {

// Batch prefill over a paged KV cache, dense or block-sparse: the semantics documented on
// PagedPrefillParams, with host pointers. Each output row is o = softmax(sm_scale * q K^T) V over
// the keys the query may see (rounded once to params.dtype); lse, when non-null, gets
// log(sum exp(s)) in fp32. A query that sees no key gets o = 0, lse = -inf.
//
// rows/num_rows: when rows is non-null only these global query tokens (indices into
// [0, qo_indptr[batch_size])) are computed and the other rows of o/lse are left untouched; the
// GPU harness uses it to check a sampled subset of rows of very long prefills.
// Throws Error(kInvalidArgument) on malformed params (GQA ratio, page ids, lengths).
void paged_prefill_ref(const PagedPrefillParams& params, const int32_t* rows = nullptr,
                       int64_t num_rows = 0);

// Validates params (shapes, indptr monotonicity, page ids in [0, num_pages) when num_pages >= 0,
// last-page lengths, block-mask heads). Throws Error(kInvalidArgument) naming the problem.
// Reads the index arrays, so they must be host pointers.
void check_paged_prefill_params(const PagedPrefillParams& params, int64_t num_pages = -1);

// Direct dense attention with an explicit boolean mask, all fp32 (the check the references are
// tested against):
//   q    [n_q, num_qo_heads, head_dim]
//   k, v [n_k, num_kv_heads, head_dim]
//   mask [num_qo_heads, n_q, n_k]  (nonzero = query may see key)
//   o    [n_q, num_qo_heads, head_dim]; lse [n_q, num_qo_heads] (optional)
// Fully masked rows get o = 0, lse = -inf.
void dense_attention_masked_ref(const float* q, const float* k, const float* v, const uint8_t* mask,
                                int n_q, int n_k, int num_qo_heads, int num_kv_heads, int head_dim,
                                float sm_scale, float* o, float* lse);

// Element load/store helpers for f32 / bf16 / f16 buffers (shared by the references and the
// tests).
float load_elem(const void* base, int64_t index, DType dtype);
void store_elem(void* base, int64_t index, DType dtype, float value);

}  // namespace longctx::kernels::cpu
