// Internal: the few CUDA runtime services the core needs, so tensor.cpp stays plain C++.
// In a build without CUDA each throws Error(kUnsupported).
//
// Ordering: copies and memsets run on current_stream() of the CUDA device involved (the
// destination's for device-to-device), so they are ordered with the ops launched from this
// thread; the "synchronous" ones synchronize that stream before returning.
#pragma once

#include <cstddef>
#include <cstdint>

#include "longctx/core/device.h"

namespace longctx::detail {

void* cuda_malloc(size_t bytes, int device);
// nullptr when the device is out of memory (other failures throw Error(kCuda)).
void* cuda_try_malloc(size_t bytes, int device);
void cuda_free(void* ptr, int device);
// cudaMemGetInfo's free bytes.
int64_t cuda_free_memory(int device);
void* cuda_malloc_host(size_t bytes);
void cuda_free_host(void* ptr);
// Copy between any two devices, finished on return (host pointers may be pageable or pinned).
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// cudaMemcpyAsync on `stream` (a cudaStream_t; nullptr = the legacy default stream of the CUDA
// side). Truly asynchronous only when the host side is pinned.
void cuda_copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                     void* stream);
// Zero-fill, enqueued on current_stream(device) (no host wait).
void cuda_memset_zero(void* ptr, size_t bytes, int device);

}  // namespace longctx::detail
