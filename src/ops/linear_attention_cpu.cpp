#include "kernels/cpu/linear_attention_cpu.h"

#include <cmath>
#include <vector>

#include "ops/linear_attention.h"
#include "ops/linear_attention_args.h"

namespace longctx::ops {

void gated_delta_rule_cpu(const GatedDeltaRuleArgs& a) {
  DeltaRuleCall call = check_gated_delta_rule(a, Device::cpu());
  call.params.qo_indptr = a.qo_indptr.data();
  call.params.states = call.states.data();
  if (a.form == DeltaRuleForm::kRecurrent)
    kernels::cpu::gated_delta_rule_recurrent(call.params);
  else
    kernels::cpu::gated_delta_rule_chunked(call.params);
}

void causal_conv1d_cpu(const CausalConv1dArgs& a) {
  ConvCall call = check_causal_conv1d(a, Device::cpu());
  call.params.qo_indptr = a.qo_indptr.data();
  call.params.states = call.states.data();
  kernels::cpu::causal_conv1d(call.params);
}

void delta_rule_gates_cpu(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                          const Tensor& dt_bias, const Tensor& g, const Tensor& beta) {
  const DeltaRuleGatesParams p =
      check_delta_rule_gates(b, a, a_neg, dt_bias, g, beta, Device::cpu());
  const int64_t hv = p.b.cols;
  for (int64_t r = 0; r < p.b.rows; ++r) {
    const float* br = static_cast<const float*>(p.b.data) + p.b.row_offset(r);
    const float* ar = static_cast<const float*>(p.a.data) + p.a.row_offset(r);
    for (int64_t h = 0; h < hv; ++h) {
      p.beta[r * hv + h] = 1.f / (1.f + std::exp(-br[h]));
      // softplus as torch computes it: x past its threshold 20 is returned as is
      const float x = ar[h] + p.dt_bias[h];
      const float sp = x > 20.f ? x : std::log1p(std::exp(x));
      p.g[r * hv + h] = p.a_neg[h] * sp;
    }
  }
}

void rms_norm_gated_cpu(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                        const Tensor& out) {
  const RmsNormGatedParams p = check_rms_norm_gated(x, z, weight, eps, out, Device::cpu());
  const int64_t d = p.x.cols;
  for (int64_t r = 0; r < p.x.rows; ++r) {
    const float* xr = static_cast<const float*>(p.x.data) + p.x.row_offset(r);
    const float* zr = static_cast<const float*>(p.z.data) + p.z.row_offset(r);
    float* o = static_cast<float*>(p.out.data) + p.out.row_offset(r);
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + p.eps);
    for (int64_t i = 0; i < d; ++i)
      o[i] = p.weight[i] * (xr[i] * inv) * (zr[i] / (1.f + std::exp(-zr[i])));
  }
}

}  // namespace longctx::ops
