// A kernel that keeps a stream busy for a while (for event / wait tests).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace longctx::gpu_test {

// One thread spins on the global timer for `ns` nanoseconds, then writes `value` to *flag.
void launch_spin(cudaStream_t stream, uint64_t ns, int* flag, int value);

}  // namespace longctx::gpu_test
