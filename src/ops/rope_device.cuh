// The device half of rope that rope_cuda and qk_norm_rope_cuda share: a token's cos/sin table.
#pragma once

#include <cstdint>

#include "ops/rope.h"

namespace longctx::ops::cuda_detail {

// Token t's cos/sin of its rotary_dim / 2 angles into cos_t / sin_t (shared memory), by the
// block's BLOCK threads: the frequencies of a table row, or dynamic NTK's recomputed from the
// token's sequence length with the CPU twin's arithmetic (rope_math.h; every thread derives the
// base, a few scalar ops in double where the CPU twin is, rather than staging it through shared
// memory); float(position) * inv_freq[i] in fp32, full-precision sincosf, times
// attention_scaling. The caller synchronizes the block before reading the table.
template <int BLOCK>
__device__ __forceinline__ void rope_cos_sin(const RopeParams& p, int64_t t, float* cos_t,
                                             float* sin_t) {
  const int half = int(p.rotary_dim / 2);
  const float pos = __ll2float_rn(p.positions[t]);
  const int row = rope_row(p, t);
  const float* inv = p.inv_freq + (row > 0 ? row : 0) * half;
  const float ntk_base =
      row < 0 ? rope_math::dynamic_ntk_base(p.ntk, p.lens ? p.lens[t] : p.positions[t] + 1) : 0.f;
  for (int i = threadIdx.x; i < half; i += BLOCK) {
    const float f = row < 0 ? rope_math::default_inv_freq(ntk_base, i, p.rotary_dim) : inv[i];
    float s, c;
    sincosf(__fmul_rn(pos, f), &s, &c);
    sin_t[i] = __fmul_rn(s, p.attention_scaling);
    cos_t[i] = __fmul_rn(c, p.attention_scaling);
  }
}

}  // namespace longctx::ops::cuda_detail
