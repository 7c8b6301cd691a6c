#include "gpu_core/spin_kernel.h"
#include "longctx/core/cuda_check.h"

namespace longctx::gpu_test {

namespace {
__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void spin_kernel(uint64_t ns, int* flag, int value) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(1000);
  *flag = value;
}
}  // namespace

void launch_spin(cudaStream_t stream, uint64_t ns, int* flag, int value) {
  spin_kernel<<<1, 1, 0, stream>>>(ns, flag, value);
  LONGCTX_CUDA_CHECK_LAUNCH("spin_kernel");
}

}  // namespace longctx::gpu_test
