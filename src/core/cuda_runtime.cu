#include "core/cuda_runtime.h"
#include "longctx/core/cuda_check.h"

namespace longctx {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

namespace detail {

namespace {
struct DeviceGuard {
  int prev = 0;
  explicit DeviceGuard(int device) {
    LONGCTX_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != device) LONGCTX_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};
}  // namespace

void* cuda_malloc(size_t bytes, int device) {
  DeviceGuard g(device);
  void* p = nullptr;
  if (bytes) LONGCTX_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void cuda_free(void* ptr, int device) {
  if (!ptr) return;
  DeviceGuard g(device);
  cudaFree(ptr);
}
void* cuda_malloc_host(size_t bytes) {
  void* p = nullptr;
  if (bytes) LONGCTX_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}
void cuda_free_host(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}
void cuda_copy(void* dst, Device, const void* src, Device, size_t bytes) {
  if (bytes) LONGCTX_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}
void cuda_memset_zero(void* ptr, size_t bytes, int device) {
  DeviceGuard g(device);
  if (bytes) LONGCTX_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
}

}  // namespace detail
}  // namespace longctx
