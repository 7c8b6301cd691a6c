// CUDA KV store (see KvStoreParams in kernels/kv_store_params.h): writes the K and V rows of every
// new token into its slot of the paged pool in one launch. Each token's K (and V) row of
// num_kv_heads * head_dim elements is contiguous in the source (head stride = head_dim) and in the
// cache, so the kernel copies whole rows with the widest vector (16, 8, 4 or 2 bytes) that the row
// size, the token strides and the four base pointers allow.
//
// FP8 (kv_format kFp8E4M3): writes E4M3 codes and keeps the pages' scales exactly as the CPU
// reference does (kernels/kv_format.h), bit for bit. The tokens one step writes into one page must
// be consecutive in the step (padding tokens between them allowed), in slot order: the engine's
// appends are; two separate runs of tokens into the same page would race.
#pragma once

#include <cuda_runtime.h>

#include "kernels/kv_store_params.h"

namespace longctx::kernels::cuda {

// params' pointers are device pointers (error_flag: optional device int). No host sync, no
// allocation, no host reads of device memory: safe inside a CUDA graph. Slots < 0 are skipped;
// a slot >= num_pages * page_size is skipped and sets *error_flag = 1 (see kv_store_params.h).
// Throws Error(kInvalidArgument) on malformed params (cpu::check_kv_store_params) or a base
// pointer / stride not aligned to the element size, Error(kUnsupported) on a dtype other than
// bf16 / f16 / f32.
void kv_store_run(const KvStoreParams& params, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
