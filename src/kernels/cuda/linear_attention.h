// CUDA kernels of the linear-attention ops (Qwen3-Next's Gated DeltaNet; the math and the params
// in kernels/linear_attention_params.h, the CPU references in kernels/cpu/linear_attention_cpu.h).
// Every pointer of the params is a device pointer, qo_indptr and states included (device arrays).
// fp32 state and accumulation; activations f32, bf16 or f16 (params.dtype).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/linear_attention_params.h"

namespace longctx::kernels::cuda {

// Token by token (decode): a block per (sequence, value head, 32 state columns), four warps
// splitting the k_dim rows, each thread holding its rows of its column in registers across the
// sequence's tokens: the state is read and written once per call with independent, coalesced
// loads, and Qwen3-Next-80B's 32 heads of 128 x 128 give 128 blocks per sequence. k_dim above 256
// takes gated_delta_rule_recurrent_per_head.
void gated_delta_rule_recurrent(const GatedDeltaRuleParams& p, cudaStream_t stream);

// The first recurrent kernel, kept for one comparison on the GPU (ops::RecurrentKernel): one
// block per (sequence, value head), a thread per state column (v_dim), the state read and written
// in place in global memory, two passes per token whose loads wait on the stores before them:
// 32 blocks at batch 1 on the 80B's shapes, each a chain of dependent memory round trips.
void gated_delta_rule_recurrent_per_head(const GatedDeltaRuleParams& p, cudaStream_t stream);

// The chunked WY form. Where the head dims are the models' (k_dim 64 or 128, v_dim a multiple
// of 32) and the chunk is at most 64, two kernels per segment of the call's chunks: a
// chunk-parallel precompute of what does not need the state (normalized q and k, the decays,
// T = (I - A)^-1, W, U, the intra-chunk q.k decays) into `workspace`, then a sequential pass per
// (sequence, value head, 32 state columns) that keeps its state slice in shared memory across
// the chunks. Otherwise one block per (sequence, value head) walks its chunks, everything in
// shared memory and the state in global memory; where p.chunk_size's tiles do not fit the
// device's shared memory (large head dims) the chunk is halved until they do (chunking is exact
// in real arithmetic: only the rounding differs). `rows` is qo_indptr[num_seqs].
void gated_delta_rule_chunked(const GatedDeltaRuleParams& p, int64_t rows, float* workspace,
                              int64_t workspace_floats, cudaStream_t stream);

// The fp32 workspace gated_delta_rule_chunked wants for the call (0: the one-pass kernel runs):
// a segment of chunks, at most 256 MiB, e.g. 252 MiB for Qwen3-Next-80B's 32 value heads at
// head dims 128 (56 chunks of 64 tokens, 144 KiB each per head). A smaller one (of at least one
// chunk) only means more segments.
int64_t gated_delta_rule_chunked_workspace(const GatedDeltaRuleParams& p, int64_t rows);

// `rows` is the batch's row count (qo_indptr[num_seqs], known on the host). Outputs first (a
// thread per (row, channel), reading the old state for the rows near a sequence's start), then
// the states (a thread per (sequence, channel)).
void causal_conv1d(const CausalConv1dParams& p, int64_t rows, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
