#include "longctx/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "longctx/core/error.h"

namespace longctx {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kFP8E4M3:
      return 1;
  }
  LONGCTX_ASSERT(false, "bad dtype {}", int(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  std::string n(name);
  for (auto& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n.starts_with("torch.")) n = n.substr(6);
  if (n == "f32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "i32" || n == "int32") return DType::kI32;
  if (n == "i64" || n == "int64") return DType::kI64;
  if (n == "u8" || n == "uint8") return DType::kU8;
  if (n == "fp8_e4m3" || n == "float8_e4m3fn" || n == "f8_e4m3") return DType::kFP8E4M3;
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "unsupported dtype '{}' (supported: f32/float32, bf16/bfloat16, f16/float16, "
                "i32, i64, u8, fp8_e4m3/float8_e4m3fn)",
                name);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      bits = sign | (uint32_t(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00);   // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow (after rounding) -> inf
  if (absu < 0x38800000u) {                                 // subnormal or zero in f16
    if (absu < 0x33000000u) return uint16_t(sign);          // rounds to zero
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffff) | 0x800000;
    // value = mant * 2^(exp - 150) = m * 2^-24  =>  m = mant >> (126 - exp), rounded to even.
    uint32_t shift = 126 - exp;
    uint32_t shifted = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (shifted & 1))) ++shifted;
    return uint16_t(sign | shifted);
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - (uint32_t(127 - 15) << 23);
  return uint16_t(sign | (r >> 13));
}

}  // namespace longctx
