// Internal: the CUDA side of RaggedBlockCausalAttention (block_causal_cuda.cu). A build without
// CUDA links block_causal_cuda_stub.cpp instead, where block_causal_cuda_compiled() is false and
// every other function throws Error(kUnsupported), so callers check it before anything else.
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::detail {

struct BlockCausalCuda;

// True when this build has the CUDA side (block_causal_cuda.cu), false with the stub.
bool block_causal_cuda_compiled();

// Device index buffers for up to block_cap blocks (the launch's batch) and index_cap key indices.
// Allocated once here; reserve() reallocates (eager mode only).
BlockCausalCuda* block_causal_cuda_create(int device, int64_t block_cap, int64_t index_cap);
void block_causal_cuda_destroy(BlockCausalCuda* s);
void block_causal_cuda_reserve(BlockCausalCuda* s, int64_t block_cap, int64_t index_cap);

// Workspace the prefill plan needs for this many blocks (batch) and tokens, plus the graph-mode
// padding of the work list.
size_t block_causal_cuda_workspace_bytes(int64_t batch, int64_t total_tokens, int group,
                                         int64_t graph_work_cap);

// Upper bound of the prefill kernel's work items for any layout of num_blocks blocks and
// total_tokens tokens (what graph mode pads the grid to).
int64_t block_causal_cuda_work_cap(int64_t num_blocks, int64_t total_tokens, int group);

// Copies the int32 host arrays (batch blocks, num_indices indices) into the device buffers on
// `stream` and plans the prefill kernel into `workspace`. graph_work_cap > 0 pads its work list
// to exactly that many items (no-op items on block `noop_block`, which must have no queries).
void block_causal_cuda_plan(BlockCausalCuda* s, const int32_t* qo_indptr, const int32_t* kv_indptr,
                            const int32_t* kv_indices, const int32_t* last_page_len,
                            const int32_t* kv_len, int64_t batch, int64_t num_indices,
                            int num_qo_heads, int num_kv_heads, int head_dim,
                            int64_t graph_work_cap, int64_t noop_block, void* workspace,
                            size_t workspace_bytes, void* stream);

// Launches the planned kernel: q [n, Hqo, D], k/v [n, Hkv, D] (viewed as one-token pages), o.
void block_causal_cuda_run(BlockCausalCuda* s, const void* q, const void* k, const void* v, void* o,
                           int num_qo_heads, int num_kv_heads, int head_dim, DType dtype,
                           float sm_scale, void* stream);

}  // namespace longctx::detail
