// Element load/store in fp32 for the CPU references (bf16, f16, f32 storage).
#pragma once

#include <cstdint>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu::decode_detail {

inline float load_f32(const void* base, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "attention reference: unsupported dtype {}",
                    dtype_name(dtype));
  }
}

inline void store_f32(void* base, int64_t i, float v, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = f32_to_f16(v);
      return;
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "attention reference: unsupported dtype {}",
                    dtype_name(dtype));
  }
}

}  // namespace longctx::kernels::cpu::decode_detail
