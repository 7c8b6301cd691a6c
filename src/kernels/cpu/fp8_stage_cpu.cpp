#include "kernels/cpu/fp8_stage_cpu.h"

#include "longctx/core/error.h"

namespace longctx::kernels::cpu {

void fp8_stage(const Fp8StageParams& p) {
  check_fp8_stage_params(p);
  for (int64_t j = 0; j < p.num_pages; ++j)
    LONGCTX_CHECK(p.kv_indices[j] >= 0, ErrorCode::kOutOfRange,
                  "fp8 stage: call page {} names cache page {}", j, p.kv_indices[j]);
  const int64_t hk = p.num_kv_heads, d = p.head_dim;
  const int64_t page_elems = int64_t(p.page_size) * hk * d;
  // element = decode(code) * page scale, rounded to the staging dtype (exact for finite codes).
  auto convert = [&](const uint8_t* codes, const float* scales, void* out) {
    for (int64_t j = 0; j < p.num_pages; ++j) {
      const int64_t page = p.kv_indices[j];
      for (int64_t s = 0; s < p.page_size; ++s) {
        for (int64_t h = 0; h < hk; ++h) {
          const float scale = scales[page * hk + h];
          const int64_t row = (s * hk + h) * d;
          for (int64_t e = 0; e < d; ++e) {
            const float x = fp8e4m3_to_f32(codes[page * page_elems + row + e]) * scale;
            const int64_t at = j * page_elems + row + e;
            if (p.dtype == DType::kBF16)
              static_cast<uint16_t*>(out)[at] = f32_to_bf16(x);
            else
              static_cast<uint16_t*>(out)[at] = f32_to_f16(x);
          }
        }
      }
    }
  };
  convert(p.k_codes, p.k_scale, p.k_out);
  convert(p.v_codes, p.v_scale, p.v_out);
  if (p.iota_out != nullptr)
    for (int64_t j = 0; j < p.num_pages; ++j) p.iota_out[j] = static_cast<int32_t>(j);
}

}  // namespace longctx::kernels::cpu
