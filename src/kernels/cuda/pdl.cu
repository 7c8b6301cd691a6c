#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/pdl.h"
#include "longctx/core/cuda_check.h"

namespace longctx::kernels::cuda {

bool pdl_enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("LONGCTX_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  // The runtime answers attribute queries from its own per-device cache (as tma_supported()).
  int device = 0, major = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

}  // namespace longctx::kernels::cuda
