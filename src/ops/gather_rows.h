// Row gather: out[i, :] = x[rows[i], :], e.g. the hidden states of the tokens that need logits.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// x: [n, d] of any dtype (rows strided, last dim contiguous); rows: [r] i32 (contiguous); out:
// [r, d] of x's dtype (rows strided), must not overlap x. All on one device.
// CPU: throws Error(kOutOfRange) naming the first index outside [0, n).
// CUDA: the indices are device memory and are not checked (the caller validates them on the
// host); the kernel writes a row of zeros for an index outside [0, n) so it can never fault.
void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out);
void gather_rows_cpu(const Tensor& x, const Tensor& rows, const Tensor& out);
void gather_rows_cuda(const Tensor& x, const Tensor& rows, const Tensor& out);

struct GatherRowsParams {
  RowsView x;                     // [n, d]
  const int32_t* rows = nullptr;  // [num_rows]
  int64_t num_rows = 0;
  RowsView out;  // [num_rows, d]
  Device device;
};
GatherRowsParams gather_rows_params(const Tensor& x, const Tensor& rows, const Tensor& out);

}  // namespace longctx::ops
