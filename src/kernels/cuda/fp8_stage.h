// CUDA FP8 staging conversion (see Fp8StageParams in kernels/fp8_stage_params.h): the pages an
// FP8 prefill call reads, K and V, decoded and scaled into a compact 16-bit staging pool in one
// bandwidth-bound launch, with the decoder the attention kernels' converting loaders use
// (fp8_device.cuh's fp8x16_to_elements), so the staged values are the ones the in-kernel path
// converts, bit for bit. The CPU twin is kernels/cpu/fp8_stage_cpu.h.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention_params.h"
#include "kernels/fp8_stage_params.h"

namespace longctx::kernels::cuda {

// params' pointers are device pointers: the codes, scales and outputs 16-byte aligned. No host
// sync, no allocation, no host reads: safe inside a CUDA graph. Throws Error(kInvalidArgument) on
// malformed params (check_fp8_stage_params) or misaligned pointers.
void fp8_stage_run(const Fp8StageParams& params, cudaStream_t stream);

// The staged prefill's launch half: converts the `num_pages` pages of an FP8 prefill call `p`
// (kv_indices [num_pages]) into the pool at `pool` (fp8_stage_layout(num_pages, ...) bytes,
// 256-byte aligned) and returns p over the pool: the 16-bit caches, kv_indices 0..n-1,
// kv_contiguous (each request's pages are consecutive staging pages), kv_format kDtype, no
// scales; kv_indptr, the last page lengths, masks and window unchanged (a block mask's key blocks
// are the request's keys in order, which the pool keeps). Graph-safe like fp8_stage_run.
PagedPrefillParams fp8_stage_prefill(const PagedPrefillParams& p, int64_t num_pages, void* pool,
                                     cudaStream_t stream);

}  // namespace longctx::kernels::cuda
