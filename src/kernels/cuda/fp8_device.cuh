// FP8 E4M3 (OCP) on the device: the encoder and decoder of the KV store, bit-identical to the host
// conversions of longctx/core/dtype.h (the CPU references'), and the paired decode the attention
// kernels' K/V loaders use. The bit-level encoder is portable (sm_80 has no FP8 conversion
// instruction) and is what makes the CUDA KV store's codes equal the CPU reference's; the readers
// go through cuda_fp8.h, which is one cvt per two codes on sm_89+ (emulated below that).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/mma_device.cuh"

namespace longctx::kernels::cuda::detail {

// Exact decode of one code (NaN codes give a quiet NaN of their sign), as fp8e4m3_to_f32.
__device__ __forceinline__ float fp8e4m3_decode(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;
  if (em == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
  if (em >= 8u) return __uint_as_float(sign | ((em << 20) + (120u << 23)));
  const float sub = float(em) * 0x1p-9f;
  return sign != 0 ? -sub : sub;
}

// fp32 -> E4M3, round to nearest even, saturating to +-448 (infinities too), NaN -> sign | 0x7f:
// the same bit operations as f32_to_fp8e4m3.
__device__ __forceinline__ uint8_t fp8e4m3_encode(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;
  if (a >= 0x43e00000u) return sign | 0x7eu;
  if (a < 0x3c800000u) {
    if (a < 0x3a000000u) return sign;
    const uint32_t exp = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141 - exp;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint8_t(sign | q);
  }
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  return uint8_t(sign | ((r >> 20) - (120u << 3)));
}

// Two codes (the low and high byte of `pair`) -> two floats, exactly (every E4M3 value is an f16
// value: 3 mantissa bits, exponents 2^-9 .. 2^8).
__device__ __forceinline__ float2 fp8e4m3x2_to_float2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// 16 codes -> 16 elements of T (two 16-byte chunks: elements 0..7 in lo, 8..15 in hi), times
// `scale` (a page scale: a power of two, so the product is exact in bf16). The attention kernels'
// converting tile loaders: per code pair one cvt to f16x2, two to f32, two multiplies, one pack.
template <typename T>
__device__ __forceinline__ void fp8x16_to_elements(uint4 codes, float scale, uint4& lo, uint4& hi) {
  const uint32_t in[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 f = fp8e4m3x2_to_float2(uint16_t(in[i] >> (16 * half)));
      out[2 * i + half] = Mma<T>::pack(f.x * scale, f.y * scale);
    }
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace longctx::kernels::cuda::detail
