// CPU linear: the output is cut into tiles of kCols output features x kTokens tokens. A task
// converts its kCols weight rows to f32 once, transposed to [in][kCols], so the inner loop is a
// fixed-width multiply-add over kCols accumulators held in vector registers (no float reduction
// to reassociate). Each output element is a plain sequential fp32 sum over `in`.
#include <algorithm>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/linear.h"
#include "ops/op_utils.h"
#include "ops/simd.h"

namespace longctx::ops {

namespace {

constexpr int64_t kCols = 32;     // accumulators per token: 8 SSE registers
constexpr int64_t kTokens = 128;  // tokens sharing one converted weight tile

// One tile: out[t, c0 : c0 + cols] for t in [t0, t1). x rows are ldx floats apart, out rows ldo.
void linear_tile(const float* x, int64_t ldx, const Tensor& weight, const float* bias, float* out,
                 int64_t ldo, int64_t in, int64_t out_features, int64_t c0, int64_t t0, int64_t t1,
                 std::vector<float>& wt, std::vector<float>& row) {
  const int64_t cols = std::min(kCols, out_features - c0);
  wt.assign(in * kCols, 0.0f);  // [in][kCols], zero-padded past `cols`
  row.resize(in);
  for (int64_t j = 0; j < cols; ++j) {
    convert_to_f32(element_ptr(weight, (c0 + j) * in), weight.dtype(), in, row.data());
    for (int64_t k = 0; k < in; ++k) wt[k * kCols + j] = row[k];
  }
  float init[kCols] = {};
  for (int64_t j = 0; j < cols; ++j) init[j] = bias ? bias[c0 + j] : 0.0f;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * ldx;
    f32x4 acc[kCols / 4] = {};
    for (int64_t k = 0; k < in; ++k) {
      const float xv = xt[k];
      const float* wk = wt.data() + k * kCols;
#pragma GCC unroll 8
      for (int64_t v = 0; v < kCols / 4; ++v) acc[v] += xv * load4(wk + 4 * v);
    }
    float sum[kCols];
    for (int64_t v = 0; v < kCols / 4; ++v) store4(sum + 4 * v, acc[v]);
    float* ot = out + t * ldo + c0;
    for (int64_t j = 0; j < cols; ++j) ot[j] = sum[j] + init[j];
  }
}

}  // namespace

void linear_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  constexpr const char* kOp = "linear";
  check_contiguous(kOp, "weight", weight);
  check_dtype(kOp, "x", x, DType::kF32);
  check_dtype(kOp, "out", out, DType::kF32);
  check_rank(kOp, "x", x, 2);
  check_rank(kOp, "out", out, 2);
  const RowsView xv = rows_view(kOp, "x", x), ov = rows_view(kOp, "out", out);
  check_rank(kOp, "weight", weight, 2);
  check_float_weight(kOp, "weight", weight);
  const int64_t n = x.size(0), in = x.size(1), out_features = weight.size(0);
  LONGCTX_CHECK(weight.size(1) == in, ErrorCode::kInvalidArgument,
                "linear: x {} does not match weight {} (in_features {})", x.str(), weight.str(),
                weight.size(1));
  check_shape(kOp, "out", out, {n, out_features});
  LONGCTX_CHECK(common_device(kOp, {&x, &weight, &bias, &out}).is_cpu(),
                ErrorCode::kInvalidArgument, "linear_cpu: tensors are on {}", x.device().str());
  // Rows of one tensor: a size-1 dim may carry any stride, so use the width then.
  const int64_t ldx = n > 1 ? xv.stride_outer : in, ldo = n > 1 ? ov.stride_outer : out_features;
  LONGCTX_CHECK(ldx >= in && ldo >= out_features, ErrorCode::kInvalidArgument,
                "linear: row strides of x {} ({}) and out {} ({}) must be at least their widths",
                x.str(), ldx, out.str(), ldo);
  std::vector<float> b;
  if (bias.defined()) {
    check_contiguous(kOp, "bias", bias);
    check_float_weight(kOp, "bias", bias);
    check_shape(kOp, "bias", bias, {out_features});
    b.resize(out_features);
    convert_to_f32(bias.data_ptr(), bias.dtype(), out_features, b.data());
  }
  if (n == 0 || out_features == 0) return;
  const float* xs = x.data<float>();
  float* os = out.data<float>();
  const int64_t col_tiles = (out_features + kCols - 1) / kCols;
  const int64_t token_tiles = (n + kTokens - 1) / kTokens;
  parallel_for(col_tiles * token_tiles, [&](int64_t begin, int64_t end) {
    std::vector<float> wt, row;
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t c0 = (tile % col_tiles) * kCols;
      const int64_t t0 = (tile / col_tiles) * kTokens;
      linear_tile(xs, ldx, weight, b.empty() ? nullptr : b.data(), os, ldo, in, out_features, c0,
                  t0, std::min(n, t0 + kTokens), wt, row);
    }
  });
}

}  // namespace longctx::ops
