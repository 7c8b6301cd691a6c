// Allocators own raw bytes for tensors. The CPU allocator returns 64-byte aligned memory; the
// CUDA allocator is the caching device pool of device_memory.h (CUDA builds); the pinned
// allocator wraps cudaMallocHost.
#pragma once

#include <cstddef>

#include "longctx/core/device.h"

namespace longctx {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

Allocator& cpu_allocator();
// The device pool of cuda:device_index; its allocate() throws Error(kUnsupported) in a build
// without CUDA and Error(kOutOfMemory) past the budget.
Allocator& cuda_allocator(int device_index = 0);
Allocator& pinned_host_allocator();
Allocator& default_allocator(Device device);

}  // namespace longctx
