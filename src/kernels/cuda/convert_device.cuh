// fp32 <-> element conversions of the CUDA kernels' and ops' dtypes (f32, bf16, f16; to 16 bits
// with round to nearest even): the one definition every kernel and op uses. to_f32 deduces its
// type from the argument; from_f32 names the element type it makes; load_any reads an element
// whose dtype is a run-time value. visit_float is the host-side dispatch from a DType to that
// element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda::detail {

// Calls f(T{}) with T the CUDA type of a float dtype; throws Error(kUnsupported) naming `what`
// for any other dtype.
template <typename F>
void visit_float(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
    case DType::kF16:
      return f(__half{});
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "{}: dtype {} is not f32, bf16 or f16", what,
                    dtype_name(dtype));
  }
}

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// Element i of a float array whose dtype is known only at run time (small operands: norm
// weights, biases, quantization scales; the switch is uniform across the warp). Anything not
// bf16 or f16 reads as f32: callers checked the dtype on the host.
__device__ __forceinline__ float load_any(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

}  // namespace longctx::kernels::cuda::detail
