// Generic CUDA paged attention: the semantics of PagedPrefillParams (kernels/attention_params.h:
// batch of requests with query ranges, paged KV with last-page lengths, GQA, kNone / kCausal,
// optional block-sparse mask, optional lse, the output in q's dtype or in fp32 (o_f32)) for any
// head_dim in [8, 256] that is a multiple of 8 and any page_size >= 1. It serves the small-head
// test models (head_dim 16, 32) and is the fallback where paged_prefill_run / decode_run do not
// support a shape (they take 64 / 128). KernelTuning::attention = kGeneric makes the paged backends
// (resident and offload) take it for every head_dim: P and every sum in fp32 (one rounding, of
// the output), the precision reference of exactness experiments (bench/offload/exactness.py).
// Decode (q_len 1 per request) is the same call.
//
// CUDA cores, no tensor cores: one CTA per (query token, kv head, tile of up to 8 q heads of that
// kv group); the keys the row may see are spread over the CTA's lane groups (head_dim / 8 lanes,
// rounded up to a power of two, per key, 16-byte loads), each lane group keeps an online softmax
// per q head, and the groups' states are merged through shared memory. Every K/V byte a CTA
// reads serves all its q heads. Work is proportional to (query, visible key) pairs; a long
// decode row of few kv heads runs on few SMs (no split-KV: no plan, no workspace).
//
//   paged_generic_run(params, total_q, stream);   // no plan, no host sync, graph-safe
//
// The kernel reads the request's kv_len from the device page table and finds each token's
// request by a binary search of qo_indptr.
//
// FP8 caches (kv_format kFp8E4M3, k_scale / v_scale): each lane loads 8 codes and its key's page
// scales and dequantizes in registers; the math after the load is the 16-bit path's (fp32).
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention_params.h"

namespace longctx::kernels::cuda {

// True when the kernel handles these params: head_dim 8..256 and a multiple of 8, bf16 / f16,
// integral GQA ratio, page_size >= 1, mask kNone / kCausal, sm_scale > 0, block_mask_heads 1 or
// num_qo_heads when block_mask is set, num_kv_heads * ceil(group / 8) <= 65535. Looks at no
// pointer.
bool paged_generic_supported(const PagedPrefillParams& params);

// params' pointers are device pointers; total_q must equal qo_indptr[batch_size] (the host's
// copy; token rows at or past qo_indptr[batch_size] are not written). q, k_cache and v_cache must
// be 16-byte aligned; an FP8 cache needs k_scale and v_scale. Throws Error(kUnsupported) when
// paged_generic_supported() is false, Error(kInvalidArgument) on a negative total_q / batch_size,
// null pointers or misalignment.
void paged_generic_run(const PagedPrefillParams& params, int total_q, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
