// Raw-pointer descriptions of op arguments, shared by the CPU twins (<op>_cpu.cpp) and the CUDA
// kernels (<op>_cuda.cu). CUDA-free and Tensor-free so both compilers see the same structs; the
// Tensor-level checks that build them live in the CPU twin files (one set of rules for both).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "longctx/core/device.h"
#include "longctx/core/dtype.h"

namespace longctx::ops {

// A tensor of rank 1-3 whose last dim is contiguous (stride 1), seen as `rows` rows of `cols`
// elements: rank 1 [cols] is one row, rank 2 [a, cols] is a rows, rank 3 [a, b, cols] is a * b
// rows with row r at outer index r / b, inner index r % b. The other strides are arbitrary, so
// q/k/v views of a fused qkv output and the gate/up halves of one [n, 2I] tensor are RowsViews.
struct RowsView {
  void* data = nullptr;  // element (0, .., 0)
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  int64_t inner = 1;         // rows per outer index (the middle dim at rank 3, else 1)
  int64_t stride_outer = 0;  // elements between outer indices
  int64_t stride_inner = 0;  // elements between rows of one outer index (rank 3)

  // Element offset of row r from data.
  LONGCTX_HD int64_t row_offset(int64_t r) const {
    return inner == 1 ? r * stride_outer : (r / inner) * stride_outer + (r % inner) * stride_inner;
  }
};

}  // namespace longctx::ops
