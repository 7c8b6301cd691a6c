// Device-side helpers of the CUDA op twins: f32 <-> element conversions, 8-wide vector loads and
// stores, the row launch shape every row-wise op uses, and host-side dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_stream.h"
#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"
#include "ops/op_params.h"

namespace longctx::ops::cuda_detail {

// Elements per thread on the vector path: 16 bytes of a 16-bit dtype, two float4 of f32.
constexpr int kVec = 8;

using kernels::cuda::detail::from_f32;
using kernels::cuda::detail::load_any;
using kernels::cuda::detail::to_f32;

// Two 16-bit values packed in a 32-bit word -> two floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 h;
    memcpy(&h, &u, 4);
    return __bfloat1622float2(h);
  } else {
    __half2 h;
    memcpy(&h, &u, 4);
    return __half22float2(h);
  }
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&u, &h, 4);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    memcpy(&u, &h, 4);
  }
  return u;
}

// N (1 or kVec) consecutive elements as floats; for kVec the address is 16-byte aligned.
template <int N, typename T>
__device__ __forceinline__ void load(const T* p, float (&v)[N]) {
  if constexpr (N == 1) {
    v[0] = to_f32(p[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(N == 8);
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    static_assert(N == 8);
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = unpack2<T>(w[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

template <int N, typename T>
__device__ __forceinline__ void store(T* p, const float (&v)[N]) {
  if constexpr (N == 1) {
    p[0] = from_f32<T>(v[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(N == 8);
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    static_assert(N == 8);
    uint4 u;
    u.x = pack2<T>(v[0], v[1]);
    u.y = pack2<T>(v[2], v[3]);
    u.z = pack2<T>(v[4], v[5]);
    u.w = pack2<T>(v[6], v[7]);
    *reinterpret_cast<uint4*>(p) = u;
  }
}

// Typed pointer to row r of a view.
template <typename T>
__device__ __forceinline__ T* row_of(const RowsView& v, int64_t r) {
  return static_cast<T*>(v.data) + v.row_offset(r);
}

// Row-wise launch: threads along x cover a row's chunks, along y rows; blocks of 256 threads
// loop over rows past gridDim.y. F: a functor with __device__ operator()(row, chunk). Launched
// with programmatic dependent launch (kernels/cuda/pdl.cuh): it waits for the kernel before it
// first thing, and lets the next one start.
template <typename F>
__global__ void __launch_bounds__(256) rows_kernel(F f, int64_t rows, int64_t chunks) {
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += int64_t(gridDim.y) * blockDim.y)
    f(r, c);
}

template <typename F>
void launch_rows(const F& f, int64_t rows, int64_t chunks, cudaStream_t stream) {
  if (rows <= 0 || chunks <= 0) return;
  unsigned bx = 32;
  while (bx < 256 && bx < chunks) bx *= 2;
  const unsigned by = 256 / bx;
  const int64_t gx = (chunks + bx - 1) / bx;
  const int64_t gy = std::min<int64_t>((rows + by - 1) / by, 65535);
  LONGCTX_CHECK(gx <= 0x7fffffff, ErrorCode::kInvalidArgument, "row of {} chunks is too long",
                chunks);
  kernels::cuda::launch_pdl(rows_kernel<F>, dim3(unsigned(gx), unsigned(gy)), dim3(bx, by), 0,
                            stream, f, rows, chunks);
}

// True when every row of v starts 16-byte aligned (the kVec path's condition with cols % 8).
inline bool rows_aligned16(const RowsView& v) {
  const int64_t es = int64_t(dtype_size(v.dtype));
  bool ok = reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
  if (v.rows > v.inner) ok = ok && (v.stride_outer * es) % 16 == 0;
  if (v.inner > 1) ok = ok && (v.stride_inner * es) % 16 == 0;
  return ok;
}

using kernels::cuda::detail::visit_float;  // the host-side dtype dispatch

// The twin's stream, with the tensors' device current for the launches.
inline cudaStream_t op_stream(Device device, const char* op) {
  LONGCTX_CHECK(device.is_cuda(), ErrorCode::kInvalidArgument, "{}_cuda: tensors are on {}", op,
                device.str());
  return current_cuda_stream(device.index);
}

}  // namespace longctx::ops::cuda_detail
