// The checked raw form of the linear-attention ops' arguments (ops/linear_attention.h), one set
// of rules for the CPU twins (linear_attention_cpu.cpp) and the CUDA twins
// (linear_attention_cuda.cu). The CPU reference takes f32 activations only; the CUDA kernels
// also bf16 and f16 (one dtype per call for the activations, converted in registers), with g,
// beta, weights and states f32 on both.
#pragma once

#include <vector>

#include "kernels/linear_attention_params.h"
#include "longctx/core/tensor.h"
#include "ops/linear_attention.h"
#include "ops/op_params.h"

namespace longctx::ops {

// `params` with every field set but the two arrays, which the twin places where its kernels read
// them (qo_indptr: the caller's host span; states: `states`, one pointer per sequence).
struct DeltaRuleCall {
  kernels::GatedDeltaRuleParams params;
  std::vector<float*> states;
};
DeltaRuleCall check_gated_delta_rule(const GatedDeltaRuleArgs& a, Device device);

struct ConvCall {
  kernels::CausalConv1dParams params;
  std::vector<float*> states;
};
ConvCall check_causal_conv1d(const CausalConv1dArgs& a, Device device);

// delta_rule_gates over [rows, heads]: b, a activations (rows strided), the rest f32.
struct DeltaRuleGatesParams {
  RowsView b, a;
  const float* a_neg = nullptr;    // [heads]
  const float* dt_bias = nullptr;  // [heads]
  float* g = nullptr;              // [rows, heads] contiguous
  float* beta = nullptr;           // [rows, heads] contiguous
};
DeltaRuleGatesParams check_delta_rule_gates(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                                            const Tensor& dt_bias, const Tensor& g,
                                            const Tensor& beta, Device device);

// rms_norm_gated over [rows, d]: x, z, out activations of one dtype (out may be x), weight f32.
struct RmsNormGatedParams {
  RowsView x, z, out;
  const float* weight = nullptr;  // [d]
  float eps = 0.f;
};
RmsNormGatedParams check_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight,
                                        float eps, const Tensor& out, Device device);

}  // namespace longctx::ops
