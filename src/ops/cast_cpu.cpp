#include <vector>

#include "longctx/core/parallel.h"
#include "ops/cast.h"
#include "ops/op_utils.h"

namespace longctx::ops {

CastParams cast_params(const Tensor& x, const Tensor& out) {
  constexpr const char* kOp = "cast";
  check_float_activation(kOp, "x", x);
  check_float_activation(kOp, "out", out);
  check_shape(kOp, "out", out, x.shape());
  CastParams p;
  p.x = rows_view(kOp, "x", x);
  p.out = rows_view(kOp, "out", out);
  p.device = common_device(kOp, {&x, &out});
  return p;
}

void cast_cpu(const Tensor& x, const Tensor& out) {
  const CastParams p = cast_params(x, out);
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument, "cast_cpu: tensors are on {}",
                p.device.str());
  const int64_t cols = p.x.cols;
  parallel_for(
      p.x.rows,
      [&](int64_t b, int64_t e) {
        std::vector<float> buf(cols);
        for (int64_t r = b; r < e; ++r) store_row_f32(p.out, r, load_row_f32(p.x, r, buf.data()));
      },
      std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(cols, 1)));
}

}  // namespace longctx::ops
