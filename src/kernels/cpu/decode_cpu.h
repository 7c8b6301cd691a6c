// CPU reference of batch decode over a paged KV cache (naive, fp32): what the CUDA split-KV
// kernel (kernels/cuda/decode.h) is tested against.
#pragma once

#include "kernels/decode_params.h"

namespace longctx::kernels::cpu {

// All pointers in `params` are host pointers. Element dtype bf16, f16 or f32; any head_dim.
// Throws Error(kInvalidArgument) on a non-integral GQA ratio or a bad page table.
void decode_attention(const DecodeParams& params);

}  // namespace longctx::kernels::cpu
