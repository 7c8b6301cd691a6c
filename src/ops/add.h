// Element-wise sum in fp32 (rounded once to out's dtype): the residual connection.
#pragma once

#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// a, b, out: same shape, rank 1-3 (rows strided, last dim contiguous), f32/bf16/f16 in any
// combination. out may be a or b (in place) but must not overlap them otherwise.
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void add_cpu(const Tensor& a, const Tensor& b, const Tensor& out);
void add_cuda(const Tensor& a, const Tensor& b, const Tensor& out);

struct AddParams {
  RowsView a, b, out;  // each [rows, cols]
  Device device;
};
AddParams add_params(const Tensor& a, const Tensor& b, const Tensor& out);

}  // namespace longctx::ops
