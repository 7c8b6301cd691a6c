// Host side of programmatic dependent launch (the kernels' side and launch_pdl: pdl.cuh).
#pragma once

namespace longctx::kernels::cuda {

// Whether launches on the current device carry the programmatic-serialization attribute:
// compute capability 9.0 or later, unless LONGCTX_PDL=0 (read once per process).
bool pdl_enabled();

}  // namespace longctx::kernels::cuda
