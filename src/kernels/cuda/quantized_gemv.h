// CUDA decode GEMVs over packed quantized weights (kernels/quantized_gemv_params.h): one pass of
// up to 8 rows of x, the kernel, tile and K split of quantized_gemv_schedule.
#pragma once

#include <cuda_runtime.h>

#include "kernels/quantized_gemv_params.h"

namespace longctx::kernels::cuda {

// Runs the pass p with schedule s (s.refusal empty): the GEMV kernel, and with s.splits > 1 the
// reduction of p.partial (slices added in order, then the bias) into p.out. Deterministic (no
// float atomics). No allocation, no sync; launched with programmatic dependent launch. Throws
// Error(kInvalidArgument) for params the schedule does not match (n, a missing partial buffer).
void quantized_gemv_run(const QuantizedGemvParams& p, const QuantizedGemvSchedule& s,
                        cudaStream_t stream);

}  // namespace longctx::kernels::cuda
