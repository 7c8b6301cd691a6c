// Device helpers shared by the two paged prefill kernels (prefill.cu, prefill_sm90.cu) for
// masks: a shared-memory bitmap of the 128-key blocks a CTA's tile needs, the search for the next
// key tile to visit, and the masking of one thread's scores of a boundary tile.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_params.h"

namespace longctx::kernels::cuda::detail {

// Marks in `bits` (shared memory, one bit per key block, ceil(nkb_need / 32) words) every key block
// kb < nkb_need that some head in [h_lo, h_lo + h_n) keeps for some query block in [qb_lo, qb_hi]:
// a superset of what the tile's rows need. `mask` is the request's [heads, nqb, nkb] uint8 mask.
// Every thread of the CTA calls it (it synchronizes once, after zeroing); the caller synchronizes
// before reading the bits.
__device__ __forceinline__ void mark_needed_key_blocks(const uint8_t* mask, int nqb, int nkb,
                                                       int nkb_need, int h_lo, int h_n, int qb_lo,
                                                       int qb_hi, int tid, int num_threads,
                                                       uint32_t* bits) {
  const int words = (nkb_need + 31) / 32;
  for (int w = tid; w < words; w += num_threads) bits[w] = 0;
  __syncthreads();
  for (int kb = tid; kb < nkb_need; kb += num_threads) {
    bool any = false;
    for (int h = h_lo; h < h_lo + h_n && !any; ++h)
      for (int qb = qb_lo; qb <= qb_hi; ++qb) any |= mask[(int64_t(h) * nqb + qb) * nkb + kb] != 0;
    if (any) atomicOr(&bits[kb >> 5], 1u << (kb & 31));
  }
}

// Warp-level variant for a subset of the CTA (the Hopper kernel's producer warpgroup): warps
// [warp, warp + num_warps) fill any_bits (some head in [h_lo, h_lo + h_n) keeps key block kb for
// some query block in [qb_lo, qb_hi]) and all_bits (every such head keeps it for every such query
// block: every row of the tile sees the whole block, so the block needs no per-row masking), one
// ballot per 32 blocks and no atomics. The caller synchronizes the writing warps before the bits
// are read.
__device__ __forceinline__ void mark_key_blocks_warps(const uint8_t* mask, int nqb, int nkb,
                                                      int nkb_need, int h_lo, int h_n, int qb_lo,
                                                      int qb_hi, int warp, int num_warps, int lane,
                                                      uint32_t* any_bits, uint32_t* all_bits) {
  const int words = (nkb_need + 31) / 32;
  for (int w = warp; w < words; w += num_warps) {
    const int kb = w * 32 + lane;
    bool any = false, all = kb < nkb_need;
    if (kb < nkb_need)
      for (int h = h_lo; h < h_lo + h_n; ++h)
        for (int qb = qb_lo; qb <= qb_hi; ++qb) {
          const bool on = mask[(int64_t(h) * nqb + qb) * nkb + kb] != 0;
          any |= on;
          all &= on;
        }
    const uint32_t any_word = __ballot_sync(0xffffffffu, any);
    const uint32_t all_word = __ballot_sync(0xffffffffu, all);
    if (lane == 0) {
      any_bits[w] = any_word;
      all_bits[w] = all_word;
    }
  }
}

// First key tile (of KEYS keys) >= kt whose key block is marked in `bits`; num_tiles when none.
// kv_end bounds the keys the tile may see (the bitmap covers ceil(kv_end / 128) blocks).
template <int KEYS>
__device__ __forceinline__ int next_marked_tile(const uint32_t* bits, int kt, int num_tiles,
                                                int kv_end) {
  constexpr int kTilesPerBlock = kSparseBlock / KEYS;
  const int nwords = (((kv_end + kSparseBlock - 1) / kSparseBlock) + 31) / 32;
  int kb = kt / kTilesPerBlock;
  int w = kb >> 5;
  uint32_t word = bits[w] & (~0u << (kb & 31));
  while (word == 0) {
    if (++w >= nwords) return num_tiles;
    word = bits[w];
  }
  kb = (w << 5) + __ffs(word) - 1;
  return min(num_tiles, max(kt, kb * kTilesPerBlock));
}

// Sets to -inf the scores of one thread's 16-row slice of a 16 x KEYS score tile that its rows
// may not see. `s` is in the accumulator layout that mma.sync m16n8 and wgmma m64nN share: element
// 4j + e holds key k0 + 8j + 2 t4 + (e & 1) of the thread's row e >> 1 (rows r and r + 8). Row i
// sees keys [first[i], lim[i]] (first: a sliding window's first key, else 0) when blk[i] (its
// block-sparse block is kept), none otherwise.
template <int KEYS>
__device__ __forceinline__ void mask_score_fragment(float* s, int k0, int t4, const int (&first)[2],
                                                    const int (&lim)[2], const bool (&blk)[2]) {
#pragma unroll
  for (int j = 0; j < KEYS / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + j * 8 + t4 * 2 + (e & 1);
      const int i = e >> 1;
      if (!blk[i] || key > lim[i] || key < first[i]) s[4 * j + e] = -INFINITY;
    }
}

}  // namespace longctx::kernels::cuda::detail
