#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/quest.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using detail::fp8e4m3_decode;
using detail::from_f32;
using detail::to_f32;

// ---- metadata ----

template <typename T>
__global__ void meta_kernel(QuestMetaParams p) {
  const int e = blockIdx.x, h = blockIdx.y, d = p.head_dim;
  const int32_t* pg = p.pages + 4 * e;
  const int64_t src_block = pg[0], meta_block = pg[1], page = pg[2];
  const int rows = pg[3];
  if (rows <= 0) return;  // a filler entry (a graph-shaped step's fixed count)
  const int64_t row = int64_t(p.num_kv_heads) * d;
  const T* k = static_cast<const T*>(p.k_cache) + src_block * p.block_stride +
               page * p.page_tokens * row + int64_t(h) * d;
  T* m = static_cast<T*>(p.meta) +
         ((meta_block * p.pages_per_block + page) * p.num_kv_heads + h) * 2 * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    T lo = k[i], hi = lo;
    float flo = to_f32(lo), fhi = flo;
    for (int r = 1; r < rows; ++r) {
      const T v = k[r * row + i];
      const float f = to_f32(v);
      if (f < flo) flo = f, lo = v;
      if (f > fhi) fhi = f, hi = v;
    }
    m[i] = lo;
    m[d + i] = hi;
  }
}

// An FP8 cache: the min / max of the codes' values, times the block's scale (a power of two, so
// min and max commute with it and the products are exact in bf16 and f32), stored as T.
template <typename T>
__global__ void meta_fp8_kernel(QuestMetaParams p) {
  const int e = blockIdx.x, h = blockIdx.y, d = p.head_dim;
  const int32_t* pg = p.pages + 4 * e;
  const int64_t src_block = pg[0], meta_block = pg[1], page = pg[2];
  const int rows = pg[3];
  if (rows <= 0) return;  // a filler entry (a graph-shaped step's fixed count)
  const int64_t row = int64_t(p.num_kv_heads) * d;
  const uint8_t* k = static_cast<const uint8_t*>(p.k_cache) + src_block * p.block_stride +
                     page * p.page_tokens * row + int64_t(h) * d;
  const float scale = p.k_scale[src_block * p.scale_block_stride + h];
  T* m = static_cast<T*>(p.meta) +
         ((meta_block * p.pages_per_block + page) * p.num_kv_heads + h) * 2 * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float lo = fp8e4m3_decode(k[i]), hi = lo;
    for (int r = 1; r < rows; ++r) {
      const float f = fp8e4m3_decode(k[r * row + i]);
      if (f < lo) lo = f;
      if (f > hi) hi = f;
    }
    m[i] = from_f32<T>(lo * scale);
    m[d + i] = from_f32<T>(hi * scale);
  }
}

// ---- selection ----

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
// Pages per warp: 8 per KV head; 1 head-averaged (each page costs all q heads there).
__host__ __device__ constexpr int pages_per_warp(bool per_head) { return per_head ? 8 : 1; }
// Scores staged in shared memory by the select kernel up to this many pages (640K tokens at
// pages of 16); longer contexts read them from global memory (L2).
constexpr int kMaxSharedPages = 40960;
constexpr int kSelectThreads = 1024;
constexpr int kMaxLaneDims = 8;  // head_dim <= 256

// Orders floats as unsigned integers (larger float, larger key).
__device__ __forceinline__ uint32_t score_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// sum_d max(q_d mn_d, q_d mx_d) of the lane's dims, summed over the warp.
template <typename T>
__device__ __forceinline__ float page_bound(const float* q, const T* meta, int d, int lane) {
  float s = 0.f;
#pragma unroll
  for (int t = 0; t < kMaxLaneDims; ++t) {
    const int i = lane + 32 * t;
    if (i < d) {
      const float qi = q[i];
      s += fmaxf(qi * to_f32(meta[i]), qi * to_f32(meta[d + i]));
    }
  }
  return warp_sum(s);
}

// 0: no candidate is taken, 1: every candidate, 2: those above the threshold key (and the first
// `need_equal` equal to it): only mode 2 needs scores.
__device__ __forceinline__ int select_mode(const QuestCount& c) {
  const int candidates = c.window_first - c.sink_pages;
  return c.all ? -1 : c.num_free == 0 ? 0 : c.num_free == candidates ? 1 : 2;
}

// Scores of the candidate pages: grid (page tiles, KV heads (1 when head-averaged), batch), a
// warp per page, pages_per_warp() pages per warp. Head-averaged scores go to head 0's row.
template <typename T>
__global__ void __launch_bounds__(kScoreThreads) score_kernel(QuestSelectParams p) {
  extern __shared__ float q_s[];  // [heads read][d]
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, d = p.head_dim, hkv = p.num_kv_heads;
  const int group = p.num_qo_heads / hkv;
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  if (select_mode(c) != 2) return;
  const int ppw = pages_per_warp(p.per_head);
  const int first = c.sink_pages + blockIdx.x * kScoreWarps * ppw;
  if (first >= c.window_first) return;
  const int nq = p.per_head ? group : p.num_qo_heads, q0 = p.per_head ? h * group : 0;
  const T* q = static_cast<const T*>(p.q) + (int64_t(b) * p.num_qo_heads + q0) * d;
  for (int i = tid; i < nq * d; i += kScoreThreads) q_s[i] = to_f32(q[i]);
  __syncthreads();
  float* sc = p.scores + (int64_t(b) * hkv + h) * p.max_pages;
  const int32_t* table = p.block_tables + p.block_indptr[b];
  const T* meta = static_cast<const T*>(p.meta);
  for (int k = 0; k < ppw; ++k) {
    const int j = first + warp * ppw + k;
    if (j >= c.window_first) break;
    const int64_t blk = table[j / p.pages_per_block];
    const T* mp = meta + (blk * p.pages_per_block + j % p.pages_per_block) * hkv * 2 * d;
    float score;
    if (p.per_head) {
      score = -INFINITY;
      for (int g = 0; g < group; ++g)
        score = fmaxf(score, page_bound(q_s + g * d, mp + int64_t(h) * 2 * d, d, lane));
    } else {
      float sum = 0.f;
      for (int qh = 0; qh < p.num_qo_heads; ++qh)
        sum += page_bound(q_s + qh * d, mp + int64_t(qh / group) * 2 * d, d, lane);
      score = sum / static_cast<float>(p.num_qo_heads);
    }
    if (lane == 0) sc[j] = score;
  }
}

// The lists from the scores: one CTA per (KV head, sequence). Latency-bound (a handful of CTAs
// per layer), so every pass keeps the barriers few: warp-private histograms filled by
// match-aggregated atomics, and an ordered compaction in two ballot passes with one barrier.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(QuestSelectParams p) {
  extern __shared__ uint32_t keys_s[];  // [pages] the scores' keys, when they fit
  constexpr int kSelWarps = kSelectThreads / 32;
  __shared__ int hist[kSelWarps][256];
  __shared__ int total[256];
  __shared__ int found_bin, found_remaining;
  __shared__ int warp_eq[kSelWarps], warp_take[kSelWarps];

  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, hkv = p.num_kv_heads;
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  int32_t* out = p.selected + (int64_t(b) * hkv + h) * p.max_selected;
  const int mode = select_mode(c);
  if (mode < 0) {
    for (int j = tid; j < c.num_pages; j += kSelectThreads) out[j] = j;
    return;
  }
  const int cand_begin = c.sink_pages, cand_end = c.window_first;
  const float* sc = p.scores + (int64_t(b) * hkv + (p.per_head ? h : 0)) * p.max_pages;
  // Every pass below reads each candidate's key: from shared memory when they fit (one pass
  // over L2 here instead of six).
  const bool staged = mode == 2 && c.num_pages <= kMaxSharedPages;
  if (staged) {
    for (int j = cand_begin + tid; j < cand_end; j += kSelectThreads) keys_s[j] = score_key(sc[j]);
    __syncthreads();
  }
  auto key_of = [&](int j) { return staged ? keys_s[j] : score_key(sc[j]); };

  // Radix select of the num_free-th largest key among the candidates.
  uint32_t prefix = 0, mask = 0;
  int remaining = c.num_free;
  if (mode == 2) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = lane; i < 256; i += 32) hist[warp][i] = 0;
      __syncwarp();
      for (int base = cand_begin + warp * 32; base < cand_end; base += kSelectThreads) {
        const int j = base + lane;
        int digit = 256 + lane;  // unique: lanes outside the candidates match no one
        if (j < cand_end) {
          const uint32_t key = key_of(j);
          if ((key & mask) == prefix) digit = (key >> shift) & 255u;
        }
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (digit < 256 && lane == __ffs(peers) - 1) hist[warp][digit] += __popc(peers);
        __syncwarp();
      }
      __syncthreads();
      for (int i = tid; i < 256; i += kSelectThreads) {
        int n = 0;
        for (int w = 0; w < kSelWarps; ++w) n += hist[w][i];
        total[i] = n;
      }
      __syncthreads();
      if (warp == 0) {
        // Lane l holds bins 255 - 8l down to 248 - 8l (descending keys).
        int counts[8], lane_sum = 0;
#pragma unroll
        for (int t = 0; t < 8; ++t) lane_sum += counts[t] = total[255 - 8 * lane - t];
        int incl = lane_sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int n = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += n;
        }
        const int before = incl - lane_sum;
        if (before < remaining && incl >= remaining) {
          int cum = before;
          for (int t = 0; t < 8; ++t) {
            if (cum + counts[t] >= remaining) {
              found_bin = 255 - 8 * lane - t;
              found_remaining = remaining - cum;
              break;
            }
            cum += counts[t];
          }
        }
      }
      __syncthreads();
      prefix |= uint32_t(found_bin) << shift;
      mask |= 255u << shift;
      remaining = found_remaining;
    }
  }
  const uint32_t threshold = prefix;
  const int need_equal = remaining;

  // Ordered compaction. Warp w owns pages [w * seg, (w + 1) * seg); pass 1 counts its sure takes
  // (forced, above the threshold, or every candidate) and its keys equal to the threshold; after
  // one barrier each warp knows how many equal keys come before its segment (the first
  // need_equal equal keys, in page order, are taken) and where its output starts.
  const int seg = (c.num_pages + kSelWarps - 1) / kSelWarps;
  const int seg_begin = min(c.num_pages, warp * seg), seg_end = min(c.num_pages, seg_begin + seg);
  auto classify = [&](int j, bool& sure, bool& eq) {
    sure = eq = false;
    if (j >= seg_end) return;
    if (j < cand_begin || j >= cand_end || mode == 1) {  // forced, or every candidate
      sure = true;
      return;
    }
    if (mode == 0) return;
    const uint32_t key = key_of(j);
    sure = key > threshold;
    eq = key == threshold;
  };
  int n_sure = 0, n_eq = 0;
  for (int base = seg_begin; base < seg_end; base += 32) {
    bool sure, eq;
    classify(base + lane, sure, eq);
    n_sure += __popc(__ballot_sync(0xffffffffu, sure));
    n_eq += __popc(__ballot_sync(0xffffffffu, eq));
  }
  if (lane == 0) warp_eq[warp] = n_eq, warp_take[warp] = n_sure;
  __syncthreads();
  int eq_before = 0, pos = 0;
  for (int w = 0; w < warp; ++w) {
    const int eq_taken = max(0, min(warp_eq[w], need_equal - eq_before));
    pos += warp_take[w] + eq_taken;
    eq_before += warp_eq[w];
  }
  const unsigned below = (1u << lane) - 1;
  for (int base = seg_begin; base < seg_end; base += 32) {
    const int j = base + lane;
    bool sure, eq;
    classify(j, sure, eq);
    const unsigned eq_mask = __ballot_sync(0xffffffffu, eq);
    const bool take = sure || (eq && eq_before + __popc(eq_mask & below) < need_equal);
    const unsigned take_mask = __ballot_sync(0xffffffffu, take);
    if (take) out[pos + __popc(take_mask & below)] = j;
    pos += __popc(take_mask);
    eq_before += __popc(eq_mask);
  }
}

// ---- gather ----

// Page reuse: where sequence b's kept slot holds page `page` of KV head h, unchanged (the same
// block id now), or -1 (no slot read, not kept, or its block changed).
__device__ __forceinline__ int kept_index(const QuestGatherParams& p, int b, int h, int page) {
  if (p.reuse_read == nullptr || p.reuse_read[b] < 0) return -1;
  const int64_t list = (int64_t(p.reuse_read[b]) * p.num_kv_heads + h) * p.max_selected;
  const int j = quest_kept_index(p.kept_pages + list, p.max_selected, page);
  if (j < 0 || p.kept_blocks[list + j] != p.block_ids[p.block_indptr[b] + page / p.pages_per_block])
    return -1;
  return j;
}

// Rows [0, pt) of KV head h of a page from `from` to `to` (K and V; vectors V of words per
// head row, rows `row` vectors apart; offsets in vectors).
template <typename V>
__device__ __forceinline__ void copy_page(const void* from_k, const void* from_v, int64_t src,
                                          void* to_k, void* to_v, int64_t dst, int pt, int words,
                                          int64_t row) {
  const V* k = static_cast<const V*>(from_k);
  const V* v = static_cast<const V*>(from_v);
  V* ok = static_cast<V*>(to_k);
  V* ov = static_cast<V*>(to_v);
  for (int w = threadIdx.x; w < pt * words; w += blockDim.x) {
    const int r = w / words, col = w - r * words;
    const V kx = k[src + r * row + col];
    const V vx = v[src + r * row + col];
    ok[dst + r * row + col] = kx;
    ov[dst + r * row + col] = vx;
  }
}

// A page the kept slot holds: its rows (the compact buffers' dtype, es bytes an element) from the
// slot into the compact buffers at page index i; as V vectors when every row allows.
template <typename V>
__device__ __forceinline__ void copy_kept(const QuestGatherParams& p, int b, int h, int i, int j,
                                          int es) {
  constexpr int kv = sizeof(V);
  const int64_t row = int64_t(p.num_kv_heads) * p.head_dim * es / kv;
  const int words = p.head_dim * es / kv, pt = p.budget.page_tokens;
  const int64_t src =
      (int64_t(p.reuse_read[b]) * p.max_selected + j) * pt * row + int64_t(h) * words;
  const int64_t dst = (int64_t(b) * p.max_selected + i) * pt * row + int64_t(h) * words;
  copy_page<V>(p.kept_k, p.kept_v, src, p.out_k, p.out_v, dst, pt, words, row);
  if (p.reused_pages != nullptr && threadIdx.x == 0) atomicAdd(p.reused_pages, 1ull);
}

template <typename V>
__global__ void gather_kernel(QuestGatherParams p, int es) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  if (i >= c.num_selected) return;
  const int hkv = p.num_kv_heads, pt = p.budget.page_tokens;
  const int page = p.selected[(int64_t(b) * hkv + h) * p.max_selected + i];
  if (const int j = kept_index(p, b, h, page); j >= 0) return copy_kept<V>(p, b, h, i, j, es);
  const int32_t loc = p.block_loc[p.block_indptr[b] + page / p.pages_per_block];
  const int mem = loc >= 0 ? 0 : 1;
  const int64_t block = loc >= 0 ? loc : -int64_t(loc) - 1;
  if (mem == 1 && p.memory1_pages != nullptr && threadIdx.x == 0) atomicAdd(p.memory1_pages, 1ull);
  constexpr int kv = sizeof(V);
  const int64_t row = int64_t(hkv) * p.head_dim * es / kv;  // in vectors
  const int words = p.head_dim * es / kv;
  const int64_t src = (block * p.block_stride[mem] * es) / kv +
                      int64_t(page % p.pages_per_block) * pt * row + int64_t(h) * words;
  const int64_t dst = (int64_t(b) * p.max_selected + i) * pt * row + int64_t(h) * words;
  copy_page<V>(p.k_base[mem], p.v_base[mem], src, p.out_k, p.out_v, dst, pt, words, row);
}

// kCodes FP8 codes at `in` (16: one 16-byte load, aligned) -> their values times `scale` as T at
// `out` (exact for bf16 and f32: E4M3 values times a power of two).
template <typename T, int kCodes>
__device__ __forceinline__ void dequantize(const uint8_t* in, float scale, T* out) {
  if constexpr (kCodes == 16) {
    const uint4 c = *reinterpret_cast<const uint4*>(in);
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    alignas(16) T o[16];
#pragma unroll
    for (int j = 0; j < 16; ++j)
      o[j] = from_f32<T>(fp8e4m3_decode(uint8_t(w[j / 4] >> (8 * (j % 4)))) * scale);
    constexpr int kWords = 16 * int(sizeof(T)) / 16;
#pragma unroll
    for (int j = 0; j < kWords; ++j)
      reinterpret_cast<uint4*>(out)[j] = reinterpret_cast<const uint4*>(o)[j];
  } else {
    *out = from_f32<T>(fp8e4m3_decode(*in) * scale);
  }
}

// The gather over an FP8 cache: the selected pages' codes (and their blocks' scales) read where
// they are, written dequantized as T into the compact buffers (one CTA per (selected page, KV
// head, sequence), kCodes codes a thread and load).
// (A kept page is copied as it was written: dequantized T, 16-byte vectors with kCodes 16.)
template <typename T, int kCodes>
__global__ void gather_fp8_kernel(QuestGatherParams p) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  if (i >= c.num_selected) return;
  const int hkv = p.num_kv_heads, pt = p.budget.page_tokens, d = p.head_dim;
  const int page = p.selected[(int64_t(b) * hkv + h) * p.max_selected + i];
  if (const int j = kept_index(p, b, h, page); j >= 0) {
    if constexpr (kCodes == 16)
      return copy_kept<uint4>(p, b, h, i, j, int(sizeof(T)));
    else
      return copy_kept<T>(p, b, h, i, j, int(sizeof(T)));
  }
  const int32_t loc = p.block_loc[p.block_indptr[b] + page / p.pages_per_block];
  const int mem = loc >= 0 ? 0 : 1;
  const int64_t block = loc >= 0 ? loc : -int64_t(loc) - 1;
  if (mem == 1 && p.memory1_pages != nullptr && threadIdx.x == 0) atomicAdd(p.memory1_pages, 1ull);
  const int64_t row = int64_t(hkv) * d;
  const int64_t src =
      block * p.block_stride[mem] + int64_t(page % p.pages_per_block) * pt * row + int64_t(h) * d;
  const int64_t dst = (int64_t(b) * p.max_selected + i) * pt * row + int64_t(h) * d;
  const float ks = p.k_scale[mem][block * p.scale_block_stride[mem] + h];
  const float vs = p.v_scale[mem][block * p.scale_block_stride[mem] + h];
  const uint8_t* k = static_cast<const uint8_t*>(p.k_base[mem]);
  const uint8_t* v = static_cast<const uint8_t*>(p.v_base[mem]);
  T* ok = static_cast<T*>(p.out_k);
  T* ov = static_cast<T*>(p.out_v);
  const int chunks = d / kCodes;
  for (int w = threadIdx.x; w < pt * chunks; w += blockDim.x) {
    const int r = w / chunks, col = (w - r * chunks) * kCodes;
    dequantize<T, kCodes>(k + src + r * row + col, ks, ok + dst + r * row + col);
    dequantize<T, kCodes>(v + src + r * row + col, vs, ov + dst + r * row + col);
  }
}

// ---- keep ----

// One CTA per (selected page slot i, KV head, sequence): sequence b's kept list entry i of head h
// and, for a settled page, its rows from the compact buffers into the slot (QuestKeepParams).
template <typename V>
__global__ void keep_kernel(QuestKeepParams p, int es) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int slot = p.reuse_write[b];
  if (slot < 0) return;
  const int hkv = p.num_kv_heads, pt = p.budget.page_tokens;
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  const int64_t entry = (int64_t(slot) * hkv + h) * p.max_selected + i;
  if (i >= c.num_selected) {
    if (threadIdx.x == 0) {
      p.kept_pages[entry] = 0x7fffffff;  // past the count: the list stays ascending
      p.kept_blocks[entry] = -1;
    }
    return;
  }
  const int page = p.selected[(int64_t(b) * hkv + h) * p.max_selected + i];
  const bool settled =
      quest_page_settled(page, p.kv_lens[b], pt, p.pages_per_block, p.whole_blocks);
  if (threadIdx.x == 0) {
    p.kept_pages[entry] = page;
    p.kept_blocks[entry] = settled ? p.block_ids[p.block_indptr[b] + page / p.pages_per_block] : -1;
  }
  if (!settled) return;  // never a hit: its rows need not be kept
  constexpr int kv = sizeof(V);
  const int64_t row = int64_t(hkv) * p.head_dim * es / kv;
  const int words = p.head_dim * es / kv;
  const int64_t src = (int64_t(b) * p.max_selected + i) * pt * row + int64_t(h) * words;
  const int64_t dst = (int64_t(slot) * p.max_selected + i) * pt * row + int64_t(h) * words;
  copy_page<V>(p.compact_k, p.compact_v, src, p.kept_k, p.kept_v, dst, pt, words, row);
}

template <typename F>
void dispatch(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kBF16:
      return f(__nv_bfloat16{});
    case DType::kF16:
      return f(__half{});
    case DType::kF32:
      return f(float{});
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "{}: dtype {}", what, dtype_name(dtype));
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void quest_meta_run(const QuestMetaParams& p, cudaStream_t stream) {
  if (p.num_pages == 0) return;
  LONGCTX_CHECK(p.head_dim > 0 && p.num_kv_heads > 0 && p.page_tokens > 0,
                ErrorCode::kInvalidArgument, "quest meta: bad shape");
  const dim3 grid(p.num_pages, p.num_kv_heads);
  const int threads = std::min(256, (p.head_dim + 31) / 32 * 32);
  if (p.kv_format == KvCacheFormat::kFp8E4M3) {
    LONGCTX_CHECK(p.k_scale != nullptr, ErrorCode::kInvalidArgument,
                  "quest meta: an FP8 cache without its scales");
    dispatch(p.dtype, "quest meta",
             [&](auto t) { meta_fp8_kernel<decltype(t)><<<grid, threads, 0, stream>>>(p); });
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  dispatch(p.dtype, "quest meta",
           [&](auto t) { meta_kernel<decltype(t)><<<grid, threads, 0, stream>>>(p); });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void quest_score_run(const QuestSelectParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  LONGCTX_CHECK(p.head_dim >= 1 && p.head_dim <= 32 * kMaxLaneDims, ErrorCode::kUnsupported,
                "quest select: head_dim {} (at most {})", p.head_dim, 32 * kMaxLaneDims);
  LONGCTX_CHECK(p.num_kv_heads > 0 && p.num_qo_heads % p.num_kv_heads == 0,
                ErrorCode::kInvalidArgument, "quest select: {} q heads for {} kv heads",
                p.num_qo_heads, p.num_kv_heads);
  const int nq = p.per_head ? p.num_qo_heads / p.num_kv_heads : p.num_qo_heads;
  const size_t smem = size_t(nq) * p.head_dim * sizeof(float);
  LONGCTX_CHECK(smem <= 96 * 1024, ErrorCode::kUnsupported,
                "quest select: {} q heads x head_dim {} do not fit in shared memory", nq,
                p.head_dim);
  const int pages_per_cta = kScoreWarps * pages_per_warp(p.per_head);
  const dim3 score_grid((p.max_pages + pages_per_cta - 1) / pages_per_cta,
                        p.per_head ? p.num_kv_heads : 1, p.batch);
  dispatch(p.dtype, "quest select", [&](auto t) {
    auto kernel = score_kernel<decltype(t)>;
    require_dynamic_smem(kernel, static_cast<int>(smem));
    kernel<<<score_grid, kScoreThreads, smem, stream>>>(p);
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void quest_select_run(const QuestSelectParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  quest_score_run(p, stream);
  const size_t keys_smem = size_t(std::min(p.max_pages, kMaxSharedPages)) * sizeof(uint32_t);
  // The static histograms take ~33 KB: any staged keys can pass the default 48 KB in all.
  require_dynamic_smem(select_kernel, static_cast<int>(keys_smem));
  select_kernel<<<dim3(p.num_kv_heads, p.batch), kSelectThreads, keys_smem, stream>>>(p);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void quest_gather_run(const QuestGatherParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.max_selected == 0) return;
  const bool reuse = p.reuse_read != nullptr;
  LONGCTX_CHECK(!reuse || (p.block_ids != nullptr && p.kept_pages != nullptr &&
                           p.kept_blocks != nullptr && p.kept_k != nullptr && p.kept_v != nullptr),
                ErrorCode::kInvalidArgument, "quest gather: page reuse without its kept slots");
  // Kept rows are copied as the compact buffers' rows are written: the same vectors.
  const bool kept_aligned = !reuse || (aligned16(p.kept_k) && aligned16(p.kept_v));
  if (p.kv_format == KvCacheFormat::kFp8E4M3) {
    bool vec = p.head_dim % 16 == 0 && aligned16(p.out_k) && aligned16(p.out_v) && kept_aligned;
    for (int m = 0; m < 2; ++m)
      if (p.k_base[m] != nullptr) {
        LONGCTX_CHECK(p.k_scale[m] != nullptr && p.v_scale[m] != nullptr,
                      ErrorCode::kInvalidArgument, "quest gather: FP8 memory {} without scales", m);
        vec =
            vec && aligned16(p.k_base[m]) && aligned16(p.v_base[m]) && p.block_stride[m] % 16 == 0;
      }
    const dim3 grid(p.max_selected, p.num_kv_heads, p.batch);
    dispatch(p.dtype, "quest gather", [&](auto t) {
      using T = decltype(t);
      if (vec)
        gather_fp8_kernel<T, 16><<<grid, 128, 0, stream>>>(p);
      else
        gather_fp8_kernel<T, 1><<<grid, 128, 0, stream>>>(p);
    });
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int es = static_cast<int>(dtype_size(p.dtype));
  LONGCTX_CHECK(es == 2 || es == 4, ErrorCode::kUnsupported, "quest gather: dtype {}",
                dtype_name(p.dtype));
  const int64_t row_bytes = int64_t(p.head_dim) * es;
  bool vec = row_bytes % 16 == 0 && aligned16(p.out_k) && aligned16(p.out_v) && kept_aligned;
  for (int m = 0; m < 2; ++m)
    if (p.k_base[m] != nullptr)
      vec = vec && aligned16(p.k_base[m]) && aligned16(p.v_base[m]) &&
            (p.block_stride[m] * es) % 16 == 0;
  const dim3 grid(p.max_selected, p.num_kv_heads, p.batch);
  if (vec)
    gather_kernel<uint4><<<grid, 128, 0, stream>>>(p, es);
  else if (es == 2)
    gather_kernel<uint16_t><<<grid, 128, 0, stream>>>(p, es);
  else
    gather_kernel<uint32_t><<<grid, 128, 0, stream>>>(p, es);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void quest_keep_run(const QuestKeepParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.max_selected == 0) return;
  const int es = static_cast<int>(dtype_size(p.dtype));
  LONGCTX_CHECK(es == 2 || es == 4, ErrorCode::kUnsupported, "quest keep: dtype {}",
                dtype_name(p.dtype));
  const bool vec = (int64_t(p.head_dim) * es) % 16 == 0 && aligned16(p.compact_k) &&
                   aligned16(p.compact_v) && aligned16(p.kept_k) && aligned16(p.kept_v);
  const dim3 grid(p.max_selected, p.num_kv_heads, p.batch);
  if (vec)
    keep_kernel<uint4><<<grid, 128, 0, stream>>>(p, es);
  else if (es == 2)
    keep_kernel<uint16_t><<<grid, 128, 0, stream>>>(p, es);
  else
    keep_kernel<uint32_t><<<grid, 128, 0, stream>>>(p, es);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace longctx::kernels::cuda
