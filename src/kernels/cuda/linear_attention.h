// CUDA kernels of the linear-attention ops (Qwen3-Next's Gated DeltaNet; the math and the params
// in kernels/linear_attention_params.h, the CPU references in kernels/cpu/linear_attention_cpu.h).
// Every pointer of the params is a device pointer, qo_indptr and states included (device arrays).
// fp32 state and accumulation; activations f32, bf16 or f16 (params.dtype).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/linear_attention_params.h"

namespace longctx::kernels::cuda {

// Token by token: one block per (sequence, value head), a thread per state column (v_dim), the
// state read and written in place in global memory (each thread owns its columns, so a token
// is two passes over the state with no synchronisation beyond the shared q and k).
void gated_delta_rule_recurrent(const GatedDeltaRuleParams& p, cudaStream_t stream);

// The chunked WY form as the CPU reference computes it: one block per (sequence, value head)
// walking its chunks, the chunk's normalized q and k, W, U and the triangular matrix in shared
// memory, the state in global memory. Where p.chunk_size's tiles do not fit the device's
// shared memory (large head dims) the chunk is halved until they do: the result differs only by
// rounding (chunking is exact in real arithmetic).
void gated_delta_rule_chunked(const GatedDeltaRuleParams& p, cudaStream_t stream);

// `rows` is the batch's row count (qo_indptr[num_seqs], known on the host). Outputs first (a
// thread per (row, channel), reading the old state for the rows near a sequence's start), then
// the states (a thread per (sequence, channel)).
void causal_conv1d(const CausalConv1dParams& p, int64_t rows, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
