#include "core/cuda_stream.h"
#include "kernels/cuda/sampling.h"
#include "longctx/core/stream.h"
#include "ops/sampling.h"

namespace longctx::ops {

void sample_rows_cuda(const kernels::SamplingBatch& batch, Device device) {
  DeviceGuard guard(device.index);
  kernels::cuda::sample_rows(batch, current_cuda_stream(device.index));
}

}  // namespace longctx::ops
