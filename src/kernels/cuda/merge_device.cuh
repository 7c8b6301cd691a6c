// The stable N-state merge of one (row, head), shared by the merge, decode and prefill kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/convert_device.cuh"

namespace longctx::kernels::cuda::detail {

// One warp merges the states of one (row, head): lse(s) gives state s's lse, o(s) its [D] vector.
// Writes out[0..D) and returns the merged lse (natural log; -inf when every state is empty).
template <typename TIn, typename TOut, typename LseAt, typename OAt>
__device__ __forceinline__ float merge_row_warp(int num_states, int head_dim, LseAt lse_at,
                                                OAt o_at, TOut* out) {
  const int lane = threadIdx.x & 31;
  float m = -INFINITY;
  for (int s = 0; s < num_states; ++s) m = fmaxf(m, lse_at(s));
  if (m == -INFINITY) {
    for (int d = lane; d < head_dim; d += 32) out[d] = from_f32<TOut>(0.f);
    return -INFINITY;
  }
  float sum = 0.f;
  for (int s = 0; s < num_states; ++s) sum += __expf(lse_at(s) - m);
  const float inv = 1.f / sum;
  for (int d = lane; d < head_dim; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < num_states; ++s) {
      float l = lse_at(s);
      if (l != -INFINITY) acc += __expf(l - m) * to_f32<TIn>(o_at(s)[d]);
    }
    out[d] = from_f32<TOut>(acc * inv);
  }
  return m + __logf(sum);
}

}  // namespace longctx::kernels::cuda::detail
