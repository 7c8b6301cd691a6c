// CUDA merge of attention states (see MergeParams in kernels/decode_params.h): two states, or N
// states in one fused kernel (strided [N, n, H, D] or device pointer arrays). fp32 math; in/out
// dtypes f32/bf16/f16. The output must not alias an input.
#pragma once

#include <cuda_runtime.h>

#include "kernels/decode_params.h"

namespace longctx::kernels::cuda {

// params' pointers are device pointers (o_ptrs / lse_ptrs: device arrays of device pointers).
void merge_states(const MergeParams& params, cudaStream_t stream);

// o_a/o_b/o_out [n, H, D] of `dtype`, lse_* [n, H] fp32 (lse_out optional).
void merge_two_states(const void* o_a, const float* lse_a, const void* o_b, const float* lse_b,
                      void* o_out, float* lse_out, int num_rows, int num_heads, int head_dim,
                      DType dtype, cudaStream_t stream);

// See StateAccumulateParams; device pointers.
void accumulate_state(const StateAccumulateParams& params, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
