// The CPU reference of the W8A8 activation quantization: per row and group, the exact amax, one
// scale, one code per input (kernels/fp8_act_quant.h).
#include "kernels/cpu/fp8_act_quant_cpu.h"

#include <algorithm>
#include <cmath>

#include "kernels/fp8_act_quant.h"
#include "longctx/core/dtype.h"

namespace longctx::kernels {

void fp8_quantize_rows_cpu(const float* x, int64_t n, int64_t in, int64_t ldx, int64_t group,
                           uint8_t* codes, float* scales) {
  const int64_t groups = (in + group - 1) / group;
  for (int64_t j = 0; j < n; ++j) {
    const float* xr = x + j * ldx;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group, k1 = std::min(in, k0 + group);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::fmax(amax, std::abs(xr[k]));
      const float s = fp8_act_scale(amax);
      scales[j * groups + g] = s;
      for (int64_t k = k0; k < k1; ++k)
        codes[j * in + k] = f32_to_fp8e4m3(fp8_act_scaled(xr[k], s));
    }
  }
}

}  // namespace longctx::kernels
