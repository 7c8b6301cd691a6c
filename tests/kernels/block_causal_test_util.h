// Dense block-causal attention built from the definition (not from the layout), double
// precision: the check of RaggedBlockCausalAttention on the CPU (tests/kernels) and on the GPU
// (tests/gpu_kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/decode_test_util.h"
#include "longctx/core/dtype.h"

namespace longctx::testing {

// q [total, hq, D], k/v [total, hk, D] as element bits of `dtype`; rows = the query tokens to
// check. Returns o [rows.size(), hq, D] in double.
inline std::vector<double> dense_block_causal(const std::vector<uint16_t>& q,
                                              const std::vector<uint16_t>& k,
                                              const std::vector<uint16_t>& v,
                                              const std::vector<int64_t>& seg_lens, int64_t block,
                                              int hq, int hk, int D, DType dtype, double scale,
                                              const std::vector<int64_t>& rows) {
  std::vector<int64_t> span_start, span_len, pos;  // per token
  int64_t off = 0;
  for (int64_t len : seg_lens) {
    for (int64_t p = 0; p < len; ++p) {
      span_start.push_back(off);
      span_len.push_back(len);
      pos.push_back(p);
    }
    off += len;
  }
  const int g = hq / hk;
  std::vector<double> out(rows.size() * hq * D);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t i = rows[r];
    // Keys: the same span, block of the key <= block of the query.
    const int64_t first = span_start[i];
    const int64_t last = first + std::min<int64_t>((pos[i] / block + 1) * block, span_len[i]);
    for (int h = 0; h < hq; ++h) {
      std::vector<float> qf(D);
      for (int d = 0; d < D; ++d) qf[d] = half_to_f32(q[(i * hq + h) * D + d], dtype);
      std::vector<std::vector<float>> kf, vf;
      for (int64_t j = first; j < last; ++j) {
        kf.emplace_back(D);
        vf.emplace_back(D);
        for (int d = 0; d < D; ++d) {
          kf.back()[d] = half_to_f32(k[(j * hk + h / g) * D + d], dtype);
          vf.back()[d] = half_to_f32(v[(j * hk + h / g) * D + d], dtype);
        }
      }
      std::vector<double> o;
      dense_row(qf, kf, vf, scale, o);
      for (int d = 0; d < D; ++d) out[(r * hq + h) * D + d] = o[d];
    }
  }
  return out;
}

}  // namespace longctx::testing
