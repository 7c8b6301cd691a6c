// Build without CUDA: the offload device exists only as the CPU simulation.
#ifndef LONGCTX_WITH_CUDA
#include "attention/backends/offload_backend.h"
#include "longctx/core/error.h"

namespace longctx {

OffloadDeviceParts make_cuda_offload_device(const OffloadDeviceConfig&) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "KV offload to host memory: this build of longctx has no CUDA backend (configure "
                "with -DLONGCTX_CUDA=ON)");
}

double measure_host_to_device_gbps(Device, int64_t) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "host-to-device copies: this build has no CUDA backend");
}

}  // namespace longctx
#endif
