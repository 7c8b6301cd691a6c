// Internal: the few CUDA runtime services the core needs, so tensor.cpp stays plain C++.
// In a build without CUDA each throws Error(kUnsupported).
#pragma once

#include <cstddef>

#include "longctx/core/device.h"

namespace longctx::detail {

void* cuda_malloc(size_t bytes, int device);
void cuda_free(void* ptr, int device);
void* cuda_malloc_host(size_t bytes);
void cuda_free_host(void* ptr);
// Synchronous copy between any two devices (host pointers may be pageable or pinned).
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void cuda_memset_zero(void* ptr, size_t bytes, int device);

}  // namespace longctx::detail
