// The decode path of the CUDA MoE ops (MoePath::kDecode, moe_decode_cuda.cu), shared by
// moe_experts_cuda and moe_forward_cuda. Included by CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include "longctx/core/tensor.h"
#include "ops/moe.h"

namespace longctx::ops {

// The routed experts of s.tokens <= kMoeDecodeMaxTokens tokens into a.out, in two kernels:
// gate/up GEMVs (silu * up fused) and down GEMVs with the weighted combine fused. With `logits`
// ([T, E] router logits, moe_fused_route(E, k)) the gate/up kernel also routes (softmax,
// top-k, renormalized when `renormalize`) and writes a.topk_ids / a.topk_weights; without, it
// reads them.
void moe_decode_experts(const MoeArgs& a, const MoeShape& s, const Tensor* logits, bool renormalize,
                        cudaStream_t stream);

}  // namespace longctx::ops
