// Qwen3's / Gemma 3's per-head q/k RMSNorm and the rotary embedding in one op, in place on the q
// and k heads of a fused qkv output:
//   qk[t, h] = rope(rms_norm(qk[t, h], h < q_heads ? q_weight : k_weight), positions[t])
// It is the unfused sequence (rms_norm over the q heads, over the k heads, rope over both) to the
// bit on the CPU: the CPU twin runs exactly those ops. The normalized value is rounded to qk's
// dtype before it is rotated, as the unfused ops store it in between. On CUDA it is one launch
// instead of three per layer (a decode step's small kernels cost their launch, not their bytes),
// with the same arithmetic as rms_norm_cuda and rope_cuda (squares summed in double, sincosf of
// the float32 angle, separately rounded products), so it equals the CUDA ops too except where
// the double sum's order moves the float32 variance.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"
#include "ops/op_params.h"
#include "ops/rope.h"

namespace longctx::ops {

// qk: [n, heads, head_dim] f32/bf16/f16 with any strides but a contiguous last dim (q then k
// heads of a fused qkv row), updated in place; the first q_heads heads take q_weight, the
// rest k_weight (each [head_dim] f32/bf16/f16, contiguous). positions and rope: as rope()
// takes them. Throws Error(kInvalidArgument) for shapes that do not fit.
void qk_norm_rope(const Tensor& qk, int64_t q_heads, const Tensor& q_weight, const Tensor& k_weight,
                  float eps, const Tensor& positions, const RopeArgs& rope);
void qk_norm_rope_cpu(const Tensor& qk, int64_t q_heads, const Tensor& q_weight,
                      const Tensor& k_weight, float eps, const Tensor& positions,
                      const RopeArgs& rope);
void qk_norm_rope_cuda(const Tensor& qk, int64_t q_heads, const Tensor& q_weight,
                       const Tensor& k_weight, float eps, const Tensor& positions,
                       const RopeArgs& rope);

struct QkNormRopeParams {
  RopeParams rope;                 // x: [n * heads, head_dim] rows (rope_params of qk)
  int64_t q_heads = 0;             // heads [0, q_heads) take q_weight, the rest k_weight
  const void* q_weight = nullptr;  // [head_dim]
  const void* k_weight = nullptr;  // [head_dim]
  DType q_weight_dtype = DType::kF32, k_weight_dtype = DType::kF32;
  float eps = 0.f;
};
// Checks the arguments for both twins.
QkNormRopeParams qk_norm_rope_params(const Tensor& qk, int64_t q_heads, const Tensor& q_weight,
                                     const Tensor& k_weight, float eps, const Tensor& positions,
                                     const RopeArgs& rope);

}  // namespace longctx::ops
