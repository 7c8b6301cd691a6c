// The top-k selection of the CUDA routing (moe_route_device.cuh), written once for the kernels and
// the CPU tests (tests/ops/test_moe_route_schedule.cpp): each expert's probability and index
// packed into one 64-bit key whose unsigned order is the order of picks, and a bitonic sorting
// network over those keys that a CTA runs one compare-exchange step at a time.
//
// The key: the probability's f32 bits in the high word, ~expert in the low word. A routing
// probability is expf(l - max) / sum with a positive sum, so it is +0 or a positive finite float
// (never -0: expf underflows to +0), and for those the bits' unsigned order is the value order. So
// a larger key is a larger probability, or an equal one of a lower expert: the strict order of
// picks (moe.h) with no equal keys among real experts, whatever the ties of the probabilities.
// Padding keys are 0, below every expert's (~e > 0). A token with a NaN probability has them all
// NaN (one NaN logit, or an infinite one, makes the softmax's sum NaN); such a token ranks nothing,
// and its k picks are moe_route_nan_key: probability -1, expert E (no row), as moe_route's
// per-pick kernel gives them.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace longctx::ops {

// The keys a token's sort runs over: the least power of two >= experts.
LONGCTX_HD_INLINE int moe_route_sort_size(int experts) {
  int n = 1;
  while (n < experts) n *= 2;
  return n;
}

LONGCTX_HD_INLINE uint32_t moe_route_float_bits(float p) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(p);
#else
  uint32_t u;
  std::memcpy(&u, &p, sizeof(u));
  return u;
#endif
}

LONGCTX_HD_INLINE float moe_route_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float p;
  std::memcpy(&p, &u, sizeof(p));
  return p;
#endif
}

// Expert e (0 <= e < 2^31) with probability p (+0 or positive, see the file comment).
LONGCTX_HD_INLINE uint64_t moe_route_key(float p, int e) {
  return (uint64_t(moe_route_float_bits(p)) << 32) | uint64_t(~uint32_t(e));
}
// Every pick of a token whose probabilities are NaN: probability -1, expert `experts`.
LONGCTX_HD_INLINE uint64_t moe_route_nan_key(int experts) { return moe_route_key(-1.f, experts); }
LONGCTX_HD_INLINE float moe_route_key_prob(uint64_t key) {
  return moe_route_bits_float(uint32_t(key >> 32));
}
LONGCTX_HD_INLINE int moe_route_key_expert(uint64_t key) { return int(~uint32_t(key)); }

// The sorting network over n (a power of two) keys, descending: for size = 2, 4, ..., n and
// stride = size / 2, ..., 1 one step of n / 2 compare-exchanges, pair q (0 <= q < n / 2) on
// keys i and i + stride with i = q with a 0 bit inserted at stride (so the pairs of a step are
// disjoint and cover every key once). The runs of `size` whose i & size is 0 are ordered
// descending, the others ascending, so that each next size merges bitonic sequences; at size = n
// every i & n is 0 and the whole array ends descending.
LONGCTX_HD_INLINE int moe_bitonic_lower(int q, int stride) { return 2 * q - (q & (stride - 1)); }
LONGCTX_HD_INLINE void moe_bitonic_exchange(uint64_t* keys, int size, int stride, int q) {
  const int i = moe_bitonic_lower(q, stride);
  const uint64_t a = keys[i], b = keys[i + stride];
  const bool descending = (i & size) == 0;
  if ((a < b) == descending) {
    keys[i] = b;
    keys[i + stride] = a;
  }
}
// A step of stride <= 32 keeps each aligned run of 32 pairs, q in [32 c, 32 c + 32), within the
// 64 keys [64 c, 64 c + 64). With q = thread + threads * m (threads a multiple of 32) run c is
// always the same warp's, so between two such steps a warp waits only for itself.
LONGCTX_HD_INLINE bool moe_bitonic_warp_local(int stride) { return stride <= 32; }
// The whole network by `threads` workers, this one `thread`: each step's pairs q = thread +
// threads * m, then barrier(cta): cta false where this step and the next are warp-local (a CTA's
// __syncwarp), true elsewhere and after the last step (__syncthreads); on one host thread,
// nothing. At 512 keys: 45 steps, 10 of them followed by a CTA-wide barrier.
template <typename Barrier>
LONGCTX_HD_INLINE void moe_bitonic_sort_desc(uint64_t* keys, int n, int thread, int threads,
                                             Barrier barrier) {
  for (int size = 2; size <= n; size *= 2)
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int q = thread; q < n / 2; q += threads) moe_bitonic_exchange(keys, size, stride, q);
      const int next = stride > 1 ? stride / 2 : size;  // the next size's first stride
      const bool last = stride == 1 && size == n;
      barrier(last || !moe_bitonic_warp_local(stride) || !moe_bitonic_warp_local(next));
    }
}

// The picks' probabilities summed in rank order (what renormalized weights divide by): the sum
// moe_route's per-pick kernel accumulates pick by pick.
LONGCTX_HD_INLINE float moe_route_picked(const uint64_t* sorted_keys, int k) {
  float picked = 0.f;
  for (int j = 0; j < k; ++j) picked += moe_route_key_prob(sorted_keys[j]);
  return picked;
}
// Rank j's weight: its probability, over the picks' sum when renormalizing.
LONGCTX_HD_INLINE float moe_route_weight(const uint64_t* sorted_keys, int k, int j,
                                         bool renormalize) {
  const float pj = moe_route_key_prob(sorted_keys[j]);
  return renormalize ? pj / moe_route_picked(sorted_keys, k) : pj;
}

}  // namespace longctx::ops
