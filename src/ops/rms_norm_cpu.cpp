#include <cmath>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/op_utils.h"
#include "ops/rms_norm.h"

namespace longctx::ops {

namespace {

void check_weight(const char* op, const Tensor& weight, int64_t d) {
  check_contiguous(op, "weight", weight);
  check_float_weight(op, "weight", weight);
  check_shape(op, "weight", weight, {d});
  LONGCTX_CHECK(d > 0, ErrorCode::kInvalidArgument, "{}: empty rows", op);
}

// One row: out = w * (r * inv_rms), the mean of squares summed in double.
void normalize_row(const float* r, const float* w, int64_t d, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += double(r[i]) * double(r[i]);
  const float variance = static_cast<float>(ss / double(d));
  const float inv_rms = 1.0f / std::sqrt(variance + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = w[i] * (r[i] * inv_rms);
}

void run_rms_norm_cpu(const RmsNormParams& p) {
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument, "rms_norm_cpu: tensors are on {}",
                p.device.str());
  const int64_t d = p.x.cols;
  std::vector<float> w(d);
  convert_to_f32(p.weight, p.weight_dtype, d, w.data());
  parallel_for(
      p.x.rows,
      [&](int64_t b, int64_t e) {
        std::vector<float> xbuf(d), obuf(d);
        for (int64_t r = b; r < e; ++r) {
          const float* xr = load_row_f32(p.x, r, xbuf.data());
          if (p.residual.data) {
            float* res = reinterpret_cast<float*>(row_ptr(p.residual, r));
            for (int64_t i = 0; i < d; ++i) res[i] += xr[i];
            xr = res;
          }
          normalize_row(xr, w.data(), d, p.eps, obuf.data());
          store_row_f32(p.out, r, obuf.data());
        }
      },
      16);
}

}  // namespace

RmsNormParams rms_norm_params(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  constexpr const char* kOp = "rms_norm";
  check_float_activation(kOp, "x", x);
  check_float_activation(kOp, "out", out);
  check_shape(kOp, "out", out, x.shape());
  RmsNormParams p;
  p.x = rows_view(kOp, "x", x);
  p.out = rows_view(kOp, "out", out);
  check_weight(kOp, weight, p.x.cols);
  p.weight = weight.data_ptr();
  p.weight_dtype = weight.dtype();
  p.eps = eps;
  p.device = common_device(kOp, {&x, &weight, &out});
  return p;
}

RmsNormParams add_rms_norm_params(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                  float eps, const Tensor& out) {
  constexpr const char* kOp = "add_rms_norm";
  check_float_activation(kOp, "x", x);
  check_float_activation(kOp, "out", out);
  check_rank(kOp, "x", x, 2);
  check_dtype(kOp, "residual", residual, DType::kF32);
  check_shape(kOp, "residual", residual, x.shape());
  check_shape(kOp, "out", out, x.shape());
  LONGCTX_CHECK(out.data_ptr() != residual.data_ptr() && x.data_ptr() != residual.data_ptr(),
                ErrorCode::kInvalidArgument, "add_rms_norm: residual must not alias x or out");
  RmsNormParams p;
  p.x = rows_view(kOp, "x", x);
  p.residual = rows_view(kOp, "residual", residual);
  p.out = rows_view(kOp, "out", out);
  check_weight(kOp, weight, p.x.cols);
  p.weight = weight.data_ptr();
  p.weight_dtype = weight.dtype();
  p.eps = eps;
  p.device = common_device(kOp, {&x, &residual, &weight, &out});
  return p;
}

void rms_norm_cpu(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  run_rms_norm_cpu(rms_norm_params(x, weight, eps, out));
}

void add_rms_norm_cpu(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                      const Tensor& out) {
  run_rms_norm_cpu(add_rms_norm_params(x, residual, weight, eps, out));
}

}  // namespace longctx::ops
