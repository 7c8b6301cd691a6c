// The gated MLP activation of Llama/Qwen: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)),
// in fp32, rounded once to out's dtype.
#pragma once

#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// gate, up, out: [n, intermediate] (rank 1-3, rows strided, last dim contiguous; gate and up
// are usually the two halves of one [n, 2 * intermediate] GEMM output), f32/bf16/f16 in any
// combination. out may be gate or up (in place) but must not overlap them otherwise.
void silu_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
void silu_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out);
void silu_and_mul_cuda(const Tensor& gate, const Tensor& up, const Tensor& out);

struct SiluAndMulParams {
  RowsView gate, up, out;  // each [rows, intermediate]
  Device device;
};
SiluAndMulParams silu_and_mul_params(const Tensor& gate, const Tensor& up, const Tensor& out);

}  // namespace longctx::ops
