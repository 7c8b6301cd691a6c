// Hopper (sm_90a) path of the paged prefill (prefill_sm90.cu): wgmma + warp specialization,
// same interface, plan and semantics as paged_prefill_run() (prefill.h), which dispatches here.
// Internal to kernels/cuda; callers use prefill.h.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention_params.h"
#include "kernels/cuda/prefill.h"

namespace longctx::kernels::cuda {

// True when the current device is sm_90, this binary carries the sm_90a kernel, and the params
// fit it (head_dim 64 or 128 with 16-bit or FP8 K/V, 256 with 16-bit K/V; the rest of
// paged_prefill_supported() is assumed to hold).
bool paged_prefill_sm90_available(const PagedPrefillParams& params);

// Launches the Hopper kernel (no checks beyond paged_prefill_run's).
void paged_prefill_sm90_run(const PagedPrefillParams& params, const PrefillPlan& plan,
                            cudaStream_t stream);

}  // namespace longctx::kernels::cuda
