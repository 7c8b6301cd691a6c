// The gated MLP activations, in fp32, rounded once to out's dtype:
//   silu_and_mul (Llama, Qwen): out = silu(gate) * up, silu(g) = g / (1 + exp(-g));
//   gelu_tanh_and_mul (Gemma's GeGLU, transformers' gelu_pytorch_tanh):
//     out = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * up;
//   sigmoid_and_mul (Qwen3-Next's attention output gate): out = sigmoid(gate) * up.
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
// Same contract.
void gelu_tanh_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
void gelu_tanh_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out);
void gelu_tanh_and_mul_cuda(const Tensor& gate, const Tensor& up, const Tensor& out);

// Same contract: out = sigmoid(gate) * up (Qwen3-Next's gated attention output).
void sigmoid_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
void sigmoid_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out);
void sigmoid_and_mul_cuda(const Tensor& gate, const Tensor& up, const Tensor& out);

enum class GatedAct { kSilu, kGeluTanh, kSigmoid };

struct SiluAndMulParams {
  RowsView gate, up, out;  // each [rows, intermediate]
  Device device;
  GatedAct act = GatedAct::kSilu;
};
SiluAndMulParams silu_and_mul_params(const Tensor& gate, const Tensor& up, const Tensor& out);

}  // namespace longctx::ops
