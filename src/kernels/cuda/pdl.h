// Host side of programmatic dependent launch (the kernels' side and launch_pdl: pdl.cuh).
#pragma once

namespace longctx::kernels::cuda {

// Whether launches on the current device carry the programmatic-serialization attribute:
// compute capability 9.0 or later, unless set_pdl_allowed(device, false) turned it off there.
bool pdl_enabled();

// KernelTuning::pdl (longctx/kernels/kernel_tuning.h) for `device`: the attention backends apply
// their tuning's when they are made; allowed by default. Thread-safe.
void set_pdl_allowed(int device, bool allowed);

}  // namespace longctx::kernels::cuda
