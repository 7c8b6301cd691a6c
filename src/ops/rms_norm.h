// RMSNorm as transformers' LlamaRMSNorm computes it in float32:
//   out = weight * (x * rsqrt(mean(x^2) + eps))
// (x times the reciprocal root first, then the weight; fp32 throughout). Qwen3's q_norm/k_norm
// are the same op over rows of head_dim.
#pragma once

#include "longctx/core/tensor.h"

namespace longctx::ops {

// x, out: [rows, d] f32 (out may be x); weight: [d] f32/bf16/f16.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void rms_norm_cpu(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);

}  // namespace longctx::ops
