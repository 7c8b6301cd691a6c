// CPU twin of the FP8 staging conversion (see Fp8StageParams in kernels/fp8_stage_params.h): what
// the CUDA kernel (kernels/cuda/fp8_stage.h) is tested against. Host pointers.
#pragma once

#include "kernels/fp8_stage_params.h"

namespace longctx::kernels::cpu {

// Checks the params (check_fp8_stage_params), then writes staging page j from cache page
// kv_indices[j] for K and V, and iota_out when given. A negative kv_indices entry throws
// Error(kOutOfRange) before anything is written (the caller's bug; the CUDA kernel trusts them).
void fp8_stage(const Fp8StageParams& params);

}  // namespace longctx::kernels::cpu
