#include "kernels/cpu/merge_cpu.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_elem.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu {
using decode_detail::load_f32;
using decode_detail::store_f32;

void merge_states(const MergeParams& p) {
  LONGCTX_CHECK(p.num_states >= 1, ErrorCode::kInvalidArgument,
                "merge_states: num_states {} must be >= 1", p.num_states);
  const int64_t D = p.head_dim;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> acc(D);
  for (int64_t row = 0; row < int64_t(p.num_rows) * p.num_heads; ++row) {
    auto state_o = [&](int s) -> const void* {
      if (p.o_ptrs) return p.o_ptrs[s];
      return static_cast<const char*>(p.o_in) + s * p.state_stride_o * dtype_size(p.in_dtype);
    };
    auto state_lse = [&](int s) {
      return p.lse_ptrs ? p.lse_ptrs[s][row] : p.lse_in[s * p.state_stride_lse + row];
    };
    float m = kNegInf;
    for (int s = 0; s < p.num_states; ++s) m = std::max(m, state_lse(s));
    std::fill(acc.begin(), acc.end(), 0.f);
    float sum = 0.f;
    if (m != kNegInf) {
      for (int s = 0; s < p.num_states; ++s) {
        float w = std::exp(state_lse(s) - m);  // exp(-inf) = 0: empty states drop out
        sum += w;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * load_f32(state_o(s), row * D + d, p.in_dtype);
      }
    }
    for (int64_t d = 0; d < D; ++d)
      store_f32(p.o_out, row * D + d, m == kNegInf ? 0.f : acc[d] / sum, p.out_dtype);
    if (p.lse_out) p.lse_out[row] = m == kNegInf ? kNegInf : m + std::log(sum);
  }
}

void merge_two_states(const void* o_a, const float* lse_a, const void* o_b, const float* lse_b,
                      void* o_out, float* lse_out, int num_rows, int num_heads, int head_dim,
                      DType dtype) {
  const void* o_ptrs[2] = {o_a, o_b};
  const float* lse_ptrs[2] = {lse_a, lse_b};
  MergeParams p;
  p.o_ptrs = o_ptrs;
  p.lse_ptrs = lse_ptrs;
  p.o_out = o_out;
  p.lse_out = lse_out;
  p.num_states = 2;
  p.num_rows = num_rows;
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.in_dtype = p.out_dtype = dtype;
  merge_states(p);
}

void accumulate_state(const StateAccumulateParams& p) {
  LONGCTX_CHECK(p.num_rows >= 0 && p.num_heads >= 1 && p.head_dim >= 1 && p.acc_o && p.acc_lse &&
                    (p.num_rows == 0 || (p.o && p.lse)),
                ErrorCode::kInvalidArgument, "accumulate_state: bad shape or null pointers");
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t D = p.head_dim;
  for (int64_t row = 0; row < int64_t(p.num_rows) * p.num_heads; ++row) {
    float* acc = p.acc_o + row * D;
    const float b = p.lse[row];
    if (p.init) {
      for (int64_t d = 0; d < D; ++d) acc[d] = load_f32(p.o, row * D + d, p.dtype);
      p.acc_lse[row] = b;
      continue;
    }
    const float a = p.acc_lse[row], m = std::max(a, b);
    if (m == kNegInf) continue;  // both empty: acc stays (0, -inf)
    const float wa = std::exp(a - m), wb = std::exp(b - m), inv = 1.f / (wa + wb);
    for (int64_t d = 0; d < D; ++d)
      acc[d] = (wa * acc[d] + wb * load_f32(p.o, row * D + d, p.dtype)) * inv;
    p.acc_lse[row] = m + std::log(wa + wb);
  }
}

}  // namespace longctx::kernels::cpu
