// Element load/store in fp32 for the CPU references (bf16, f16, f32 storage; FP8 KV codes).
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"
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

// Element i of a KV cache in `format` (FP8: the code's value, before its page's scale).
inline float load_kv_f32(const void* base, int64_t i, KvCacheFormat format, DType dtype) {
  if (format == KvCacheFormat::kFp8E4M3)
    return fp8e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
  return load_f32(base, i, dtype);
}

// The scale of (page, KV head) of an FP8 cache; 1 for the others.
inline float kv_scale(const float* scales, KvCacheFormat format, int64_t page, int64_t kv_head,
                      int64_t num_kv_heads) {
  return format == KvCacheFormat::kFp8E4M3 ? scales[page * num_kv_heads + kv_head] : 1.f;
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
