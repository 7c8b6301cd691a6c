#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/cuda/func_attributes.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

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

const DeviceProps& device_props(int device) {
  constexpr int kMaxDevices = 64;
  LONGCTX_CHECK(device >= 0 && device < kMaxDevices, ErrorCode::kInvalidArgument,
                "device properties: device index {} out of range", device);
  static std::once_flag once[kMaxDevices];
  static DeviceProps props[kMaxDevices];
  std::call_once(once[device], [device] {
    DeviceProps& p = props[device];
    int l2 = 0;
    LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, device));
    LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&p.major, cudaDevAttrComputeCapabilityMajor, device));
    LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&p.minor, cudaDevAttrComputeCapabilityMinor, device));
    p.l2_bytes = l2;
  });
  return props[device];
}

const DeviceProps& current_device_props() {
  int dev = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&dev));
  return device_props(dev);
}

int current_sm_count() { return current_device_props().sm_count; }

int64_t current_l2_bytes() { return current_device_props().l2_bytes; }

int occupancy_per_sm(const void* kernel, int threads, int smem_bytes) {
  int device = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, threads, smem_bytes);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int n = 0;
  LONGCTX_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, size_t(smem_bytes)));
  cache[key] = n;
  return n;
}

}  // namespace longctx::kernels::cuda
