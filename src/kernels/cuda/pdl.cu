#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cuda/pdl.h"
#include "longctx/core/cuda_check.h"

namespace longctx::kernels::cuda {

bool pdl_enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("LONGCTX_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  int device = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::vector<int> state;  // per device: -1 unknown, 0 no, 1 yes
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= int(state.size())) state.resize(device + 1, -1);
  if (state[device] < 0) {
    int major = 0;
    LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    state[device] = major >= 9 ? 1 : 0;
  }
  return state[device] == 1;
}

}  // namespace longctx::kernels::cuda
