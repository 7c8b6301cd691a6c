// require_dynamic_smem (kernels/cuda/func_attributes.h): a kernel opted in on every visible device
// launches with more than 48 KB of dynamic shared memory on each, and asking again for less keeps
// the larger opt-in.
#include <gtest/gtest.h>

#include "kernels/cuda/func_attributes.h"
#include "longctx/core/cuda_check.h"

namespace longctx::gpu_test {
namespace {

__global__ void touch_smem(int bytes, int* out) {
  extern __shared__ unsigned char smem[];
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) smem[i] = static_cast<unsigned char>(i);
  __syncthreads();
  if (threadIdx.x == 0) *out = smem[bytes - 1];
}

TEST(FuncAttributes, OptInOnEveryDevice) {
  int devices = 0;
  LONGCTX_CUDA_CHECK(cudaGetDeviceCount(&devices));
  ASSERT_GT(devices, 0);
  constexpr int kBytes = 96 * 1024;
  for (int d = 0; d < devices; ++d) {
    LONGCTX_CUDA_CHECK(cudaSetDevice(d));
    kernels::cuda::require_dynamic_smem(touch_smem, kBytes);
    kernels::cuda::require_dynamic_smem(touch_smem, 64 * 1024);  // keeps 96 KB
    cudaFuncAttributes attr{};
    LONGCTX_CUDA_CHECK(cudaFuncGetAttributes(&attr, touch_smem));
    EXPECT_GE(attr.maxDynamicSharedSizeBytes, kBytes) << "device " << d;
    int* out = nullptr;
    LONGCTX_CUDA_CHECK(cudaMalloc(&out, sizeof(int)));
    touch_smem<<<1, 128, kBytes>>>(kBytes, out);
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    int got = -1;
    LONGCTX_CUDA_CHECK(cudaMemcpy(&got, out, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, (kBytes - 1) & 0xff) << "device " << d;
    LONGCTX_CUDA_CHECK(cudaFree(out));
  }
  LONGCTX_CUDA_CHECK(cudaSetDevice(0));
}

}  // namespace
}  // namespace longctx::gpu_test
