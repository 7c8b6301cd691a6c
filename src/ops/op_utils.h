// Helpers shared by the CPU op references: argument checks with clear messages, the
// bf16/f16/f32 <-> f32 row conversions, and RowsView (op_params.h) construction and access.
// Included from .cpp files only (the CUDA twins get their arguments as op_params structs).
#pragma once

#include <cstdint>
#include <string_view>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "ops/op_params.h"

namespace longctx::ops {

// True for the dtypes weights may come in (checkpoints are bf16, f16 or f32).
inline bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// Converts n elements of a float dtype at src to f32.
inline void convert_to_f32(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "cannot read {} as a float", dtype_name(dtype));
  }
}

// Converts n f32 values to a float dtype at dst (round to nearest even, as torch's .to()).
inline void convert_from_f32(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "cannot write {} from a float", dtype_name(dtype));
  }
}

// Pointer to element `index` (flat, contiguous) of a tensor of any dtype.
inline const void* element_ptr(const Tensor& t, int64_t index) {
  return static_cast<const char*>(t.data_ptr()) + index * int64_t(t.element_size());
}

// Argument checks: the op name leads every message so a failing call is easy to find.
inline void check_contiguous(std::string_view op, std::string_view arg, const Tensor& t) {
  LONGCTX_CHECK(t.defined(), ErrorCode::kInvalidArgument, "{}: {} is undefined", op, arg);
  LONGCTX_CHECK(t.is_contiguous(), ErrorCode::kInvalidArgument, "{}: {} {} must be contiguous", op,
                arg, t.str());
}

inline void check_dtype(std::string_view op, std::string_view arg, const Tensor& t, DType dtype) {
  LONGCTX_CHECK(t.dtype() == dtype, ErrorCode::kInvalidArgument, "{}: {} must be {}, got {}", op,
                arg, dtype_name(dtype), t.str());
}

inline void check_float_weight(std::string_view op, std::string_view arg, const Tensor& t) {
  LONGCTX_CHECK(is_float_dtype(t.dtype()), ErrorCode::kInvalidArgument,
                "{}: {} must be f32, bf16 or f16, got {}", op, arg, t.str());
}

// Activations (x, out, gate, ...) are f32, bf16 or f16 like weights.
inline void check_float_activation(std::string_view op, std::string_view arg, const Tensor& t) {
  LONGCTX_CHECK(t.defined(), ErrorCode::kInvalidArgument, "{}: {} is undefined", op, arg);
  LONGCTX_CHECK(is_float_dtype(t.dtype()), ErrorCode::kInvalidArgument,
                "{}: {} must be f32, bf16 or f16, got {}", op, arg, t.str());
}

inline void check_shape(std::string_view op, std::string_view arg, const Tensor& t,
                        const Shape& shape) {
  LONGCTX_CHECK(t.shape() == shape, ErrorCode::kInvalidArgument,
                "{}: {} must have shape {}, got {}", op, arg, shape_to_string(shape), t.str());
}

inline void check_rank(std::string_view op, std::string_view arg, const Tensor& t, int64_t rank) {
  LONGCTX_CHECK(t.rank() == rank, ErrorCode::kInvalidArgument, "{}: {} must have rank {}, got {}",
                op, arg, rank, t.str());
}

// All tensors of one op call live on one device; returns it.
inline Device common_device(std::string_view op, std::initializer_list<const Tensor*> ts) {
  Device d = (*ts.begin())->device();
  for (const Tensor* t : ts)
    LONGCTX_CHECK(!t->defined() || t->device() == d, ErrorCode::kInvalidArgument,
                  "{}: tensors on different devices ({} and {})", op, d.str(), t->device().str());
  return d;
}

// The RowsView of t: rank 1-3, last dim contiguous, other strides arbitrary.
inline RowsView rows_view(std::string_view op, std::string_view arg, const Tensor& t) {
  LONGCTX_CHECK(t.defined(), ErrorCode::kInvalidArgument, "{}: {} is undefined", op, arg);
  LONGCTX_CHECK(t.rank() >= 1 && t.rank() <= 3, ErrorCode::kInvalidArgument,
                "{}: {} must have rank 1, 2 or 3, got {}", op, arg, t.str());
  const Shape& sh = t.shape();
  const Shape& st = t.strides();
  const int64_t r = t.rank();
  LONGCTX_CHECK(st[r - 1] == 1 || sh[r - 1] <= 1, ErrorCode::kInvalidArgument,
                "{}: {} {} must have a contiguous last dim (its stride is {})", op, arg, t.str(),
                st[r - 1]);
  for (int64_t i = 0; i + 1 < r; ++i)
    LONGCTX_CHECK(st[i] >= 0, ErrorCode::kInvalidArgument, "{}: {} {} has a negative stride", op,
                  arg, t.str());
  RowsView v;
  v.data = t.data_ptr();
  v.dtype = t.dtype();
  v.cols = sh[r - 1];
  if (r == 1) {
    v.rows = 1;
  } else if (r == 2) {
    v.rows = sh[0];
    v.stride_outer = st[0];
  } else {
    v.rows = sh[0] * sh[1];
    v.inner = sh[1] == 0 ? 1 : sh[1];
    v.stride_outer = st[0];
    v.stride_inner = st[1];
    if (v.inner == 1) v.stride_inner = 0;
  }
  return v;
}

// Address of row r of a RowsView.
inline char* row_ptr(const RowsView& v, int64_t r) {
  return static_cast<char*>(v.data) + v.row_offset(r) * int64_t(dtype_size(v.dtype));
}

// Row r of a float RowsView as f32: the row itself when it is f32, else converted into buf
// (which holds v.cols floats).
inline const float* load_row_f32(const RowsView& v, int64_t r, float* buf) {
  if (v.dtype == DType::kF32) return reinterpret_cast<const float*>(row_ptr(v, r));
  convert_to_f32(row_ptr(v, r), v.dtype, v.cols, buf);
  return buf;
}

// Writes v.cols f32 values into row r, rounded to the view's dtype.
inline void store_row_f32(const RowsView& v, int64_t r, const float* vals) {
  convert_from_f32(vals, v.cols, v.dtype, row_ptr(v, r));
}

}  // namespace longctx::ops
