// Element types and the host-side bf16/f16 conversions every CPU reference uses.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace longctx {

// kFP8E4M3: OCP FP8 E4M3 ("e4m3fn": bias 7, max 448, no infinities, NaN = 0x7f / 0xff).
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

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);  // round to nearest even

float fp8_e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to +-448 (what quantizers do after clamping); NaN -> 0x7f.
uint8_t f32_to_fp8_e4m3(float f);

}  // namespace longctx
