#include <cmath>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/op_utils.h"
#include "ops/silu_and_mul.h"

namespace longctx::ops {

SiluAndMulParams silu_and_mul_params(const Tensor& gate, const Tensor& up, const Tensor& out) {
  constexpr const char* kOp = "silu_and_mul";
  for (auto [name, t] : {std::pair{"gate", &gate}, {"up", &up}, {"out", &out}})
    check_float_activation(kOp, name, *t);
  check_shape(kOp, "up", up, gate.shape());
  check_shape(kOp, "out", out, gate.shape());
  SiluAndMulParams p;
  p.gate = rows_view(kOp, "gate", gate);
  p.up = rows_view(kOp, "up", up);
  p.out = rows_view(kOp, "out", out);
  p.device = common_device(kOp, {&gate, &up, &out});
  return p;
}

namespace {

float gelu_tanh(float g) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

void gated_act_cpu(const SiluAndMulParams& p) {
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument,
                "silu_and_mul_cpu: tensors are on {}", p.device.str());
  const int64_t cols = p.gate.cols;
  parallel_for(
      p.gate.rows,
      [&](int64_t b, int64_t e) {
        std::vector<float> gb(cols), ub(cols), ob(cols);
        for (int64_t r = b; r < e; ++r) {
          const float* g = load_row_f32(p.gate, r, gb.data());
          const float* u = load_row_f32(p.up, r, ub.data());
          if (p.act == GatedAct::kSilu)
            for (int64_t i = 0; i < cols; ++i) ob[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
          else if (p.act == GatedAct::kGeluTanh)
            for (int64_t i = 0; i < cols; ++i) ob[i] = gelu_tanh(g[i]) * u[i];
          else
            for (int64_t i = 0; i < cols; ++i) ob[i] = u[i] / (1.0f + std::exp(-g[i]));
          store_row_f32(p.out, r, ob.data());
        }
      },
      std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(cols, 1)));
}

}  // namespace

void silu_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  gated_act_cpu(silu_and_mul_params(gate, up, out));
}

void gelu_tanh_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  SiluAndMulParams p = silu_and_mul_params(gate, up, out);
  p.act = GatedAct::kGeluTanh;
  gated_act_cpu(p);
}

void sigmoid_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  SiluAndMulParams p = silu_and_mul_params(gate, up, out);
  p.act = GatedAct::kSigmoid;
  gated_act_cpu(p);
}

}  // namespace longctx::ops
