// The gated MLP activation of Llama/Qwen: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
#pragma once

#include "longctx/core/tensor.h"

namespace longctx::ops {

// gate, up, out: [n, intermediate] f32 (out may be gate or up).
void silu_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
void silu_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out);

}  // namespace longctx::ops
