// moe_route's top-k of one token by one warp, shared by moe_route's kernel (moe_cuda.cu) and the
// decode gate/up kernel that routes inside (moe_decode_cuda.cu), so that both give the same ids
// and weights to the bit. Included by CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace longctx::ops::cuda_detail {

struct Pick {
  float p;
  int e;
};
// a before b in the order of picks: probability descending, the lower expert among equal ones
__device__ __forceinline__ bool before(const Pick& a, const Pick& b) {
  return a.p > b.p || (a.p == b.p && a.e < b.e);
}

// Every lane of the warp calls it. The softmax of `experts` <= 32 kPerLane logits (load(e): logit
// e as f32) in fp32, computed once into registers (lane holds experts lane + 32 i); then k rounds,
// each a warp argmax over the lanes' first experts after the previous pick, after which only the
// lane that held the pick moves on to its next (every other lane's first comes after the pick).
// emit(j, pick) is called by lane 0 for rank j: {-1, experts} when nothing is left (NaN logits).
// Returns the picks' probabilities summed in rank order, in every lane.
template <int kPerLane, typename Load, typename Emit>
__device__ __forceinline__ float warp_route_topk(int experts, int k, Load load, Emit emit) {
  const int lane = threadIdx.x % 32;
  float p[kPerLane];  // logits, then probabilities
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? load(e) : -INFINITY;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < experts) mx = fmaxf(mx, p[i]);
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  // each lane sums its experts in index order, then the butterfly: the routing's sum everywhere
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < experts) sum += expf(p[i] - mx);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] = expf(p[i] - mx) / sum;
  // the lane's first expert after `prev` ({-1, experts}: none left)
  auto first_after = [&](const Pick& prev) {
    Pick best{-1.f, experts};
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const Pick c{p[i], lane + 32 * i};
      if (c.e < experts && before(prev, c) && before(c, best)) best = c;
    }
    return best;
  };
  Pick mine = first_after(Pick{INFINITY, -1});
  float picked = 0.f;
  for (int j = 0; j < k; ++j) {
    Pick best = mine;
    for (int o = 16; o > 0; o /= 2) {
      const Pick other{__shfl_xor_sync(0xffffffffu, best.p, o),
                       __shfl_xor_sync(0xffffffffu, best.e, o)};
      if (before(other, best)) best = other;
    }
    if (lane == 0) emit(j, best);
    picked += best.p;
    if (mine.e == best.e && best.e < experts) mine = first_after(best);
  }
  return picked;
}

}  // namespace longctx::ops::cuda_detail
