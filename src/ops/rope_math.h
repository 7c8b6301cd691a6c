// The rope arithmetic both twins run, host and device alike: the frequency of pair i from a
// base, and dynamic NTK's base for a sequence length. Each step rounds to float32 where
// transformers' tensor op does (separately rounded, never fused: __f*_rn on the device, plain
// operators on the host, which builds with -ffp-contract=off in ISO C++ mode) and computes in
// double where a Python float does; pow is evaluated in double and rounded once, which is
// float32 pow to within the last ulp.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/host_device.h"

namespace longctx::ops {

// transformers' _compute_dynamic_ntk_parameters inputs: base is rope_theta (a Python float), dim
// the rotary dim. The base is recomputed for a sequence longer than max_position_embeddings.
struct DynamicNtk {
  double base = 10000.0;
  double factor = 1.0;
  int64_t max_position_embeddings = 0;
  int64_t dim = 0;
};

namespace rope_math {

LONGCTX_HD_INLINE float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LONGCTX_HD_INLINE float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LONGCTX_HD_INLINE float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
LONGCTX_HD_INLINE float i64_to_f32(int64_t v) {
#ifdef __CUDA_ARCH__
  return __ll2float_rn(v);
#else
  return static_cast<float>(v);
#endif
}

// float32 `base ** exponent` (the tensor pow of two float32 operands).
LONGCTX_HD_INLINE float pow_f32(float base, float exponent) {
  return static_cast<float>(::pow(static_cast<double>(base), static_cast<double>(exponent)));
}

// _compute_default_rope_parameters' frequency i of a rotary dim `dim` from a float32 base:
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
// the exponent 2i / dim a float32 division, the power rounded once, `1.0 / t` t.reciprocal().
LONGCTX_HD_INLINE float default_inv_freq(float base, int64_t i, int64_t dim) {
  const float exponent = div(i64_to_f32(2 * i), i64_to_f32(dim));
  return div(1.0f, pow_f32(base, exponent));
}

// _compute_dynamic_ntk_parameters' base for seq_len > max_position_embeddings. seq_len reaches
// it as a 0-dim int64 tensor (torch.max(position_ids) + 1), so every step is a float32 tensor op
// with the Python scalars rounded to float32 where they meet it:
//   base = base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim -
//   2))
// (factor - 1 and dim / (dim - 2) are Python floats, i.e. double, before they meet the tensor).
LONGCTX_HD_INLINE float dynamic_ntk_base(const DynamicNtk& p, int64_t seq_len) {
  const float scaled = mul(static_cast<float>(p.factor), i64_to_f32(seq_len));
  const float ratio = div(scaled, i64_to_f32(p.max_position_embeddings));
  const float grown = sub(ratio, static_cast<float>(p.factor - 1.0));
  const double exponent = double(p.dim) / double(p.dim - 2);
  // tensor ** Python float: std::pow(float, double) in double, rounded to float32.
  const float power = static_cast<float>(::pow(static_cast<double>(grown), exponent));
  return mul(static_cast<float>(p.base), power);
}

}  // namespace rope_math
}  // namespace longctx::ops
