#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/pdl.cuh"
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

// Scores, general shapes: a warp per page, pages_per_warp() pages per warp (any head_dim <= 256).
constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
// Pages per warp: 8 per KV head; 1 head-averaged (each page costs all q heads there).
__host__ __device__ constexpr int pages_per_warp(bool per_head) { return per_head ? 8 : 1; }
constexpr int kMaxLaneDims = 8;  // head_dim <= 256

// Scores, head_dim 32 / 64 / 128 / 256: a half-warp per page, each lane kDpl = head_dim / 16
// consecutive dims read by one vector load of the page's min and one of its max (16 bytes each
// for bf16 and head_dim 128). A half-warp loads all its pages before it waits on any (every CTA
// keeps kVecCtaPages pages of loads in flight), and the bound of a q head is summed as
// max(q, 0) max_d + min(q, 0) min_d, two FMAs, exactly q's larger product for finite metadata.
constexpr int kVecThreads = 128;
constexpr int kPageLanes = 16;
// Pages a half-warp holds: 64 metadata floats per lane (per KV head; head-averaged half as many
// pages, as it holds the next KV head's loads too).
__host__ __device__ constexpr int vec_pages(int dpl, bool per_head) {
  const int n = dpl >= 16 ? 2 : 32 / dpl;
  return per_head ? n : n / 2;
}
__host__ __device__ constexpr int vec_cta_pages(int dpl, bool per_head) {
  return kVecThreads / kPageLanes * vec_pages(dpl, per_head);
}

// Scores staged in shared memory by the select kernel up to this many candidates (640K tokens at
// pages of 16); more are read from global memory (L2) on each pass.
constexpr int kMaxSharedPages = 40960;
constexpr int kSelectThreads = 1024;
constexpr int kSelWarps = kSelectThreads / 32;
// The select kernel's histogram: kBinBits bits of the keys' range per pass.
constexpr int kBinBits = 11;
constexpr int kBins = 1 << kBinBits;
static_assert(2 * kSelectThreads == kBins, "the bin scan gives each thread two bins");
// A threshold bin of at most this many keys is ranked by one warp (one key a lane).
constexpr int kRankKeys = 32;
// Keys a thread loads before it uses any, when the select kernel reads them from global memory.
constexpr int kKeyLoads = 8;

// Orders floats as unsigned integers (larger float, larger key); -0 is +0's key, as the
// reference's float compare ties them.
__device__ __forceinline__ uint32_t score_key(float f) {
  const uint32_t u = __float_as_uint(__fadd_rn(f, 0.f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over a half-warp (kPageLanes lanes), every lane of the warp taking part.
__device__ __forceinline__ float half_sum(float v) {
#pragma unroll
  for (int o = kPageLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
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

// 0: no candidate is taken, 1: every candidate, 2: the num_free best-scored: only mode 2 needs
// scores.
__device__ __forceinline__ int select_mode(const QuestCount& c) {
  const int candidates = c.window_first - c.sink_pages;
  return c.all ? -1 : c.num_free == 0 ? 0 : c.num_free == candidates ? 1 : 2;
}

// Scores of the candidate pages, general shapes: grid (page tiles, KV heads (1 when
// head-averaged), batch), a warp per page, pages_per_warp() pages per warp. Head-averaged scores
// go to head 0's row.
template <typename T>
__global__ void __launch_bounds__(kScoreThreads) score_kernel(QuestSelectParams p) {
  extern __shared__ float q_s[];  // [heads read][d]
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, d = p.head_dim, hkv = p.num_kv_heads;
  const int group = p.num_qo_heads / hkv;
  pdl_wait();
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

// kWords 32-bit words from `src` (aligned to their size) by the widest loads that fit.
template <int kWords>
__device__ __forceinline__ void load_words(const void* src, uint32_t (&w)[kWords]) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = __ldg(static_cast<const uint4*>(src) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (kWords == 2) {
    const uint2 v = __ldg(static_cast<const uint2*>(src));
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(kWords == 1);
    w[0] = __ldg(static_cast<const unsigned int*>(src));
  }
}

// The elements of T packed in words (element 2i in word i's low half for 16-bit types) as floats.
template <typename T, int kN>
__device__ __forceinline__ void words_to_f32(const uint32_t* w, float (&f)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    if constexpr (sizeof(T) == 4) {
      f[i] = __uint_as_float(w[i]);
    } else {
      const uint32_t x = w[i / 2];
      const uint16_t bits = static_cast<uint16_t>(i % 2 == 0 ? x & 0xffffu : x >> 16);
      if constexpr (std::is_same_v<T, __nv_bfloat16>)
        f[i] = __uint_as_float(uint32_t(bits) << 16);
      else
        f[i] = __half2float(__ushort_as_half(bits));
    }
  }
}

// The lane's kDpl dims of the query at q_s + offset: max(q, 0) and min(q, 0).
template <int kDpl>
__device__ __forceinline__ void lane_query(const float* q_s, float (&qp)[kDpl], float (&qn)[kDpl]) {
#pragma unroll
  for (int i = 0; i < kDpl; ++i) {
    const float x = q_s[i];
    qp[i] = fmaxf(x, 0.f);
    qn[i] = fminf(x, 0.f);
  }
}

// s + the lane's part of the bound: q's larger product with (min, max) per dim.
template <int kDpl>
__device__ __forceinline__ float lane_bound(const float (&qp)[kDpl], const float (&qn)[kDpl],
                                            const float (&mn)[kDpl], const float (&mx)[kDpl],
                                            float s) {
#pragma unroll
  for (int i = 0; i < kDpl; ++i) {
    s = fmaf(qp[i], mx[i], s);
    s = fmaf(qn[i], mn[i], s);
  }
  return s;
}

// Scores per KV head (head_dim 16 kDpl): grid (page tiles, KV heads, batch); half-warp t of the
// CTA scores vec_pages() consecutive pages, their metadata loaded before the queries are staged.
template <typename T, int kDpl>
__global__ void __launch_bounds__(kVecThreads) score_head_kernel(QuestSelectParams p) {
  constexpr int kD = kPageLanes * kDpl, kPages = vec_pages(kDpl, true);
  constexpr int kWords = kDpl * int(sizeof(T)) / 4;
  extern __shared__ float q_s[];  // [group][kD]
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, sub = tid % kPageLanes;
  const int hkv = p.num_kv_heads, group = p.num_qo_heads / hkv, ppb = p.pages_per_block;
  pdl_wait();
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  if (select_mode(c) != 2) return;
  const int cta_first = c.sink_pages + blockIdx.x * vec_cta_pages(kDpl, true);
  if (cta_first >= c.window_first) return;
  const int first = cta_first + tid / kPageLanes * kPages;
  const int32_t* table = p.block_tables + p.block_indptr[b];
  const T* meta = static_cast<const T*>(p.meta);
  uint32_t wmn[kPages][kWords], wmx[kPages][kWords];
#pragma unroll
  for (int k = 0; k < kPages; ++k) {
    const int j = first + k;
    if (j < c.window_first) {
      const int64_t blk = table[j / ppb];
      const T* mp = meta + ((blk * ppb + j % ppb) * hkv + h) * 2 * kD + sub * kDpl;
      load_words<kWords>(mp, wmn[k]);
      load_words<kWords>(mp + kD, wmx[k]);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) wmn[k][i] = wmx[k][i] = 0;
    }
  }
  const T* q = static_cast<const T*>(p.q) + (int64_t(b) * p.num_qo_heads + h * group) * kD;
  for (int i = tid; i < group * kD; i += kVecThreads) q_s[i] = to_f32(q[i]);
  __syncthreads();
  float mn[kPages][kDpl], mx[kPages][kDpl], best[kPages];
#pragma unroll
  for (int k = 0; k < kPages; ++k) {
    words_to_f32<T>(wmn[k], mn[k]);
    words_to_f32<T>(wmx[k], mx[k]);
    best[k] = -INFINITY;
  }
  for (int g = 0; g < group; ++g) {
    float qp[kDpl], qn[kDpl];
    lane_query<kDpl>(q_s + g * kD + sub * kDpl, qp, qn);
#pragma unroll
    for (int k = 0; k < kPages; ++k)
      best[k] = fmaxf(best[k], half_sum(lane_bound<kDpl>(qp, qn, mn[k], mx[k], 0.f)));
  }
  if (sub != 0) return;
  float* sc = p.scores + (int64_t(b) * hkv + h) * p.max_pages;
#pragma unroll
  for (int k = 0; k < kPages; ++k)
    if (first + k < c.window_first) sc[first + k] = best[k];
}

// Head-averaged scores (head_dim 16 kDpl): grid (page tiles, 1, batch); half-warp t scores
// vec_pages() consecutive pages over every KV head, the next KV head's metadata in flight while
// one is summed. Each lane sums its dims over all q heads; the half-warp adds the lanes last.
template <typename T, int kDpl>
__global__ void __launch_bounds__(kVecThreads) score_mean_kernel(QuestSelectParams p) {
  constexpr int kD = kPageLanes * kDpl, kPages = vec_pages(kDpl, false);
  constexpr int kWords = kDpl * int(sizeof(T)) / 4;
  extern __shared__ float q_s[];  // [Hq][kD]
  const int b = blockIdx.z, tid = threadIdx.x, sub = tid % kPageLanes;
  const int hkv = p.num_kv_heads, group = p.num_qo_heads / hkv, ppb = p.pages_per_block;
  pdl_wait();
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  if (select_mode(c) != 2) return;
  const int cta_first = c.sink_pages + blockIdx.x * vec_cta_pages(kDpl, false);
  if (cta_first >= c.window_first) return;
  const int first = cta_first + tid / kPageLanes * kPages;
  const int32_t* table = p.block_tables + p.block_indptr[b];
  const T* meta = static_cast<const T*>(p.meta);
  const T* page_meta[kPages];  // KV head 0's min, the lane's dims (nullptr: past the candidates)
#pragma unroll
  for (int k = 0; k < kPages; ++k) {
    const int j = first + k;
    page_meta[k] =
        j < c.window_first
            ? meta + (int64_t(table[j / ppb]) * ppb + j % ppb) * hkv * 2 * kD + sub * kDpl
            : nullptr;
  }
  uint32_t wmn[kPages][kWords], wmx[kPages][kWords];
  auto load = [&](int kv) {
#pragma unroll
    for (int k = 0; k < kPages; ++k) {
      if (page_meta[k] != nullptr) {
        load_words<kWords>(page_meta[k] + int64_t(kv) * 2 * kD, wmn[k]);
        load_words<kWords>(page_meta[k] + int64_t(kv) * 2 * kD + kD, wmx[k]);
      } else {
#pragma unroll
        for (int i = 0; i < kWords; ++i) wmn[k][i] = wmx[k][i] = 0;
      }
    }
  };
  load(0);
  const T* q = static_cast<const T*>(p.q) + int64_t(b) * p.num_qo_heads * kD;
  for (int i = tid; i < p.num_qo_heads * kD; i += kVecThreads) q_s[i] = to_f32(q[i]);
  __syncthreads();
  float acc[kPages];
#pragma unroll
  for (int k = 0; k < kPages; ++k) acc[k] = 0.f;
  for (int kv = 0; kv < hkv; ++kv) {
    float mn[kPages][kDpl], mx[kPages][kDpl];
#pragma unroll
    for (int k = 0; k < kPages; ++k) {
      words_to_f32<T>(wmn[k], mn[k]);
      words_to_f32<T>(wmx[k], mx[k]);
    }
    if (kv + 1 < hkv) load(kv + 1);
    for (int g = 0; g < group; ++g) {
      float qp[kDpl], qn[kDpl];
      lane_query<kDpl>(q_s + (kv * group + g) * kD + sub * kDpl, qp, qn);
#pragma unroll
      for (int k = 0; k < kPages; ++k) acc[k] = lane_bound<kDpl>(qp, qn, mn[k], mx[k], acc[k]);
    }
  }
  float* sc = p.scores + int64_t(b) * hkv * p.max_pages;
#pragma unroll
  for (int k = 0; k < kPages; ++k) {
    const float sum = half_sum(acc[k]);
    if (sub == 0 && first + k < c.window_first)
      sc[first + k] = sum / static_cast<float>(p.num_qo_heads);
  }
}

// What the select kernel's passes share (besides the staged keys).
struct SelectShared {
  int hist[kBins];
  uint32_t warp_min[kSelWarps], warp_max[kSelWarps];
  int warp_sum[kSelWarps];
  int warp_eq[kSelWarps], warp_take[kSelWarps];
  uint32_t rank_key[kRankKeys];
  int rank_page[kRankKeys];
  int rank_count;
  int bin, bin_above, bin_count;  // a histogram pass's threshold bin
  uint32_t threshold;
  int threshold_page;
};

// Candidate i's key for every i < n this thread owns (i = threadIdx.x + k kSelectThreads): from
// the staged keys, or kKeyLoads at a time from the scores.
template <typename F>
__device__ __forceinline__ void for_each_key(const uint32_t* keys_s, const float* sc, int n,
                                             F&& f) {
  if (keys_s != nullptr) {
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += kSelectThreads) f(i, keys_s[i]);
    return;
  }
  for (int i0 = threadIdx.x; i0 < n; i0 += kKeyLoads * kSelectThreads) {
    uint32_t k[kKeyLoads];
#pragma unroll
    for (int u = 0; u < kKeyLoads; ++u) {
      const int i = i0 + u * kSelectThreads;
      k[u] = i < n ? score_key(sc[i]) : 0;
    }
#pragma unroll
    for (int u = 0; u < kKeyLoads; ++u)
      if (i0 + u * kSelectThreads < n) f(i0 + u * kSelectThreads, k[u]);
  }
}

// The lists from the scores: one CTA per (KV head, sequence). The sink pages open the list and
// the window pages close it; between them, in page order, the num_free candidates of the largest
// keys (ties: the earlier page), found as a threshold key T and page P: candidate j is taken iff
// its key is above T, or equal to T and j <= P.
//   1. the candidates' keys (staged in shared memory when they fit) and their min and max;
//   2. a histogram of kBins bins over the keys' range [lo, hi] (shared atomics) and a block scan
//      from the top give the bin that holds the num_free-th key; the range narrows to that bin
//      (each pass divides it by kBins, so at most 3 passes: 32 bits) until it holds at most
//      kRankKeys keys, which one warp ranks by (key, page) to find T and P, or one key value:
//      T, and P the page of the remaining-th key equal to T (an ordered count);
//   3. an ordered compaction: warp w owns a segment of candidates, counts its takes, and after
//      one barrier writes them at its offset.
// Latency-bound (a few CTAs a layer): every step is a pass over <= 8 keys a thread (130K keys)
// and one or two barriers.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(QuestSelectParams p) {
  extern __shared__ uint32_t keys_s[];  // [candidates] their keys, when they fit
  __shared__ SelectShared s;
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  pdl_wait();  // launched to overlap the score kernel (launch_pdl): nothing read before
  const QuestCount c = quest_count(p.kv_lens[b], p.budget);
  int32_t* out = p.selected + (int64_t(b) * p.num_kv_heads + h) * p.max_selected;
  const int mode = select_mode(c);
  if (mode < 0) {
    for (int j = tid; j < c.num_pages; j += kSelectThreads) out[j] = j;
    return;
  }
  const int cand_begin = c.sink_pages, cand_end = max(c.window_first, c.sink_pages);
  const int n = cand_end - cand_begin;
  for (int j = tid; j < c.sink_pages; j += kSelectThreads) out[j] = j;
  int32_t* window_out = out + c.sink_pages + c.num_free;
  for (int j = cand_end + tid; j < c.num_pages; j += kSelectThreads) window_out[j - cand_end] = j;
  int32_t* cand_out = out + c.sink_pages;
  if (mode == 1)
    for (int i = tid; i < n; i += kSelectThreads) cand_out[i] = cand_begin + i;
  if (mode != 2) return;

  // 1. Keys, min and max.
  const float* sc =
      p.scores + (int64_t(b) * p.num_kv_heads + (p.per_head ? h : 0)) * p.max_pages + cand_begin;
  const bool staged = n <= kMaxSharedPages;
  uint32_t lo = 0xffffffffu, hi = 0;
  for_each_key(nullptr, sc, n, [&](int i, uint32_t key) {
    if (staged) keys_s[i] = key;
    lo = min(lo, key);
    hi = max(hi, key);
  });
  const uint32_t* keys = staged ? keys_s : nullptr;
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  if (lane == 0) s.warp_min[warp] = lo, s.warp_max[warp] = hi;
  for (int i = tid; i < kBins; i += kSelectThreads) s.hist[i] = 0;
  if (tid == 0) s.rank_count = 0;
  __syncthreads();
  lo = __reduce_min_sync(0xffffffffu, s.warp_min[lane]);
  hi = __reduce_max_sync(0xffffffffu, s.warp_max[lane]);

  // 2. Narrow [lo, hi] to the threshold key. `remaining`: how many keys of [lo, hi] are taken
  // (every key above hi is).
  int remaining = c.num_free;
  uint32_t threshold = lo;
  int threshold_page = -1;  // -1: the page of the remaining-th key equal to the threshold
  while (lo != hi) {
    const int shift = max(0, 32 - __clz(hi - lo) - kBinBits);
    for_each_key(keys, sc, n, [&](int, uint32_t key) {
      if (key >= lo && key <= hi) atomicAdd(&s.hist[(key - lo) >> shift], 1);
    });
    __syncthreads();
    // Thread t holds bins kBins - 1 - 2t and kBins - 2 - 2t (descending keys), and zeroes them
    // for the next pass.
    const int top = kBins - 1 - 2 * tid;
    const int c0 = s.hist[top], c1 = s.hist[top - 1];
    s.hist[top] = s.hist[top - 1] = 0;
    int incl = c0 + c1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) s.warp_sum[warp] = incl;
    __syncthreads();
    const int before =
        __reduce_add_sync(0xffffffffu, lane < warp ? s.warp_sum[lane] : 0) + incl - (c0 + c1);
    if (before < remaining && before + c0 + c1 >= remaining) {
      const bool first_bin = before + c0 >= remaining;
      s.bin = first_bin ? top : top - 1;
      s.bin_above = first_bin ? before : before + c0;
      s.bin_count = first_bin ? c0 : c1;
    }
    __syncthreads();
    remaining -= s.bin_above;
    const int bin_count = s.bin_count;
    lo += uint32_t(s.bin) << shift;
    hi = uint32_t(min(uint64_t(hi), uint64_t(lo) + (uint64_t(1) << shift) - 1));
    if (lo == hi || bin_count > kRankKeys) continue;
    // A few keys: one warp ranks them by (key descending, page ascending).
    for_each_key(keys, sc, n, [&](int i, uint32_t key) {
      if (key >= lo && key <= hi) {
        const int at = atomicAdd(&s.rank_count, 1);
        s.rank_key[at] = key;
        s.rank_page[at] = cand_begin + i;
      }
    });
    __syncthreads();
    if (warp == 0) {
      const int m = s.rank_count;
      const uint32_t key = lane < m ? s.rank_key[lane] : 0;
      const int page = lane < m ? s.rank_page[lane] : 0;
      int rank = 0;
      for (int o = 0; o < m; ++o) {
        const uint32_t k = __shfl_sync(0xffffffffu, key, o);
        const int pg = __shfl_sync(0xffffffffu, page, o);
        rank += k > key || (k == key && pg < page);
      }
      if (lane < m && rank == remaining - 1) s.threshold = key, s.threshold_page = page;
    }
    __syncthreads();
    lo = hi = s.threshold;
    threshold_page = s.threshold_page;
  }
  threshold = lo;

  // 3. Ordered compaction over warp segments of the candidates. With threshold_page -1, the first
  // `remaining` keys equal to the threshold are taken: each warp counts its equal keys too, and
  // knows after the barrier how many come before its segment.
  const int seg = (n + kSelWarps - 1) / kSelWarps;
  const int seg_begin = min(n, warp * seg), seg_end = min(n, seg_begin + seg);
  const bool by_count = threshold_page < 0;
  const int last_page = by_count ? 0x7fffffff : threshold_page;
  // Keys are read kKeyLoads chunks of 32 at a time, so that from global memory they are in
  // flight together.
  auto chunk_keys = [&](int base, uint32_t(&k)[kKeyLoads]) {
#pragma unroll
    for (int u = 0; u < kKeyLoads; ++u) {
      const int i = base + 32 * u + lane;
      k[u] = i >= seg_end ? 0 : staged ? keys_s[i] : score_key(sc[i]);
    }
  };
  auto classify = [&](int i, uint32_t key, bool& sure, bool& eq) {
    sure = i < seg_end &&
           (key > threshold || (!by_count && key == threshold && cand_begin + i <= last_page));
    eq = i < seg_end && by_count && key == threshold;
  };
  int n_sure = 0, n_eq = 0;
  for (int base = seg_begin; base < seg_end; base += 32 * kKeyLoads) {
    uint32_t k[kKeyLoads];
    chunk_keys(base, k);
#pragma unroll
    for (int u = 0; u < kKeyLoads; ++u) {
      bool sure, eq;
      classify(base + 32 * u + lane, k[u], sure, eq);
      n_sure += __popc(__ballot_sync(0xffffffffu, sure));
      n_eq += __popc(__ballot_sync(0xffffffffu, eq));
    }
  }
  if (lane == 0) s.warp_eq[warp] = n_eq, s.warp_take[warp] = n_sure;
  __syncthreads();
  int eq_before = 0, pos = 0;
  for (int w = 0; w < warp; ++w) {
    const int eq_taken = max(0, min(s.warp_eq[w], remaining - eq_before));
    pos += s.warp_take[w] + eq_taken;
    eq_before += s.warp_eq[w];
  }
  const unsigned below = (1u << lane) - 1;
  for (int base = seg_begin; base < seg_end; base += 32 * kKeyLoads) {
    uint32_t k[kKeyLoads];
    chunk_keys(base, k);
#pragma unroll
    for (int u = 0; u < kKeyLoads; ++u) {
      const int i = base + 32 * u + lane;
      bool sure, eq;
      classify(i, k[u], sure, eq);
      const unsigned eq_mask = __ballot_sync(0xffffffffu, eq);
      const bool take = sure || (eq && eq_before + __popc(eq_mask & below) < remaining);
      const unsigned take_mask = __ballot_sync(0xffffffffu, take);
      if (take) cand_out[pos + __popc(take_mask & below)] = cand_begin + i;
      pos += __popc(take_mask);
      eq_before += __popc(eq_mask);
    }
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

// The vector score kernels' instance for head_dim d (16 kDpl), or nullptr (the general kernel).
template <typename T>
void (*vec_score_kernel(int d, bool per_head))(QuestSelectParams) {
  switch (d) {
    case 32:
      return per_head ? score_head_kernel<T, 2> : score_mean_kernel<T, 2>;
    case 64:
      return per_head ? score_head_kernel<T, 4> : score_mean_kernel<T, 4>;
    case 128:
      return per_head ? score_head_kernel<T, 8> : score_mean_kernel<T, 8>;
    case 256:
      return per_head ? score_head_kernel<T, 16> : score_mean_kernel<T, 16>;
    default:
      return nullptr;
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
  const int heads = p.per_head ? p.num_kv_heads : 1;
  dispatch(p.dtype, "quest select", [&](auto t) {
    using T = decltype(t);
    // The vector kernels' loads need the metadata aligned to 16 bytes (any engine buffer is).
    if (auto kernel = vec_score_kernel<T>(p.head_dim, p.per_head);
        kernel != nullptr && aligned16(p.meta)) {
      const int dpl = p.head_dim / kPageLanes, cta_pages = vec_cta_pages(dpl, p.per_head);
      require_dynamic_smem(kernel, static_cast<int>(smem));
      launch_pdl(kernel, dim3((p.max_pages + cta_pages - 1) / cta_pages, heads, p.batch),
                 dim3(kVecThreads), smem, stream, p);
      return;
    }
    const int pages_per_cta = kScoreWarps * pages_per_warp(p.per_head);
    auto kernel = score_kernel<T>;
    require_dynamic_smem(kernel, static_cast<int>(smem));
    launch_pdl(kernel, dim3((p.max_pages + pages_per_cta - 1) / pages_per_cta, heads, p.batch),
               dim3(kScoreThreads), smem, stream, p);
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void quest_select_lists_run(const QuestSelectParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  const size_t keys_smem = size_t(std::min(p.max_pages, kMaxSharedPages)) * sizeof(uint32_t);
  // The static part is ~9 KB: any staged keys can pass the default 48 KB in all.
  require_dynamic_smem(select_kernel, static_cast<int>(keys_smem));
  launch_pdl(select_kernel, dim3(p.num_kv_heads, p.batch), dim3(kSelectThreads), keys_smem, stream,
             p);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void quest_select_run(const QuestSelectParams& p, cudaStream_t stream) {
  quest_score_run(p, stream);
  quest_select_lists_run(p, stream);
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
