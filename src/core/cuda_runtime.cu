#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/device_memory.h"

namespace longctx {

bool cuda_available() { return cuda_device_count() > 0; }

namespace detail {

namespace {
// The CUDA side of a copy: the destination when it is on a GPU, else the source.
int copy_device(Device dst, Device src) {
  if (dst.is_cuda()) return dst.index;
  if (src.is_cuda()) return src.index;
  return -1;
}
}  // namespace

void* cuda_malloc(size_t bytes, int device) {
  DeviceGuard g(device);
  void* p = nullptr;
  if (bytes) LONGCTX_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void* cuda_try_malloc(size_t bytes, int device) {
  DeviceGuard g(device);
  void* p = nullptr;
  if (!bytes) return nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so the next launch check does not see it
    return nullptr;
  }
  LONGCTX_CUDA_CHECK(err);
  return p;
}

void cuda_free(void* ptr, int device) {
  if (!ptr) return;
  DeviceGuard g(device);
  cudaFree(ptr);
}

int64_t cuda_free_memory(int device) {
  DeviceGuard g(device);
  size_t free_b = 0, total_b = 0;
  LONGCTX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

void* cuda_malloc_host(size_t bytes) {
  void* p = nullptr;
  if (!bytes) return nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    LONGCTX_THROW(ErrorCode::kOutOfMemory, "cudaMallocHost: cannot pin {} of host memory",
                  format_bytes(static_cast<int64_t>(bytes)));
  }
  LONGCTX_CUDA_CHECK(err);
  return p;
}

void cuda_free_host(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (!bytes) return;
  const int device = copy_device(dst_device, src_device);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    // Runs on the destination's stream: first let the source's stream finish what it queued.
    DeviceGuard gs(src_device.index);
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(current_cuda_stream(src_device.index)));
  }
  DeviceGuard g(device);
  cudaStream_t s = device >= 0 ? current_cuda_stream(device) : nullptr;
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(s));
}

void cuda_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                     void* stream) {
  if (!bytes) return;
  DeviceGuard g(copy_device(dst_device, src_device));
  LONGCTX_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

void cuda_memset_zero(void* ptr, size_t bytes, int device) {
  if (!bytes) return;
  DeviceGuard g(device);
  LONGCTX_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, current_cuda_stream(device)));
}

}  // namespace detail
}  // namespace longctx
