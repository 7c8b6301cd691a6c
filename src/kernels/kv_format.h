// How a paged KV cache stores its elements, shared by the parameter structs of the KV store, the
// paged prefill and the decode kernels (CPU references and CUDA).
//
// kFp8E4M3: K and V are OCP FP8 E4M3 codes with one fp32 scale per (page, KV head) for K and one
// for V, k_scale / v_scale [num_pages, num_kv_heads]: element = decode(code) * scale. The KV
// store owns the scales: a page's scale is the smallest power of two s with amax / s <= 448 over
// the rows written to it so far (amax over finite values). A row whose amax needs a larger scale
// raises it and re-encodes the page's earlier rows at the new scale; with power-of-two scales
// that is exact for every code that stays normal (a shift of the exponent), so a page's values do
// not depend on how its rows were batched beyond the subnormal rounding of small values. A token
// written at offset 0 starts its page afresh (a page's rows are written in slot order: the
// engine appends). Readers accumulate in fp32.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace longctx::kernels {

enum class KvCacheFormat : uint8_t {
  kDtype,    // the caches hold the params' dtype (bf16, f16 or f32), no scales
  kFp8E4M3,  // FP8 E4M3 codes + fp32 scales per (page, KV head)
};

inline constexpr float kFp8E4M3Max = 448.f;

// The smallest power of two s with amax / s <= 448 (0 for amax <= 0 or not finite: no scale).
LONGCTX_HD_INLINE float fp8_page_scale(float amax) {
  if (!(amax > 0.f) || !std::isfinite(amax)) return 0.f;
  int e = 0;
  const float m = std::frexp(amax / kFp8E4M3Max, &e);  // amax / 448 = m * 2^e, m in [0.5, 1)
  float s = std::ldexp(1.f, m == 0.5f ? e - 1 : e);
  while (amax > kFp8E4M3Max * s) s *= 2.f;  // the division's rounding
  return s;
}

}  // namespace longctx::kernels
