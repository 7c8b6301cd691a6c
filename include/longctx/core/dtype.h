// Element types and the host-side bf16/f16/fp8 conversions every CPU reference uses.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace longctx {

// kFP8E4M3: OCP FP8 E4M3 (bias 7, max 448, no infinities, NaN = 0x7f / 0xff): the FP8 KV
// cache's element, always paired with fp32 scales (kv/paged_kv_pool.h).
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kFP8E4M3 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "bf16", ...
// Parses both our names and Hugging Face / safetensors names ("bfloat16", "BF16", "F32", ...).
// Throws Error(kUnsupported) naming the string when unknown.
DType parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(uint32_t(v) << 16); }

// Round to nearest even, NaN kept quiet (matches torch's float -> bfloat16).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// FP8 E4M3 (OCP): every code decodes exactly to fp32; NaN codes give a quiet NaN of their sign.
inline float fp8e4m3_to_f32(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;  // exponent (4 bits) and mantissa (3 bits)
  if (em == 0x7fu) return std::bit_cast<float>(sign | 0x7fc00000u);
  // Normal: fp32 exponent = e - 7 + 127, mantissa bits m << 20, so (em << 20) + (120 << 23).
  if (em >= 8u) return std::bit_cast<float>(sign | ((em << 20) + (120u << 23)));
  const float sub = static_cast<float>(em) * 0x1p-9f;  // subnormal: m * 2^-9
  return sign != 0 ? -sub : sub;
}

// fp32 -> FP8 E4M3, round to nearest even, saturating: |x| >= 448 (infinities too) gives +-448,
// NaN gives 0x7f / 0xff (as CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE).
inline uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (a >= 0x43e00000u) return sign | 0x7eu;  // >= 448 (or inf): the largest finite
  if (a < 0x3c800000u) {                      // < 2^-6: subnormal, a multiple of 2^-9
    if (a < 0x3a000000u) return sign;         // < 2^-11: under a quarter code, zero
    // a = mant * 2^(exp - 150) and the code is a / 2^-9 = mant >> (141 - exp), rounded to even;
    // 8 is the smallest normal's code, so the carry needs no special case.
    const uint32_t exp = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141 - exp;  // 18 .. 25 here
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  // Normal: keep 3 mantissa bits, round to nearest even (a carry bumps the exponent; nothing
  // below 448 rounds past it), then rebias 127 -> 7.
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  return static_cast<uint8_t>(sign | ((r >> 20) - (120u << 3)));
}

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);  // round to nearest even


}  // namespace longctx
