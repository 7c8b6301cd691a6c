// CUDA W8A8 activation quantization: one CTA of 256 threads per row. A thread takes 4
// consecutive inputs at a time (4 codes: one 32-bit store). Group mode (group < in): warp w
// quantizes groups w, w + 8, ...; its lanes cover 128 inputs per step, the amax is a warp max,
// then the group is read again (from L1) to encode it. Row mode (group == in): the CTA covers the
// row, the amax is a CTA max through shared memory, then the row is read again.
#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/fp8_act_quant.h"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/fp8_act_quant.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
  return make_float4(detail::to_f32(p[0]), detail::to_f32(p[1]), detail::to_f32(p[2]),
                     detail::to_f32(p[3]));
}

__device__ __forceinline__ float amax4(float a, const float4& v) {
  return fmaxf(fmaxf(fmaxf(a, fabsf(v.x)), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

__device__ __forceinline__ uint32_t encode4(const float4& v, float s) {
  return uint32_t(detail::fp8e4m3_encode(fp8_act_scaled(v.x, s))) |
         uint32_t(detail::fp8e4m3_encode(fp8_act_scaled(v.y, s))) << 8 |
         uint32_t(detail::fp8e4m3_encode(fp8_act_scaled(v.z, s))) << 16 |
         uint32_t(detail::fp8e4m3_encode(fp8_act_scaled(v.w, s))) << 24;
}

// Inputs [k0, k1) of row x (k1 - k0 a multiple of 4) over `lanes` threads numbered t: the max of
// |x| (NaN ignored, as fmaxf), then the codes; returns the scale.
template <typename T>
__device__ __forceinline__ float amax_part(const T* x, int64_t k0, int64_t k1, int t, int lanes) {
  float a = 0.f;
  for (int64_t k = k0 + 4 * int64_t(t); k < k1; k += 4 * int64_t(lanes)) a = amax4(a, load4(x + k));
  return a;
}

template <typename T>
__device__ __forceinline__ void encode_part(const T* x, uint8_t* codes, int64_t k0, int64_t k1,
                                            float s, int t, int lanes) {
  for (int64_t k = k0 + 4 * int64_t(t); k < k1; k += 4 * int64_t(lanes))
    *reinterpret_cast<uint32_t*>(codes + k) = encode4(load4(x + k), s);
}

__device__ __forceinline__ float warp_max(float a) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));
  return a;
}

template <typename T, bool kWholeRow>
__global__ void __launch_bounds__(kThreads) fp8_act_quant_kernel(Fp8ActQuantParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t j = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint8_t* codes = p.codes + j * p.in;
  if (j >= p.rows) {  // padding row: zero codes, the zero group's scale
    for (int64_t k = 4 * int64_t(threadIdx.x); k < p.in; k += 4 * kThreads)
      *reinterpret_cast<uint32_t*>(codes + k) = 0u;
    const int64_t groups = (p.in + p.group - 1) / p.group;
    for (int64_t g = threadIdx.x; g < groups; g += kThreads)
      p.scales[g * p.scale_ld + j] = fp8_act_scale(0.f);
    return;
  }
  const T* x = static_cast<const T*>(p.x) + j * p.ldx;
  if constexpr (kWholeRow) {
    __shared__ float red[kWarps];
    const float a = warp_max(amax_part(x, 0, p.in, threadIdx.x, kThreads));
    if (lane == 0) red[warp] = a;
    __syncthreads();
    float amax = red[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, red[w]);
    const float s = fp8_act_scale(amax);
    if (threadIdx.x == 0) p.scales[j] = s;
    encode_part(x, codes, 0, p.in, s, threadIdx.x, kThreads);
  } else {
    const int64_t groups = (p.in + p.group - 1) / p.group;
    for (int64_t g = warp; g < groups; g += kWarps) {
      const int64_t k0 = g * p.group, k1 = min(p.in, k0 + p.group);
      const float s = fp8_act_scale(warp_max(amax_part(x, k0, k1, lane, 32)));
      if (lane == 0) p.scales[g * p.scale_ld + j] = s;
      encode_part(x, codes, k0, k1, s, lane, 32);
    }
  }
}

}  // namespace

void fp8_act_quant_run(const Fp8ActQuantParams& p, cudaStream_t stream) {
  LONGCTX_CHECK(p.rows >= 0 && p.padded_rows >= p.rows && p.in > 0 && p.in % 4 == 0 &&
                    p.ldx >= p.in && p.group > 0 && (p.group == p.in || p.group % 4 == 0) &&
                    p.scale_ld >= p.padded_rows,
                ErrorCode::kInvalidArgument,
                "fp8_act_quant: rows {} (padded {}), in {} (a multiple of 4), ldx {}, group {} "
                "(a multiple of 4 or in), scale_ld {}",
                p.rows, p.padded_rows, p.in, p.ldx, p.group, p.scale_ld);
  LONGCTX_CHECK(p.padded_rows <= 0x7fffffff, ErrorCode::kInvalidArgument, "fp8_act_quant: {} rows",
                p.padded_rows);
  if (p.padded_rows == 0) return;
  detail::visit_float(p.x_dtype, "fp8_act_quant", [&](auto xt) {
    using T = decltype(xt);
    const dim3 grid{unsigned(p.padded_rows)}, block{kThreads};
    if (p.group >= p.in)
      launch_pdl(fp8_act_quant_kernel<T, true>, grid, block, 0, stream, p);
    else
      launch_pdl(fp8_act_quant_kernel<T, false>, grid, block, 0, stream, p);
  });
}

}  // namespace longctx::kernels::cuda
