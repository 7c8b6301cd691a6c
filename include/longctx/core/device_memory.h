// The device memory pool: every device allocation (Tensor::empty on a CUDA device, KV pools,
// workspaces) goes through it, so a byte limit is real, not advisory, and freed blocks are
// reused at stable addresses (CUDA graphs need fixed buffers; cudaMalloc/cudaFree in a hot loop
// synchronize the device).
//
// Budget: min(limit_bytes (0 = none), utilization * total device memory). An allocation that
// would take the pool past its budget first returns cached free blocks to the driver; if it
// still does not fit it throws Error(kOutOfMemory) naming the request, what is in use and the
// budget. Freed blocks go back to the pool at once: the pool assumes frees are ordered on the
// stream that will reuse the memory (one compute stream per device); memory another stream still
// reads must be kept alive by its owner until an event says that stream is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace longctx {

struct DeviceMemoryStats {
  int64_t budget = 0;     // bytes the pool may hold from the driver
  int64_t reserved = 0;   // bytes held from the driver (in use + cached)
  int64_t in_use = 0;     // bytes handed out (rounded sizes)
  int64_t peak_in_use = 0;
  int64_t num_allocations = 0;  // live
  int64_t device_total = 0;     // the GPU's memory
  int64_t device_free = 0;      // cudaMemGetInfo's free at the time of the call
};

// Sets device `device`'s budget: limit_bytes (0 = no hard limit) and utilization in (0, 1]
// (fraction of the device's total memory, default 0.9). May be called before or after the first
// allocation; lowering the budget below what is in use throws Error(kInvalidArgument).
void configure_device_memory(int device, int64_t limit_bytes, double utilization = 0.9);
DeviceMemoryStats device_memory_stats(int device);
// Returns cached free blocks to the driver.
void release_cached_device_memory(int device);
// "12.3 GiB" style.
std::string format_bytes(int64_t bytes);

}  // namespace longctx
