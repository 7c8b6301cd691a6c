#include "decode_profile.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace longctx::bench {

double hbm_peak_gbs(int device) {
  int khz = 0, bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 2.0 * khz * 1e3 * (bits / 8.0) / 1e9;
}

void print_op_profile(const OpProfile& profile, const std::string& what, int device) {
  const double peak = hbm_peak_gbs(device);
  std::printf(
      "op profile of %s (an event after each op; medians of %d steps; bound: bytes at the HBM's "
      "%.0f GB/s):\n%s",
      what.c_str(), profile.steps(), peak, profile.table(peak).c_str());
  std::fflush(stdout);
}

}  // namespace longctx::bench
