#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/func_attributes.h"
#include "longctx/core/cuda_check.h"

namespace longctx::kernels::cuda {

void require_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> set;  // (device, kernel) -> bytes opted in
  std::lock_guard<std::mutex> lock(mutex);
  int& done = set[{device, kernel}];
  if (done >= bytes) return;
  LONGCTX_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done = bytes;
}

int current_sm_count() {
  int dev = 0, sms = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&dev));
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

int64_t current_l2_bytes() {
  int dev = 0, bytes = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&dev));
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev));
  return bytes;
}

}  // namespace longctx::kernels::cuda
