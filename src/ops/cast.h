// Element-wise dtype conversion (torch's .to(dtype)): f32, bf16 and f16 among themselves, round
// to nearest even; the same dtype copies.
#pragma once

#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// x, out: same shape, rank 1-3 (rows strided, last dim contiguous), f32/bf16/f16; out must not
// overlap x unless it is x with the same dtype.
void cast(const Tensor& x, const Tensor& out);
void cast_cpu(const Tensor& x, const Tensor& out);
void cast_cuda(const Tensor& x, const Tensor& out);

struct CastParams {
  RowsView x, out;  // each [rows, cols]
  Device device;
};
CastParams cast_params(const Tensor& x, const Tensor& out);

}  // namespace longctx::ops
