// FP8 block experts on the device (MoeArgs' layout: F8_E4M3 codes, one f32 scale per
// [block_out, block_in] block, gate and up blocked apart): where a weight row's scales are, the
// code conversions the MoE kernels share, and the host-side dispatch over the experts' weight
// type. Included by CUDA translation units only.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "ops/moe.h"

namespace longctx::ops::cuda_detail {

// The kernels' tag type for FP8 experts (one byte per weight).
using Fp8Weight = __nv_fp8_e4m3;
template <typename TW>
constexpr bool kIsFp8Weight = std::is_same_v<TW, Fp8Weight>;

// The block scales of one expert tensor ([E, rows, K] codes). gate_up: rows [0, split_row) are
// gate's (block rows [0, split_block)), the rest up's, whose block rows start at split_block;
// down: split_row = rows, so every row is in the first part.
struct MoeFp8Scales {
  const float* scales = nullptr;  // [E, block_rows, block_cols] f32; nullptr for float experts
  int64_t block_rows = 0, block_cols = 0;
  int64_t split_row = 0, split_block = 0;
  int64_t block_out = 1, block_in = 1;

  // Row `row` of expert e's scales: [block_cols] f32, column c / block_in for weight column c.
  __device__ __forceinline__ const float* row(int64_t e, int64_t r) const {
    const int64_t b = r < split_row ? r / block_out : split_block + (r - split_row) / block_out;
    return scales + (e * block_rows + b) * block_cols;
  }
};

// The scales of a.gate_up (split at inter) and of a.down; empty for float experts.
inline MoeFp8Scales moe_fp8_scales(const MoeArgs& a, const MoeShape& s, bool gate_up) {
  MoeFp8Scales f;
  const Tensor& t = gate_up ? a.gate_up_scales : a.down_scales;
  if (!t.defined()) return f;
  f.scales = t.data<float>();
  f.block_rows = t.size(1);
  f.block_cols = t.size(2);
  f.block_out = a.block_out;
  f.block_in = a.block_in;
  f.split_row = gate_up ? s.inter : s.hidden;
  f.split_block = (f.split_row + a.block_out - 1) / a.block_out;
  return f;
}

// 16 codes -> 16 floats, exactly (E4M3 -> f16 -> f32; one cvt per pair on sm_89+).
__device__ __forceinline__ void fp8x16_to_f32(const uint4& v, float (&f)[16]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 p = kernels::cuda::detail::fp8e4m3x2_to_float2(uint16_t(w[i] >> (16 * h)));
      f[4 * i + 2 * h] = p.x;
      f[4 * i + 2 * h + 1] = p.y;
    }
}

// One weight as f32: a float dtype converted; an FP8 code times its block's scale (srow: the
// row's scales, MoeFp8Scales::row), as the CPU twin dequantizes it.
template <typename TW>
__device__ __forceinline__ float weight_f32(const TW* w, int64_t i, const float* srow,
                                            int64_t block_in) {
  if constexpr (kIsFp8Weight<TW>) {
    const uint8_t code = reinterpret_cast<const uint8_t*>(w)[i];
    return kernels::cuda::detail::fp8e4m3_decode(code) * srow[i / block_in];
  } else {
    return kernels::cuda::detail::to_f32(w[i]);
  }
}

// 8 codes -> 8 elements of the 16-bit T (one 16-byte chunk), each code times `scale` in f32
// rounded to T: the weights the loader's dequantize to T gives, so the tensor-core grouped GEMM
// and the cuBLASLt path compute with the weights a model dequantized at load would hold.
template <typename T>
__device__ __forceinline__ uint4 fp8x8_to_elements(uint2 codes, float scale) {
  const uint32_t in[2] = {codes.x, codes.y};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 f = kernels::cuda::detail::fp8e4m3x2_to_float2(uint16_t(in[i] >> (16 * h)));
      out[2 * i + h] = kernels::cuda::detail::Mma<T>::pack(f.x * scale, f.y * scale);
    }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Calls f(TW{}) with TW the kernels' type of the experts' weights: Fp8Weight for F8_E4M3 codes,
// else the float dtype's CUDA type (visit_float).
template <typename F>
void visit_expert_weight(DType dtype, const char* what, F&& f) {
  if (dtype == DType::kFP8E4M3) return f(Fp8Weight{});
  kernels::cuda::detail::visit_float(dtype, what, f);
}

}  // namespace longctx::ops::cuda_detail
