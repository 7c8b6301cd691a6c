// Dynamic FP8 E4M3 quantization of activations for the W8A8 GEMMs (the quantized Linear's
// prefill path on Hopper): per token, per group of `group` consecutive inputs (128 for the FP8
// block format, DeepSeek-V3's and vLLM's per_token_group_quant_fp8; the whole row for
// compressed-tensors' dynamic per-token scales), scale = max(amax, kFp8ActEps) / 448 in fp32 and
// code = E4M3(x / scale), round to nearest even, saturating. One definition for the CUDA kernel
// (kernels/cuda/fp8_act_quant.cu) and the CPU reference (kernels/cpu/fp8_act_quant_cpu.cpp), so
// the two give the same codes and scales bit for bit: amax is an exact max (NaN ignored, as
// fmaxf), the scale and x / scale are single IEEE divisions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/host_device.h"

namespace longctx::kernels {

// The activation group of the FP8 block format's W8A8 GEMM (cuBLASLt's VEC128 scales).
inline constexpr int64_t kFp8ActGroup = 128;
// The smallest amax a scale is made from (vLLM's eps): an all-zero group gets a tiny finite
// scale and zero codes, never a division by zero.
inline constexpr float kFp8ActEps = 1e-10f;

// The group scale of amax (the largest |x| of the group). An Inf amax gives an Inf scale: the
// group's finite inputs become 0 and the Inf a NaN code, so the row's outputs are NaN, not
// finite garbage.
LONGCTX_HD_INLINE float fp8_act_scale(float amax) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(fmaxf(amax, kFp8ActEps), 448.f);
#else
  return std::fmax(amax, kFp8ActEps) / 448.f;
#endif
}

// x / scale, the value the code rounds (one IEEE division on both sides). A NaN result (a NaN
// input, or Inf / Inf) is the positive quiet NaN on both sides, so its code is 0x7f: the
// division's NaN differs in sign between the host (x86 keeps the operand's sign, and its default
// NaN is negative) and the GPU (a positive canonical NaN), and a NaN has no meaningful sign.
LONGCTX_HD_INLINE float fp8_act_scaled(float x, float scale) {
#if defined(__CUDA_ARCH__)
  const float v = __fdiv_rn(x, scale);
  return v != v ? __int_as_float(0x7fc00000) : v;
#else
  const float v = x / scale;
  return v != v ? std::numeric_limits<float>::quiet_NaN() : v;
#endif
}

}  // namespace longctx::kernels
