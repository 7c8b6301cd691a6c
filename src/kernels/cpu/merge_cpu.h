// CPU references of attention-state merging (see MergeParams in kernels/decode_params.h).
#pragma once

#include "kernels/decode_params.h"

namespace longctx::kernels::cpu {

// N states at once; host pointers. The merge is done in fp32 and rounded once at the output.
void merge_states(const MergeParams& params);

// Two states, o [n, H, D] + lse [n, H] each (same dtype for inputs and output).
void merge_two_states(const void* o_a, const float* lse_a, const void* o_b, const float* lse_b,
                      void* o_out, float* lse_out, int num_rows, int num_heads, int head_dim,
                      DType dtype);

// See StateAccumulateParams; host pointers.
void accumulate_state(const StateAccumulateParams& params);

}  // namespace longctx::kernels::cpu
