// Batched token sampling on the GPU (see SamplingBatch in kernels/sampling_kernel_params.h):
// one thread block per row, the CPU sampler's semantics and arithmetic
// (kernels/cpu/sampling_cpu.cpp, kernels/sampling_math.h), so the same logits, parameters, seed and
// step give the same token. Per row: penalties (into a work copy), greedy argmax (ties: lowest id),
// or temperature, min_p, top_k, top_p and a draw with the Philox uniform of (seed, step); raw
// logprobs, rank and top-N. Errors (NaN / +inf / all -inf logits) come back as a status per row,
// not as a CUDA error.
#pragma once

#include <cuda_runtime.h>

#include "kernels/sampling_kernel_params.h"

namespace longctx::kernels::cuda {

// All pointers in `batch` are device pointers; enqueued on `stream`, no host synchronization.
void sample_rows(const SamplingBatch& batch, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
