#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_stream.h"
#include "gpu_ops/device_fill.h"
#include "kernels/cuda/fp8_device.cuh"
#include "longctx/core/cuda_check.h"

namespace longctx::gpu_ops_test {

namespace {

// The thread's current stream of the current device: the tests' streams are non-blocking, so
// work on the legacy default stream would race with theirs (a fill still running after a test
// freed its buffer overwrote the next test's inputs in the same allocation).
cudaStream_t stream_or_current(cudaStream_t stream) {
  if (stream != nullptr) return stream;
  int device = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  return current_cuda_stream(device);
}

__device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_kernel(void* dst, int64_t count, DType dtype, uint64_t seed, float lo,
                            float hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    const float u = float(h >> 40) * (1.0f / 16777216.0f);  // 24 bits: [0, 1)
    const float v = lo + (hi - lo) * u;
    switch (dtype) {
      case DType::kBF16:
        static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
        break;
      case DType::kF16:
        static_cast<__half*>(dst)[i] = __float2half_rn(v);
        break;
      case DType::kI32: {
        const int span = int(hi) - int(lo);
        static_cast<int32_t*>(dst)[i] = int(lo) + int(h % uint64_t(span > 0 ? span : 1));
        break;
      }
      case DType::kU8:
        static_cast<uint8_t*>(dst)[i] = uint8_t(h >> 56);
        break;
      case DType::kFP8E4M3:  // the code of v (saturating)
        static_cast<uint8_t*>(dst)[i] = kernels::cuda::detail::fp8e4m3_encode(v);
        break;
      case DType::kI64:
        static_cast<int64_t*>(dst)[i] = int64_t(h >> 1);
        break;
      default:
        static_cast<float*>(dst)[i] = v;
    }
  }
}

__global__ void count_non_finite_kernel(const void* p, DType dtype, int64_t rows, int64_t cols,
                                        int64_t ld, unsigned long long* count) {
  unsigned long long local = 0;
  const int64_t total = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = (i / cols) * ld + i % cols;
    float v;
    switch (dtype) {
      case DType::kBF16:
        v = __bfloat162float(static_cast<const __nv_bfloat16*>(p)[at]);
        break;
      case DType::kF16:
        v = __half2float(static_cast<const __half*>(p)[at]);
        break;
      default:
        v = static_cast<const float*>(p)[at];
    }
    local += !isfinite(v);
  }
  if (local) atomicAdd(count, local);
}

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(1000);
}

}  // namespace

void fill_uniform(void* dst, int64_t count, DType dtype, uint64_t seed, float lo, float hi,
                  cudaStream_t stream) {
  if (count <= 0) return;
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 65536);
  cudaStream_t s = stream_or_current(stream);
  fill_kernel<<<unsigned(blocks), 256, 0, s>>>(dst, count, dtype, seed, lo, hi);
  LONGCTX_CUDA_CHECK_LAUNCH("fill_kernel");
  if (stream == nullptr) LONGCTX_CUDA_CHECK(cudaStreamSynchronize(s));
}

int64_t count_non_finite(const void* p, DType dtype, int64_t rows, int64_t cols, int64_t ld) {
  if (rows <= 0 || cols <= 0) return 0;
  cudaStream_t s = stream_or_current(nullptr);  // after the kernels that wrote p
  unsigned long long* d = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&d, sizeof *d));
  LONGCTX_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof *d, s));
  const int64_t blocks = std::min<int64_t>((rows * cols + 255) / 256, 8192);
  count_non_finite_kernel<<<unsigned(blocks), 256, 0, s>>>(p, dtype, rows, cols, ld, d);
  LONGCTX_CUDA_CHECK_LAUNCH("count_non_finite_kernel");
  unsigned long long h = 0;
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaFree(d);
  return int64_t(h);
}

void launch_spin(cudaStream_t stream, uint64_t ns) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  LONGCTX_CUDA_CHECK_LAUNCH("spin_kernel");
}

}  // namespace longctx::gpu_ops_test
