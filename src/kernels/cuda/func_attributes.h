// Per-device kernel attributes, and the current device's SM count. A function's maximum dynamic
// shared memory is an attribute of the kernel on the current device: a process that launches the
// same kernel on several GPUs (tensor parallelism, a thread per GPU) must opt in on each, which a
// once-per-process flag does not do.
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

// Multiprocessors of the current device (the plans' wave models and persistent grids).
int current_sm_count();

// Bytes of L2 cache of the current device.
int64_t current_l2_bytes();

}  // namespace longctx::kernels::cuda
