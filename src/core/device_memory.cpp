// The per-device pools over cudaMalloc and the public device_memory.h functions.
#include "longctx/core/device_memory.h"

#include <memory>
#include <mutex>

#include "core/cuda_runtime.h"
#include "core/device_pool.h"
#include "core/stream_limits.h"
#include "longctx/core/device.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace detail {

namespace {

class CudaPoolBackend final : public DevicePoolBackend {
 public:
  explicit CudaPoolBackend(int device) : device_(device) {}
  void* raw_alloc(size_t bytes) override { return cuda_try_malloc(bytes, device_); }
  void raw_free(void* ptr) override { cuda_free(ptr, device_); }
  int64_t total_memory() override { return device_properties(device_).total_memory; }
  int64_t free_memory() override { return cuda_free_memory(device_); }
  std::string device_name() override { return Device::cuda(device_).str(); }

 private:
  int device_;
};

}  // namespace

DevicePool& device_pool(int device) {
  LONGCTX_CHECK(device >= 0 && device < kMaxCudaDevices, ErrorCode::kInvalidArgument,
                "device pool: device index {} out of range [0, {})", device, kMaxCudaDevices);
  static std::mutex mu;
  static DevicePool* pools[kMaxCudaDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!pools[device]) pools[device] = new DevicePool(new CudaPoolBackend(device));
  return *pools[device];
}

}  // namespace detail

void configure_device_memory(int device, int64_t limit_bytes, double utilization) {
  detail::device_pool(device).configure(limit_bytes, utilization);
}

DeviceMemoryStats device_memory_stats(int device) { return detail::device_pool(device).stats(); }

void release_cached_device_memory(int device) { detail::device_pool(device).release_cached(); }

}  // namespace longctx
