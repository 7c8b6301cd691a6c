// CUDA W8A8 activation quantization (kernels/fp8_act_quant.h): FP8 E4M3 codes and fp32 scales per
// token and group, bit-identical to kernels/cpu/fp8_act_quant_cpu.h. The scales are written in
// the layout cuBLASLt's FP8 GEMMs read on Hopper: N-major (group g of row j at g * scale_ld + j),
// which is CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F's for group 128 and OUTER_VEC_32F's (one
// group) for per-token scales.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::kernels::cuda {

struct Fp8ActQuantParams {
  const void* x = nullptr;  // [rows, in] of x_dtype, row stride ldx elements
  DType x_dtype = DType::kBF16;
  int64_t rows = 0;         // rows of x quantized
  int64_t padded_rows = 0;  // >= rows: rows past `rows` get zero codes and the zero group's scale
  int64_t in = 0, ldx = 0;
  int64_t group = 0;         // inputs per scale (the last group may be shorter); in: per token
  uint8_t* codes = nullptr;  // [padded_rows, in], row stride in
  float* scales = nullptr;   // [ceil(in / group), scale_ld]
  int64_t scale_ld = 0;      // >= padded_rows
};

// One CTA per row. Throws Error(kInvalidArgument) on malformed params (in not a multiple of 4,
// a group that is not a multiple of 4 or the whole row, scale_ld < padded_rows) and
// Error(kUnsupported) for an x dtype other than bf16, f16 or f32. No allocation, no sync.
void fp8_act_quant_run(const Fp8ActQuantParams& p, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
