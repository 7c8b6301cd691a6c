#include "longctx/core/parallel.h"
#include "ops/add.h"
#include "ops/op_utils.h"

namespace longctx::ops {

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* kOp = "add";
  for (auto [name, t] : {std::pair{"a", &a}, {"b", &b}, {"out", &out}}) {
    check_contiguous(kOp, name, *t);
    check_dtype(kOp, name, *t, DType::kF32);
  }
  check_shape(kOp, "b", b, a.shape());
  check_shape(kOp, "out", out, a.shape());
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* o = out.data<float>();
  parallel_for(
      a.numel(),
      [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) o[i] = x[i] + y[i];
      },
      1 << 15);
}

}  // namespace longctx::ops
