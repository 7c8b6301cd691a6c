// Staging an FP8 KV call for the 16-bit prefill kernel: the paged prefill over an FP8 cache
// (kv_format kFp8E4M3, kernels/kv_format.h) converts the pages the call reads into a compact
// 16-bit staging pool first (page j of the call -> staging page j), then runs the 16-bit kernel
// over it with kv_indices 0..n-1 (docs/fp8_kv.md, "Staged prefill": why, what it costs, when).
// The parameter struct is shared by the CPU twin (kernels/cpu/fp8_stage_cpu.h) and the CUDA
// kernel (kernels/cuda/fp8_stage.h); the layout and capacity helpers are host code used by the
// planners (paged_dispatch_cuda, the memory plan, tests and benches).
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::kernels {

// Converts call page j (cache page kv_indices[j]) of K and V into staging page j:
// out[j, s, h, :] = decode(codes[kv_indices[j], s, h, :]) * scale[kv_indices[j], h], rounded to
// dtype (exact for every finite code: power-of-two scales, E4M3 values are f16 / bf16 values;
// NaN codes give NaN). Whole pages: the slots of a request's last page past its kv_len are
// converted too (the 16-bit kernel zero-fills the rows past kv_len and never reads them).
struct Fp8StageParams {
  const uint8_t* k_codes = nullptr;     // [cache pages, page_size, num_kv_heads, head_dim]
  const uint8_t* v_codes = nullptr;     // [cache pages, page_size, num_kv_heads, head_dim]
  const float* k_scale = nullptr;       // [cache pages, num_kv_heads]
  const float* v_scale = nullptr;       // [cache pages, num_kv_heads]
  const int32_t* kv_indices = nullptr;  // [num_pages] the call's pages in call order
  void* k_out = nullptr;                // [num_pages, page_size, num_kv_heads, head_dim] dtype
  void* v_out = nullptr;                // [num_pages, page_size, num_kv_heads, head_dim] dtype
  // Optional: receives 0..num_pages-1 (the staged call's kv_indices).
  int32_t* iota_out = nullptr;  // [num_pages]
  int64_t num_pages = 0;        // the call's pages (kv_indptr[batch_size])
  int page_size = 0;            // 1 .. 256
  int num_kv_heads = 0;
  int head_dim = 0;            // a multiple of 16 (the 16-code chunks)
  DType dtype = DType::kBF16;  // of the staging pool: bf16 or f16 (the call's q / o dtype)
};

// Byte offsets of one staging pool of `num_pages` pages inside a buffer (256-byte aligned parts).
struct Fp8StageLayout {
  size_t k = 0, v = 0, iota = 0;  // offsets of K, V and the iota indices
  size_t bytes = 0;               // the whole pool
};
Fp8StageLayout fp8_stage_layout(int64_t num_pages, int page_size, int num_kv_heads, int head_dim,
                                DType dtype);

// The most pages whose 16-bit K and V fit `max_bytes` (the pool adds the 4-byte indices of each
// page and the parts' alignment: fp8_stage_layout(n).bytes). 0 when not one.
int64_t fp8_stage_capacity_pages(size_t max_bytes, int page_size, int num_kv_heads, int head_dim,
                                 DType dtype);

// Bytes of the staging pool a caller allocates for calls of at most `max_call_pages` pages under
// a cap of `cap_mib` MiB (PrefillTuning::fp8_stage_mib): the pool of min(max_call_pages, what the
// cap holds) pages; 0 when cap_mib is 0 (every FP8 call converts in the kernel).
size_t fp8_stage_pool_bytes(int64_t max_call_pages, int cap_mib, int page_size, int num_kv_heads,
                            int head_dim, DType dtype);

// Whether a prefill call reading `call_pages` pages is staged in a pool of `pool_bytes`: it fits
// (a call that does not converts in the kernel instead: the fallback, same results).
bool fp8_stage_fits(int64_t call_pages, size_t pool_bytes, int page_size, int num_kv_heads,
                    int head_dim, DType dtype);

// Throws Error(kInvalidArgument) naming the field on a bad shape or a missing pointer (reads no
// pointer: the CUDA entry checks device params with it).
void check_fp8_stage_params(const Fp8StageParams& params);

}  // namespace longctx::kernels
