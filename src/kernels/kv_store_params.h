// Parameter struct of the KV store: the step that writes the new tokens' K and V rows into their
// slots of a paged KV pool (vLLM's reshape_and_cache), shared by the CPU reference
// (kernels/cpu/kv_store_cpu.h) and the CUDA kernel (kernels/cuda/kv_store.h). Raw pointers and
// plain integers only, like kernels/attention_params.h: the same struct describes host buffers for
// the reference and device buffers for the kernel.
//
// Token t's rows k[t, :, :] and v[t, :, :] go to slot s = slot_mapping[t], i.e. page s / page_size,
// offset s % page_size of k_cache / v_cache (the layout the paged prefill and decode kernels
// read). A negative slot is padding: the token is skipped. A slot >= num_pages * page_size is a
// caller bug: the CPU reference throws Error(kOutOfRange) before writing anything; the CUDA
// kernel skips that token (no fault, no write) and stores 1 into *error_flag when error_flag is
// non-null (it never clears the flag: the caller zeroes it and reads it when it likes).
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"
#include "longctx/core/dtype.h"

namespace longctx::kernels {

struct KvStoreParams {
  // Sources: strided views (e.g. into a fused qkv GEMM output); the last dim is contiguous and
  // heads are head_dim elements apart, tokens k_token_stride / v_token_stride elements apart.
  const void* k = nullptr;     // [num_tokens, num_kv_heads, head_dim], token stride k_token_stride
  const void* v = nullptr;     // [num_tokens, num_kv_heads, head_dim], token stride v_token_stride
  int64_t k_token_stride = 0;  // elements, >= num_kv_heads * head_dim
  int64_t v_token_stride = 0;  // elements, >= num_kv_heads * head_dim

  void* k_cache = nullptr;                // [num_pages, page_size, num_kv_heads, head_dim]
  void* v_cache = nullptr;                // [num_pages, page_size, num_kv_heads, head_dim]
  const int64_t* slot_mapping = nullptr;  // [num_tokens] page * page_size + offset; < 0: skip
  int* error_flag = nullptr;  // CUDA only, optional device int: set to 1 on a slot past the pool

  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_dim = 0;            // any >= 1 (16-byte copies when rows and pointers allow)
  int page_size = 0;           // >= 1
  int num_pages = 0;           // pages in k_cache / v_cache: the bound of the slots
  DType dtype = DType::kBF16;  // of k, v and (kv_format kDtype) the caches: bf16, f16 or f32
  // kFp8E4M3: the caches take FP8 codes and the store keeps the pages' scales in k_scale /
  // v_scale [num_pages, num_kv_heads] (kernels/kv_format.h says how).
  KvCacheFormat kv_format = KvCacheFormat::kDtype;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};

}  // namespace longctx::kernels
