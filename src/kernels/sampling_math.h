// The arithmetic the CPU sampler (kernels/cpu/sampling_cpu.cpp) and the CUDA sampling kernel
// (kernels/cuda/sampling.cu) share, written once so both round every step alike and therefore
// pick the same token from the same logits and uniform:
//   - a token's probability mass is an integer, mass = round(exp(logit - max) * 2^kMassBits),
//     from an exp made of IEEE-rounded float operations only (no libm, no fused multiply-add),
//     so sums of masses are exact and independent of summation order (a GPU reduction and the
//     CPU loop agree to the bit, and atomics stay deterministic);
//   - tokens more than kMassWindow below the max get mass 0 (p < 1.3e-14 relative to the top
//     token): they can never be drawn, so the GPU needs to look only at the window.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/philox.h"
#include "kernels/sampling_kernel_params.h"

#if !defined(__CUDA_ARCH__)
#include <bit>
#include <cmath>
#endif

namespace longctx::kernels {

inline constexpr int kMassBits = 43;
inline constexpr float kMassWindow = 32.0f;

// Single IEEE operations, rounded to nearest; on the device they keep nvcc from contracting a
// multiply and an add into one FMA (the host compilers used here do not contract in ISO mode).
LONGCTX_HD_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LONGCTX_HD_INLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LONGCTX_HD_INLINE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LONGCTX_HD_INLINE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LONGCTX_HD_INLINE double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LONGCTX_HD_INLINE double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
LONGCTX_HD_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return uint32_t(__float_as_uint(f));
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
LONGCTX_HD_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

// exp(d) for d in [-kMassWindow, 0]: d = k ln2 + r with |r| <= ln2 / 2 (ln2 split so k * hi is
// exact), e^r by its degree-7 Taylor polynomial (truncation < 6e-9), times 2^k. Relative error
// a few float ulps, the same bits on host and device.
LONGCTX_HD_INLINE float sampling_exp(float d) {
  constexpr float kLog2e = 1.44269502f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 15 significant bits
  constexpr float kLn2Lo = 1.42860682e-06f;     // ln 2 - kLn2Hi
  constexpr float kC2 = 1.0f / 2.0f, kC3 = 1.0f / 6.0f, kC4 = 1.0f / 24.0f, kC5 = 1.0f / 120.0f,
                  kC6 = 1.0f / 720.0f, kC7 = 1.0f / 5040.0f;  // 1 / i!
#if defined(__CUDA_ARCH__)
  const float k = rintf(mul_rn(d, kLog2e));
#else
  const float k = std::rint(mul_rn(d, kLog2e));
#endif
  const float r = sub_rn(sub_rn(d, mul_rn(k, kLn2Hi)), mul_rn(k, kLn2Lo));
  float p = kC7;
  p = add_rn(mul_rn(p, r), kC6);
  p = add_rn(mul_rn(p, r), kC5);
  p = add_rn(mul_rn(p, r), kC4);
  p = add_rn(mul_rn(p, r), kC3);
  p = add_rn(mul_rn(p, r), kC2);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  const float scale = bits_float(uint32_t(int(k) + 127) << 23);  // 2^k, k in [-47, 0]
  return mul_rn(p, scale);
}

// The mass of a token whose (tempered, penalized) logit is `d` below the row's max: d = y - max
// as one float subtraction. -inf, NaN and anything below the window give 0.
LONGCTX_HD_INLINE uint64_t token_mass(float d) {
  if (!(d >= -kMassWindow)) return 0;
  const double scaled =
      double(sampling_exp(d < 0.0f ? d : 0.0f)) * double(uint64_t(1) << kMassBits);
#if defined(__CUDA_ARCH__)
  return __double2ull_rn(scaled);
#else
  return static_cast<uint64_t>(std::nearbyint(scaled));
#endif
}

// top_p keeps a token while the mass ranked above it is below top_p of the total.
LONGCTX_HD_INLINE bool top_p_keeps(uint64_t above, uint64_t total, double top_p) {
#if defined(__CUDA_ARCH__)
  return __ull2double_rn(above) < __dmul_rn(top_p, __ull2double_rn(total));
#else
  return static_cast<double>(above) < top_p * static_cast<double>(total);
#endif
}

// The draw picks the first token (in index order) whose cumulative mass exceeds this target.
// total > 0; the result is in [0, total).
LONGCTX_HD_INLINE uint64_t draw_target(double u, uint64_t total) {
#if defined(__CUDA_ARCH__)
  const uint64_t t = __double2ull_rz(__dmul_rn(u, __ull2double_rn(total)));
#else
  const uint64_t t = static_cast<uint64_t>(u * static_cast<double>(total));
#endif
  return t < total ? t : total - 1;
}

// An order-preserving uint32 of a float (larger float, larger key; -0 and +0 share a key, as
// they compare equal). NaN never reaches it.
LONGCTX_HD_INLINE uint32_t float_order_key(float f) {
  const uint32_t u = float_bits(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
LONGCTX_HD_INLINE float float_from_order_key(uint32_t k) {
  return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

}  // namespace longctx::kernels
