// Allocators own raw bytes for tensors. The CPU allocator returns 64-byte aligned memory; the
// CUDA allocator (CUDA builds) wraps cudaMalloc/cudaFree; the pinned allocator cudaMallocHost.
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
// Throws Error(kUnsupported) in a build without CUDA.
Allocator& cuda_allocator(int device_index = 0);
Allocator& pinned_host_allocator();
Allocator& default_allocator(Device device);

}  // namespace longctx
