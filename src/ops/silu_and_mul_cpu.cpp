#include <cmath>

#include "longctx/core/parallel.h"
#include "ops/op_utils.h"
#include "ops/silu_and_mul.h"

namespace longctx::ops {

void silu_and_mul_cpu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  constexpr const char* kOp = "silu_and_mul";
  for (auto [name, t] : {std::pair{"gate", &gate}, {"up", &up}, {"out", &out}}) {
    check_contiguous(kOp, name, *t);
    check_dtype(kOp, name, *t, DType::kF32);
  }
  check_shape(kOp, "up", up, gate.shape());
  check_shape(kOp, "out", out, gate.shape());
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  parallel_for(
      gate.numel(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      },
      1 << 14);
}

}  // namespace longctx::ops
