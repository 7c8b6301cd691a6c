// The routing softmax of one token by one warp, shared by both CUDA routing kernels; moe_route's
// top-k of one token by one CTA (its sort kernel, moe_cuda.cu); and the order of picks that the
// per-pick kernel (more experts than a CTA sorts) ranks by, so that both kernels give the same ids
// and weights to the bit. Included by CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/moe_route_schedule.h"

namespace longctx::ops::cuda_detail {

struct Pick {
  float p;
  int e;
};
// a before b in the order of picks: probability descending, the lower expert among equal ones
__device__ __forceinline__ bool before(const Pick& a, const Pick& b) {
  return a.p > b.p || (a.p == b.p && a.e < b.e);
}

// A token's routing softmax: the logits' max and the sum of expf(logit - max) over its experts.
struct RouteSoftmax {
  float max, sum;
  __device__ __forceinline__ float prob(float logit) const { return expf(logit - max) / sum; }
};

// f(i, e) for this lane's experts e = lane + 32 i < experts in index order: i < kPerLane
// (unrolled, so that a register array indexed by i stays in registers), or every one where
// kPerLane is 0.
template <int kPerLane, typename F>
__device__ __forceinline__ void for_lane_experts(int experts, F f) {
  const int lane = threadIdx.x % 32;
  if constexpr (kPerLane > 0) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i < experts) f(i, lane + 32 * i);
  } else {
    for (int i = 0, e = lane; e < experts; ++i, e += 32) f(i, e);
  }
}

// The softmax of a token's `experts` router logits in fp32 by one warp, its lanes holding the
// experts as for_lane_experts<kPerLane> visits them (logit(i, e): expert e's logit as f32): the
// max, then each lane's sum over its experts in index order and the butterfly. The one order of
// every routing kernel, so that all give the same probabilities to the bit. Every lane returns
// the same max and sum (a NaN sum where a logit is NaN or +inf).
template <int kPerLane, typename Logit>
__device__ __forceinline__ RouteSoftmax warp_route_softmax(int experts, Logit logit) {
  float mx = -INFINITY;
  for_lane_experts<kPerLane>(experts, [&](int i, int e) { mx = fmaxf(mx, logit(i, e)); });
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  for_lane_experts<kPerLane>(experts, [&](int i, int e) { sum += expf(logit(i, e) - mx); });
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  return {mx, sum};
}

// Every thread of the CTA calls it (blockDim.x a multiple of 32). The softmax of `experts` <= 32
// kPerLane logits (load(e): logit e as f32) in fp32, computed in every warp from the logits read
// once into registers (lane holds experts lane + 32 i; warp_route_softmax, so moe_route's
// per-pick kernel's probabilities to the bit). Each expert's key (moe_route_schedule.h) goes to
// s_keys ([moe_route_sort_size(experts)] in shared memory) and the CTA sorts them with the bitonic
// network (CTA-wide barriers only where a step reaches across warps): when it returns,
// s_keys[0, k) are the picks by rank, visible to every thread (a token with NaN probabilities:
// k times moe_route_nan_key, no sort).
template <int kPerLane, typename Load>
__device__ __forceinline__ void cta_route_topk(int experts, int k, Load load, uint64_t* s_keys) {
  static_assert(kPerLane > 0 && (kPerLane & (kPerLane - 1)) == 0, "the sort's size is 32 kPerLane");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float lv[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    lv[i] = e < experts ? load(e) : -INFINITY;
  }
  const RouteSoftmax sm = warp_route_softmax<kPerLane>(experts, [&](int i, int) { return lv[i]; });
  // Every warp holds the same sum, so the branch is the whole CTA's.
  if (isnan(sm.sum)) {
    for (int j = threadIdx.x; j < k; j += blockDim.x) s_keys[j] = moe_route_nan_key(experts);
    __syncthreads();
    return;
  }
  // The keys of [experts, n) are padding (0, after every expert); n <= 32 kPerLane.
  const int n = moe_route_sort_size(experts);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (i % warps == warp && e < n)
      s_keys[e] = e < experts ? moe_route_key(sm.prob(lv[i]), e) : 0ull;
  }
  __syncthreads();
  moe_bitonic_sort_desc(s_keys, n, threadIdx.x, blockDim.x, [](bool cta) {
    if (cta)
      __syncthreads();
    else
      __syncwarp();
  });
}

}  // namespace longctx::ops::cuda_detail
