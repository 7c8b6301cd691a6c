#include <vector>

#include "longctx/core/parallel.h"
#include "ops/add.h"
#include "ops/op_utils.h"

namespace longctx::ops {

AddParams add_params(const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* kOp = "add";
  for (auto [name, t] : {std::pair{"a", &a}, {"b", &b}, {"out", &out}})
    check_float_activation(kOp, name, *t);
  check_shape(kOp, "b", b, a.shape());
  check_shape(kOp, "out", out, a.shape());
  AddParams p;
  p.a = rows_view(kOp, "a", a);
  p.b = rows_view(kOp, "b", b);
  p.out = rows_view(kOp, "out", out);
  p.device = common_device(kOp, {&a, &b, &out});
  return p;
}

void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out) {
  const AddParams p = add_params(a, b, out);
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument, "add_cpu: tensors are on {}",
                p.device.str());
  const int64_t cols = p.a.cols;
  parallel_for(
      p.a.rows,
      [&](int64_t begin, int64_t end) {
        std::vector<float> ab(cols), bb(cols), ob(cols);
        for (int64_t r = begin; r < end; ++r) {
          const float* x = load_row_f32(p.a, r, ab.data());
          const float* y = load_row_f32(p.b, r, bb.data());
          for (int64_t i = 0; i < cols; ++i) ob[i] = x[i] + y[i];
          store_row_f32(p.out, r, ob.data());
        }
      },
      std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(cols, 1)));
}

}  // namespace longctx::ops
