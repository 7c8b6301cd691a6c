#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/pdl.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kMaxDevices = 64;
std::atomic<bool> g_disallowed[kMaxDevices] = {};  // zero-initialized: allowed

}  // namespace

bool pdl_enabled() {
  int device = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  if (g_disallowed[device].load(std::memory_order_relaxed)) return false;
  return device_props(device).major >= 9;
}

void set_pdl_allowed(int device, bool allowed) {
  LONGCTX_CHECK(device >= 0 && device < kMaxDevices, ErrorCode::kInvalidArgument,
                "programmatic dependent launch: device index {} out of range", device);
  g_disallowed[device].store(!allowed, std::memory_order_relaxed);
}

}  // namespace longctx::kernels::cuda
