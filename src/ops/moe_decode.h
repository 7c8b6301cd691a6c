// The decode path of the CUDA MoE ops (MoePath::kDecode, moe_decode_cuda.cu), which
// moe_experts_cuda takes for a few tokens. Included by CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include "longctx/core/tensor.h"
#include "ops/moe.h"

namespace longctx::ops {

// The routed experts of s.tokens <= kMoeDecodeMaxTokens tokens into a.out, in two kernels:
// gate/up GEMVs (silu * up fused) and down GEMVs with the weighted combine fused, the experts
// and weights from a.topk_ids / a.topk_weights.
void moe_decode_experts(const MoeArgs& a, const MoeShape& s, cudaStream_t stream);

}  // namespace longctx::ops
