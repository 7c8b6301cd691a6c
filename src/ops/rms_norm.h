// RMSNorm as transformers' LlamaRMSNorm computes it in float32:
//   out = weight * (x * rsqrt(mean(x^2) + eps))
// (x times the reciprocal root first, then the weight; fp32 throughout, rounded once to out's
// dtype). Both twins sum the squares in double (a float times a float is exact in double), so
// the mean is as exact as torch's pairwise sum and the twins agree to the last bit in almost
// every row. Qwen3's q_norm/k_norm are the same op over [n, heads, head_dim] views.
//
// add_rms_norm is vLLM's fused_add_rms_norm with an fp32 residual stream:
//   residual += x;  out = rms_norm(residual)
// (the residual add in fp32, one rounding of x's value to f32 being exact).
#pragma once

#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// x, out: [..., d] of rank 1-3 (rows = the leading dims, strided; last dim contiguous), f32,
// bf16 or f16 in any combination; out may be x (in place) but must not overlap it otherwise.
// weight: [d] f32/bf16/f16, contiguous.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void rms_norm_cpu(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void rms_norm_cuda(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);

// x: [n, d] f32/bf16/f16; residual: [n, d] f32 (updated in place); weight: [d]; out: [n, d]
// f32/bf16/f16. out may be x (in place) and must not overlap residual. Rows may be strided.
void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out);
void add_rms_norm_cpu(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                      const Tensor& out);
void add_rms_norm_cuda(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                       const Tensor& out);

struct RmsNormParams {
  RowsView x;                    // [rows, d]
  RowsView residual;             // [rows, d] f32; add_rms_norm only (data == nullptr for rms_norm)
  RowsView out;                  // [rows, d]
  const void* weight = nullptr;  // [d]
  DType weight_dtype = DType::kF32;
  float eps = 0.f;
  Device device;
};
// Check the arguments for both twins.
RmsNormParams rms_norm_params(const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
RmsNormParams add_rms_norm_params(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                  float eps, const Tensor& out);

}  // namespace longctx::ops
