// nn.Linear: out = x @ weight^T + bias, fp32 accumulation, weight in its checkpoint dtype.
#pragma once

#include "longctx/core/tensor.h"

namespace longctx::ops {

// x: [n, in] f32; weight: [out, in] f32/bf16/f16; bias: [out] f32/bf16/f16 or undefined;
// out: [n, out] f32 (must not overlap x).
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
void linear_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

}  // namespace longctx::ops
