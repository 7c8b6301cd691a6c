#include <cstring>

#include "longctx/core/parallel.h"
#include "ops/gather_rows.h"
#include "ops/op_utils.h"

namespace longctx::ops {

GatherRowsParams gather_rows_params(const Tensor& x, const Tensor& rows, const Tensor& out) {
  constexpr const char* kOp = "gather_rows";
  check_contiguous(kOp, "rows", rows);
  check_dtype(kOp, "rows", rows, DType::kI32);
  check_rank(kOp, "rows", rows, 1);
  LONGCTX_CHECK(x.defined() && out.defined(), ErrorCode::kInvalidArgument,
                "gather_rows: x and out must be defined");
  check_rank(kOp, "x", x, 2);
  check_dtype(kOp, "out", out, x.dtype());
  check_shape(kOp, "out", out, {rows.numel(), x.size(1)});
  GatherRowsParams p;
  p.x = rows_view(kOp, "x", x);
  p.out = rows_view(kOp, "out", out);
  p.rows = static_cast<const int32_t*>(rows.data_ptr());
  p.num_rows = rows.numel();
  p.device = common_device(kOp, {&x, &rows, &out});
  return p;
}

void gather_rows_cpu(const Tensor& x, const Tensor& rows, const Tensor& out) {
  const GatherRowsParams p = gather_rows_params(x, rows, out);
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument,
                "gather_rows_cpu: tensors are on {}", p.device.str());
  for (int64_t i = 0; i < p.num_rows; ++i)
    LONGCTX_CHECK(p.rows[i] >= 0 && p.rows[i] < p.x.rows, ErrorCode::kOutOfRange,
                  "gather_rows: row index {} (at {}) is outside [0, {})", p.rows[i], i, p.x.rows);
  const size_t row_bytes = size_t(p.x.cols) * dtype_size(p.x.dtype);
  parallel_for(
      p.num_rows,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
          std::memcpy(row_ptr(p.out, i), row_ptr(p.x, p.rows[i]), row_bytes);
      },
      64);
}

}  // namespace longctx::ops
