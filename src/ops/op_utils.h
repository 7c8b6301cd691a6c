// Helpers shared by the CPU op references: argument checks with clear messages and the
// bf16/f16/f32 -> f32 row conversion every op that reads checkpoint weights needs.
#pragma once

#include <cstdint>
#include <string_view>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"

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

}  // namespace longctx::ops
