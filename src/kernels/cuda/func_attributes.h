// Per-device kernel attributes, and the device properties the plans read. A function's maximum
// dynamic shared memory is an attribute of the kernel on the current device: a process that
// launches the same kernel on several GPUs (tensor parallelism, a thread per GPU) must opt in on
// each, which a once-per-process flag does not do.
#pragma once

#include <cstdint>

namespace longctx::kernels::cuda {

// Opts `kernel` (a __global__ function) into `bytes` of dynamic shared memory on the current
// device, once per (device, kernel) and size: only when `bytes` is more than already set. Small
// sizes are set too: the default limit is 48 KB minus the kernel's static shared memory.
// Thread-safe.
// Throws Error(kCuda) when the device refuses.
void require_dynamic_smem(const void* kernel, int bytes);

template <typename Kernel>
void require_dynamic_smem(Kernel* kernel, int bytes) {
  require_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// What the plans read of a device, cached per device id (a process may drive GPUs of different
// models: each plan reads its own device's).
struct DeviceProps {
  int sm_count = 0;      // multiprocessors (the plans' wave models and persistent grids)
  int64_t l2_bytes = 0;  // L2 cache
  int major = 0, minor = 0;
};
const DeviceProps& device_props(int device);
const DeviceProps& current_device_props();

// Multiprocessors of the current device.
int current_sm_count();

// Bytes of L2 cache of the current device.
int64_t current_l2_bytes();

// Resident CTAs per SM of `kernel` (a __global__ function) at this block size and dynamic shared
// memory on the current device, cached per (device, kernel, threads, smem).
int occupancy_per_sm(const void* kernel, int threads, int smem_bytes);

template <typename Kernel>
int occupancy_per_sm(Kernel* kernel, int threads, int smem_bytes) {
  return occupancy_per_sm(reinterpret_cast<const void*>(kernel), threads, smem_bytes);
}

}  // namespace longctx::kernels::cuda
