#include <cmath>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/op_utils.h"
#include "ops/rms_norm.h"

namespace longctx::ops {

void rms_norm_cpu(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  constexpr const char* kOp = "rms_norm";
  check_contiguous(kOp, "x", x);
  check_contiguous(kOp, "weight", weight);
  check_contiguous(kOp, "out", out);
  check_dtype(kOp, "x", x, DType::kF32);
  check_dtype(kOp, "out", out, DType::kF32);
  check_rank(kOp, "x", x, 2);
  check_float_weight(kOp, "weight", weight);
  const int64_t rows = x.size(0), d = x.size(1);
  check_shape(kOp, "weight", weight, {d});
  check_shape(kOp, "out", out, x.shape());
  LONGCTX_CHECK(d > 0, ErrorCode::kInvalidArgument, "rms_norm: empty rows");
  std::vector<float> w(d);
  convert_to_f32(weight.data_ptr(), weight.dtype(), d, w.data());
  const float* xs = x.data<float>();
  float* os = out.data<float>();
  parallel_for(
      rows,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* xr = xs + r * d;
          float* orow = os + r * d;
          // The sum of squares in double so the mean is as exact as torch's pairwise sum.
          double ss = 0;
          for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * double(xr[i]);
          const float variance = static_cast<float>(ss / double(d));
          const float inv_rms = 1.0f / std::sqrt(variance + eps);
          for (int64_t i = 0; i < d; ++i) orow[i] = w[i] * (xr[i] * inv_rms);
        }
      },
      16);
}

}  // namespace longctx::ops
