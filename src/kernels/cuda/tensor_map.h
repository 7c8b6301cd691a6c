// TMA tensor maps (CUtensorMap) for kernels that load boxes of a paged KV cache with
// cp.async.bulk.tensor (kernels/cuda/tma_device.cuh). The driver's encoder is reached through
// the runtime's entry-point query, so nothing links libcuda directly.
#pragma once

#include <cuda.h>

#include "longctx/core/dtype.h"

namespace longctx::kernels::cuda {

// Slot bound for maps over a whole paged cache when the cache's size is not a kernel parameter
// (decode, prefill): the kernels never put a box past a page the request owns, so the bound
// only has to cover every slot id.
constexpr int64_t kKvTensorMapAnySlot = (int64_t(1) << 31) - 1;

// True when the current device can run TMA copies (compute capability 9.x).
bool tma_supported();

// The cache [slots, num_kv_heads, head_dim] of 16-bit elements (bf16 / f16; rows of all pages,
// slot = page * page_size + offset) as a 3-D tensor (dims innermost first: head_dim, kv heads,
// slots) whose boxes are (64 dims, 1 kv head, box_tokens slots), stored in shared memory with the
// 128-byte swizzle. num_slots bounds the slot coordinate (boxes past it read zeros).
// Throws Error(kUnsupported) when the driver refuses the map (the message names the reason).
CUtensorMap kv_cache_tensor_map(const void* cache, int64_t num_slots, int num_kv_heads,
                                int head_dim, int box_tokens, DType dtype);

}  // namespace longctx::kernels::cuda
