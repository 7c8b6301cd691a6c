#include "longctx/core/allocator.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>

#include "core/cuda_runtime.h"
#include "core/device_pool.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

constexpr size_t kCpuAlignment = 64;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded ? rounded : kCpuAlignment);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
};

// Every device allocation goes through the device's caching pool (core/device_pool.h): the
// budget of configure_device_memory() holds and freed blocks are reused at stable addresses.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index), pool_(&detail::device_pool(index)) {}
  void* allocate(size_t bytes) override { return pool_->allocate(bytes); }
  void deallocate(void* ptr, size_t) override { pool_->free(ptr); }
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
  detail::DevicePool* pool_;
};

class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override { return detail::cuda_malloc_host(bytes); }
  void deallocate(void* ptr, size_t) override { detail::cuda_free_host(ptr); }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

Allocator& cuda_allocator(int device_index) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<CudaAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mu);
  auto& a = allocators[device_index];
  if (!a) a = std::make_unique<CudaAllocator>(device_index);
  return *a;
}

Allocator& pinned_host_allocator() {
  static PinnedAllocator a;
  return a;
}

Allocator& default_allocator(Device device) {
  return device.is_cpu() ? cpu_allocator() : cuda_allocator(device.index);
}

}  // namespace longctx
