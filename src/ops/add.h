// Element-wise sum, the residual connection of every decoder layer.
#pragma once

#include "longctx/core/tensor.h"

namespace longctx::ops {

// a, b, out: same shape, f32 (out may be a or b).
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out);

}  // namespace longctx::ops
