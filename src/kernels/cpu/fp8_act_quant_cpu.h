// The CPU reference of the W8A8 activation quantization (kernels/fp8_act_quant.h): the codes and
// scales the CUDA kernel must reproduce bit for bit.
#pragma once

#include <cstdint>

namespace longctx::kernels {

// x: [n, in] f32 rows (row stride ldx >= in). Writes codes [n, in] (E4M3, row stride in) and
// scales [n, ceil(in / group)] f32 row-major: group g of row j covers inputs g * group ..
// min(in, (g + 1) * group) - 1 (the last group may be shorter). group >= 1 (in: one scale per
// row).
void fp8_quantize_rows_cpu(const float* x, int64_t n, int64_t in, int64_t ldx, int64_t group,
                           uint8_t* codes, float* scales);

}  // namespace longctx::kernels
