// The batched sampler: one 1024-thread block per row, passes over the row in global memory (L2
// resident for a decode batch) and exact integer arithmetic, so the token equals the CPU
// sampler's (kernels/cpu/sampling_cpu.cpp) and nothing depends on the order of a parallel sum.
//
// Sampling rows find their kept set as cutoffs in the order (logit desc, id asc):
//  - a value histogram of the candidates (2048 bins over [lo, max], counts or masses) locates
//    the bin where the cutoff falls; its members are gathered into shared memory, sorted, and
//    the cutoff found exactly. A bin of more than kCap members is re-binned over its own
//    [min, max] (strictly fewer members each time), or is all ties and handled by counting;
//  - top_k cuts by count (keeping every tie of the k-th value, as the CPU sampler), top_p by
//    mass (a tie is kept by lower id first). Only tokens within kMassWindow of the max can carry
//    mass, so the window bounds every histogram.
// The draw then finds the first id whose cumulative kept mass exceeds u * total: per-tile sums,
// a scan over tiles, a scan inside the chosen tile. When top_k is on and the candidates down to
// the k-th one fit shared memory (the usual case), all of them are gathered at once and top_k,
// top_p and the draw finish there: two passes after the first.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/sampling.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2 * kThreads;  // the bin scan holds two bins per thread
constexpr int kCap = 2 * kThreads;   // boundary-bin members sorted in shared memory
constexpr int kNoIndex = 0x7fffffff;
constexpr unsigned kFull = 0xffffffffu;

struct SharedStorage {
  union {
    // Histogram pass: counts (lo) or masses (hi:lo) per bin; 32-bit words keep the shared
    // atomics native (a 64-bit shared add is a compare-and-swap loop).
    struct {
      unsigned lo[kBins];
      unsigned hi[kBins];
    } hist;
    u64 sorted[kCap];     // members of the boundary bin, as sort keys
    u64 tiles[kThreads];  // draw: kept mass per tile of kThreads ids (vocab <= 2^20)
  };
  u64 red[kWarps];   // block reductions
  u64 scan[kWarps];  // block scans
  u64 b64[2];        // broadcasts
  int b32[2];
  unsigned fill;  // members gathered
};

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Every thread gets the result; a fixed tree, so sums of doubles are deterministic too.
template <typename T, typename Op>
__device__ T block_allreduce(T v, Op op, SharedStorage& sh) {
  static_assert(sizeof(T) <= sizeof(u64));
  v = warp_allreduce(v, op);
  T* red = reinterpret_cast<T*>(sh.red);
  __syncthreads();  // the previous reduction has read sh.red
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  return warp_allreduce(red[threadIdx.x & 31], op);
}

// Exclusive prefix sum over the block in thread order; *total gets the sum of all.
__device__ u64 block_exclusive_scan(u64 v, u64* total, SharedStorage& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += t;
  }
  __syncthreads();
  if (lane == 31) sh.scan[warp] = incl;
  __syncthreads();
  const u64 w = sh.scan[lane];
  u64 wincl = w;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(kFull, wincl, o);
    if (lane >= o) wincl += t;
  }
  const u64 warp_before = __shfl_sync(kFull, wincl, warp) - __shfl_sync(kFull, w, warp);
  *total = __shfl_sync(kFull, wincl, 31);
  return warp_before + incl - v;
}

__device__ __forceinline__ bool mask_allows(const uint32_t* __restrict__ mask, int i) {
  return ((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u) != 0;
}

// f(i, x, valid) for every id of the row, four loads in flight per thread; the trip count is the
// same for the whole block, so f may use warp collectives. With a token mask, a token it leaves
// out reads as -inf (a warp's 32 ids share one mask word, so the mask costs one broadcast load).
template <typename F>
__device__ __forceinline__ void for_each_value(const float* __restrict__ src,
                                               const uint32_t* __restrict__ mask, int n, F&& f) {
  for (int base = 0; base < n; base += 4 * kThreads) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + u * kThreads + int(threadIdx.x);
      v[u] = i < n && (mask == nullptr || mask_allows(mask, i)) ? __ldg(src + i) : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + u * kThreads + int(threadIdx.x);
      f(i, v[u], i < n);
    }
  }
}

// Adds a mass (< 2^64 in total) to bin b as two 32-bit words: the add that wraps the low word
// carries into the high one, so the sum is exact whatever the order.
__device__ __forceinline__ void add_mass(SharedStorage& sh, int b, u64 q) {
  const unsigned lo = unsigned(q), old = atomicAdd(&sh.hist.lo[b], lo);
  const unsigned hi = unsigned(q >> 32) + (old + lo < old ? 1u : 0u);
  if (hi != 0) atomicAdd(&sh.hist.hi[b], hi);
}
__device__ __forceinline__ u64 bin_total(const SharedStorage& sh, int b) {
  return (u64(sh.hist.hi[b]) << 32) | sh.hist.lo[b];
}

// Sorts a[0, n) ascending (n <= kCap); a[n, next power of two) is overwritten with padding.
__device__ void block_bitonic_sort(u64* a, int n) {
  const int tid = threadIdx.x;
  int np = 1;
  while (np < n) np <<= 1;
  for (int j = n + tid; j < np; j += kThreads) a[j] = ~0ull;
  __syncthreads();
  for (int size = 2; size <= np; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = tid; t < np; t += kThreads) {
        const int partner = t ^ stride;
        if (partner > t) {
          const u64 x = a[t], y = a[partner];
          if ((x > y) == ((t & size) == 0)) {
            a[t] = y;
            a[partner] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Largest value first, then lowest id; 0 is below every key.
__device__ __forceinline__ u64 max_key(float y, int i) {
  return (u64(float_order_key(y)) << 32) | u64(~uint32_t(i));
}
__device__ __forceinline__ float max_key_value(u64 k) {
  return float_from_order_key(uint32_t(k >> 32));
}
__device__ __forceinline__ int max_key_index(u64 k) { return int(~uint32_t(k)); }
// Ascending order = largest value first, then lowest id.
__device__ __forceinline__ u64 sort_key(float y, int i) {
  return (u64(~float_order_key(y)) << 32) | u64(uint32_t(i));
}
__device__ __forceinline__ float sort_key_value(u64 k) {
  return float_from_order_key(~uint32_t(k >> 32));
}
__device__ __forceinline__ int sort_key_index(u64 k) { return int(uint32_t(k)); }

struct Row {
  const float* src;      // [n]: the raw row or its penalized copy
  const uint32_t* mask;  // the row's allowed tokens (structured outputs); null: every token
  int n;
  float inv_temperature;  // 1 for greedy rows
  float max;              // max of eff() over the row (set after the first pass)
  __device__ float eff(float x) const { return __fmul_rn(x, inv_temperature); }
  // The logit of token i, -inf where the mask leaves it out.
  __device__ float at(int i) const {
    return mask == nullptr || mask_allows(mask, i) ? __ldg(src + i) : -INFINITY;
  }
};

// Tokens that can still carry mass: within the window below the max and at least `lo`.
struct Candidates {
  float max, lo;
  __device__ bool operator()(float y) const { return y >= lo && __fsub_rn(y, max) >= -kMassWindow; }
};

// Monotone: a larger value never lands in a later bin; hi -> bin 0, lo -> the last bin.
struct Binner {
  float hi, scale;
  __device__ int operator()(float y) const {
    const float t = __fmul_rn(__fsub_rn(hi, y), scale);
    return t >= float(kBins) ? kBins - 1 : (t > 0.0f ? int(t) : 0);
  }
};

// Kept: y > value, or y == value and id <= index.
struct Cutoff {
  bool found;
  float value;
  int index;
};

template <typename W, typename T>
__device__ int find_first_above(const Row& row, W weight, T target_of, SharedStorage& sh);

// The cutoff of the prefix (by logit desc, id asc) of the candidates that top_k (by_mass
// false: the first k, with every tie of the k-th) or top_p (by_mass true) keeps.
__device__ Cutoff find_cutoff(const Row& row, Candidates cand, bool by_mass, u64 k, double top_p,
                              SharedStorage& sh) {
  const int tid = threadIdx.x;
  float lo = fmaxf(cand.lo, __fsub_rn(row.max, kMassWindow)), hi = row.max;
  u64 above = 0;  // count or mass of candidates above the current range
  u64 total = 0;  // by_mass: the mass of every candidate
  auto weight = [&](float y) -> u64 {
    return by_mass ? u64(token_mass(__fsub_rn(y, row.max))) : 1ull;
  };
  auto reached = [&](u64 cum) { return by_mass ? !top_p_keeps(cum, total, top_p) : cum >= k; };
  for (int level = 0;; ++level) {
    const Binner bin{hi, __fdiv_rn(float(kBins), __fsub_rn(hi, lo))};
    // Level 0 takes every candidate (some may sit a rounding below lo: the last bin takes
    // them); deeper levels take the previous boundary bin, exactly [lo, hi].
    const bool whole = level == 0;
    const float range_lo = lo, range_hi = hi;
    auto member = [&](float y) { return cand(y) && (whole || (y >= range_lo && y <= range_hi)); };
    __syncthreads();  // shared memory of the previous step is read
    sh.hist.lo[tid] = sh.hist.lo[tid + kThreads] = 0;
    sh.hist.hi[tid] = sh.hist.hi[tid + kThreads] = 0;
    __syncthreads();
    for_each_value(row.src, row.mask, row.n, [&](int, float x, bool valid) {
      const float y = row.eff(x);
      if (!valid || !member(y)) return;
      if (by_mass) {
        add_mass(sh, bin(y), weight(y));
      } else {
        atomicAdd(&sh.hist.lo[bin(y)], 1u);
      }
    });
    __syncthreads();
    const u64 h0 = bin_total(sh, 2 * tid), h1 = bin_total(sh, 2 * tid + 1);
    u64 level_total;
    const u64 before = block_exclusive_scan(h0 + h1, &level_total, sh);
    if (whole && by_mass) total = level_total;
    int b = kNoIndex;
    if (reached(above + before + h0)) {
      b = 2 * tid;
    } else if (reached(above + before + h0 + h1)) {
      b = 2 * tid + 1;
    }
    b = block_allreduce(b, MinOp(), sh);
    if (b == kNoIndex) return {false, 0.0f, kNoIndex};  // fewer than k candidates
    if (b == 2 * tid) sh.b64[0] = before;
    if (b == 2 * tid + 1) sh.b64[0] = before + h0;
    if (tid == 0) sh.fill = 0;
    __syncthreads();  // also: every thread has read sh.hist before sh.sorted overwrites it
    above += sh.b64[0];

    // Gather the boundary bin's members (warp-aggregated slots).
    float vmin = INFINITY, vmax = -INFINITY;
    for_each_value(row.src, row.mask, row.n, [&](int i, float x, bool valid) {
      const float y = row.eff(x);
      const bool in = valid && member(y) && bin(y) == b;
      const unsigned mask = __ballot_sync(kFull, in);
      if (mask == 0) return;
      const int lane = threadIdx.x & 31, leader = __ffs(mask) - 1;
      unsigned slot = 0;
      if (lane == leader) slot = atomicAdd(&sh.fill, unsigned(__popc(mask)));
      slot = __shfl_sync(kFull, slot, leader) + __popc(mask & ((1u << lane) - 1u));
      if (in) {
        if (slot < unsigned(kCap)) sh.sorted[slot] = sort_key(y, i);
        vmin = fminf(vmin, y);
        vmax = fmaxf(vmax, y);
      }
    });
    __syncthreads();
    const int nb = int(sh.fill);
    if (nb <= kCap) {
      block_bitonic_sort(sh.sorted, nb);
      if (!by_mass) {
        // above < k <= above + nb: the k-th candidate is in the bin.
        return {true, sort_key_value(sh.sorted[int(k - above - 1)]), kNoIndex};
      }
      const int j0 = 2 * tid, j1 = 2 * tid + 1;
      const u64 q0 = j0 < nb ? weight(sort_key_value(sh.sorted[j0])) : 0;
      const u64 q1 = j1 < nb ? weight(sort_key_value(sh.sorted[j1])) : 0;
      u64 unused;
      const u64 ex = block_exclusive_scan(q0 + q1, &unused, sh);
      int last = -1;  // the last kept member; member 0 is kept (above has not reached top_p)
      if (j0 < nb && top_p_keeps(above + ex, total, top_p)) last = j0;
      if (j1 < nb && top_p_keeps(above + ex + q0, total, top_p)) last = j1;
      last = block_allreduce(last, MaxOp(), sh);
      const u64 key = sh.sorted[last];
      return {true, sort_key_value(key), sort_key_index(key)};
    }
    vmin = block_allreduce(vmin, MinOp(), sh);
    vmax = block_allreduce(vmax, MaxOp(), sh);
    if (vmin < vmax) {
      lo = vmin;
      hi = vmax;
      continue;
    }
    // nb > kCap members, all equal to v.
    const float v = vmin;
    if (!by_mass) return {true, v, kNoIndex};
    const u64 q = weight(v);
    // Members are kept while above + j * q stays below top_p: the largest such j, by bisection.
    if (tid == 0) {
      int good = 0, bad = nb;  // keeps(above + good * q), !keeps(above + bad * q) or bad = nb
      while (bad - good > 1) {
        const int mid = good + (bad - good) / 2;
        if (top_p_keeps(above + u64(mid) * q, total, top_p)) {
          good = mid;
        } else {
          bad = mid;
        }
      }
      sh.b32[0] = good;
    }
    __syncthreads();
    const int kept_rank = sh.b32[0];
    if (kept_rank == nb - 1) return {true, v, kNoIndex};
    const Candidates c = cand;
    const int index = find_first_above(
        row, [=](int, float y) -> u64 { return c(y) && y == v ? 1ull : 0ull; },
        [=](u64) -> u64 { return u64(kept_rank); }, sh);
    return {true, v, index};
  }
}

// The first id i where the inclusive prefix of weight(i, eff(x_i)) exceeds target_of(total).
template <typename W, typename T>
__device__ int find_first_above(const Row& row, W weight, T target_of, SharedStorage& sh) {
  const int n = row.n, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = (n + kThreads - 1) / kThreads;
  __syncthreads();  // shared memory of the previous step is read
  for (int t = warp; t < tiles; t += kWarps) {
    u64 s = 0;
#pragma unroll 8
    for (int r = 0; r < 32; ++r) {
      const int i = t * kThreads + r * 32 + lane;
      if (i < n) s += weight(i, row.eff(row.at(i)));
    }
    s = warp_allreduce(s, SumOp());
    if (lane == 0) sh.tiles[t] = s;
  }
  __syncthreads();
  const u64 mine = tid < tiles ? sh.tiles[tid] : 0;
  u64 total;
  const u64 before = block_exclusive_scan(mine, &total, sh);
  const u64 target = target_of(total);  // < total
  if (tid < tiles && before <= target && target < before + mine) {
    sh.b32[0] = tid;
    sh.b64[1] = target - before;
  }
  __syncthreads();
  const int tile = sh.b32[0];
  const u64 rest = sh.b64[1];
  const int i = tile * kThreads + tid;
  const u64 w = i < n ? weight(i, row.eff(row.at(i))) : 0;
  u64 unused;
  const u64 before_i = block_exclusive_scan(w, &unused, sh);
  if (before_i <= rest && rest < before_i + w) sh.b32[1] = i;
  __syncthreads();
  return sh.b32[1];
}

// top_k with a short prefix: when every candidate of the bins down to the k-th one fits shared
// memory (top_k up to ~kCap on real logits), top_k, top_p and the draw all finish there, in two
// passes. False (and nothing decided) when it does not fit or there are fewer than k candidates.
__device__ bool sample_small_top_k(const Row& row, Candidates cand, u64 k, double top_p, double u,
                                   SharedStorage& sh, int* token) {
  const int tid = threadIdx.x;
  const float lo = fmaxf(cand.lo, __fsub_rn(row.max, kMassWindow)), hi = row.max;
  const Binner bin{hi, __fdiv_rn(float(kBins), __fsub_rn(hi, lo))};
  __syncthreads();
  sh.hist.lo[tid] = sh.hist.lo[tid + kThreads] = 0;
  __syncthreads();
  for_each_value(row.src, row.mask, row.n, [&](int, float x, bool valid) {
    const float y = row.eff(x);
    if (valid && cand(y)) atomicAdd(&sh.hist.lo[bin(y)], 1u);
  });
  __syncthreads();
  const u64 h0 = sh.hist.lo[2 * tid], h1 = sh.hist.lo[2 * tid + 1];
  u64 unused;
  const u64 before = block_exclusive_scan(h0 + h1, &unused, sh);
  int b = kNoIndex;
  if (before + h0 >= k) {
    b = 2 * tid;
  } else if (before + h0 + h1 >= k) {
    b = 2 * tid + 1;
  }
  b = block_allreduce(b, MinOp(), sh);
  if (b == kNoIndex) return false;
  if (b == 2 * tid) sh.b64[0] = before + h0;
  if (b == 2 * tid + 1) sh.b64[0] = before + h0 + h1;
  if (tid == 0) sh.fill = 0;
  __syncthreads();
  const u64 prefix = sh.b64[0];  // candidates in bins <= b
  if (prefix > u64(kCap)) return false;
  for_each_value(row.src, row.mask, row.n, [&](int i, float x, bool valid) {
    const float y = row.eff(x);
    const bool in = valid && cand(y) && bin(y) <= b;
    const unsigned mask = __ballot_sync(kFull, in);
    if (mask == 0) return;
    const int lane = threadIdx.x & 31, leader = __ffs(mask) - 1;
    unsigned slot = 0;
    if (lane == leader) slot = atomicAdd(&sh.fill, unsigned(__popc(mask)));
    slot = __shfl_sync(kFull, slot, leader) + __popc(mask & ((1u << lane) - 1u));
    if (in && slot < unsigned(kCap)) sh.sorted[slot] = sort_key(y, i);
  });
  __syncthreads();
  const int n = int(sh.fill);  // == prefix <= kCap
  block_bitonic_sort(sh.sorted, n);
  // top_k keeps every value >= the k-th: the first nk entries. Thread t holds entries 2t, 2t+1.
  const float kth = sort_key_value(sh.sorted[int(k - 1)]);
  const int j0 = 2 * tid, j1 = 2 * tid + 1;
  const float y0 = j0 < n ? sort_key_value(sh.sorted[j0]) : -INFINITY;
  const float y1 = j1 < n ? sort_key_value(sh.sorted[j1]) : -INFINITY;
  const int nk = block_allreduce(j1 < n && y1 >= kth ? j1 + 1 : (j0 < n && y0 >= kth ? j0 + 1 : 0),
                                 MaxOp(), sh);
  int kept = nk;
  if (top_p < 1.0) {
    const u64 q0 = j0 < nk ? u64(token_mass(__fsub_rn(y0, row.max))) : 0;
    const u64 q1 = j1 < nk ? u64(token_mass(__fsub_rn(y1, row.max))) : 0;
    u64 total;
    const u64 ex = block_exclusive_scan(q0 + q1, &total, sh);
    int last = -1;  // entry 0 is always kept
    if (j0 < nk && top_p_keeps(ex, total, top_p)) last = j0;
    if (j1 < nk && top_p_keeps(ex + q0, total, top_p)) last = j1;
    kept = block_allreduce(last, MaxOp(), sh) + 1;
  }
  // The draw runs in id order: re-key the kept entries as (id, value) and sort again.
  const u64 key0 =
      j0 < kept ? (u64(sort_key_index(sh.sorted[j0])) << 32) | float_order_key(y0) : ~0ull;
  const u64 key1 =
      j1 < kept ? (u64(sort_key_index(sh.sorted[j1])) << 32) | float_order_key(y1) : ~0ull;
  __syncthreads();
  sh.sorted[j0] = key0;
  sh.sorted[j1] = key1;
  __syncthreads();
  block_bitonic_sort(sh.sorted, kept);
  const u64 e0 = sh.sorted[j0], e1 = sh.sorted[j1];
  const u64 m0 =
      j0 < kept ? u64(token_mass(__fsub_rn(float_from_order_key(uint32_t(e0)), row.max))) : 0;
  const u64 m1 =
      j1 < kept ? u64(token_mass(__fsub_rn(float_from_order_key(uint32_t(e1)), row.max))) : 0;
  u64 total;
  const u64 ex = block_exclusive_scan(m0 + m1, &total, sh);
  const u64 target = draw_target(u, total);
  if (ex <= target && target < ex + m0) sh.b32[1] = int(e0 >> 32);
  if (ex + m0 <= target && target < ex + m0 + m1) sh.b32[1] = int(e1 >> 32);
  __syncthreads();
  *token = sh.b32[1];
  return true;
}

// Penalized rows: copy the raw row and rewrite the penalized tokens (unique per row). A row's
// token mask is applied where its logits are read (Row::at), so a masked row needs no copy.
__global__ void __launch_bounds__(kThreads) apply_penalties_kernel(SamplingBatch b) {
  const int r = b.penalized_rows[blockIdx.x];
  const SamplingRowParams p = b.rows[r];
  const float* __restrict__ raw = b.logits + int64_t(r) * b.logits_stride;
  float* work = b.work + int64_t(p.work_row) * b.vocab;
  for (int i = threadIdx.x; i < b.vocab; i += kThreads) work[i] = __ldg(raw + i);
  __syncthreads();
  for (int e = threadIdx.x; e < p.penalty_count; e += kThreads) {
    const SamplingPenaltyEntry pe = b.penalties[p.penalty_begin + e];
    float x = __ldg(raw + pe.token);
    if (pe.repeated) {
      x = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
    }
    if (pe.count > 0 && (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)) {
      const double sub =
          __dadd_rn(__dmul_rn(p.frequency_penalty, double(pe.count)), p.presence_penalty);
      x = __fsub_rn(x, __double2float_rn(sub));
    }
    work[pe.token] = x;
  }
}

// Raw log_softmax of the token, its rank and the top-N (ties: lower id first).
__device__ void row_logprobs(const float* __restrict__ raw, int n, int token, int num_top,
                             bool raw_max_known, float raw_max, SamplingRowResult& res,
                             SharedStorage& sh) {
  if (!raw_max_known) {
    float mx = -INFINITY;
    for_each_value(raw, nullptr, n, [&](int, float x, bool valid) {
      if (valid) mx = fmaxf(mx, x);
    });
    raw_max = block_allreduce(mx, MaxOp(), sh);
  }
  const float x_token = __ldg(raw + token);
  double sum = 0.0;
  int larger = 0;
  u64 list[kSamplingMaxTop];  // this thread's best keys, descending
  for (int j = 0; j < num_top; ++j) list[j] = 0;
  for_each_value(raw, nullptr, n, [&](int i, float x, bool valid) {
    if (!valid) return;
    if (x != -INFINITY) sum += double(expf(__fsub_rn(x, raw_max)));
    larger += x > x_token ? 1 : 0;
    if (num_top > 0) {
      const u64 key = max_key(x, i);
      if (key > list[num_top - 1]) {
        int j = num_top - 1;
        while (j > 0 && list[j - 1] < key) {
          list[j] = list[j - 1];
          --j;
        }
        list[j] = key;
      }
    }
  });
  sum = block_allreduce(sum, SumOp(), sh);
  larger = block_allreduce(larger, SumOp(), sh);
  const double log_z = double(raw_max) + log(sum);
  res.logprob = float(double(x_token) - log_z);
  res.rank = 1 + larger;
  int head = 0, count = 0;
  for (int r = 0; r < num_top; ++r) {
    const u64 mine = head < num_top ? list[head] : 0;
    const u64 best = block_allreduce(mine, MaxOp(), sh);
    if (best == 0) break;  // fewer ids than num_top
    if (mine == best) ++head;
    res.top_ids[r] = max_key_index(best);
    res.top_logprobs[r] = float(double(max_key_value(best)) - log_z);
    count = r + 1;
  }
  res.num_top = count;
}

// Any filters: top_k and top_p cutoffs in global memory, then the draw over the whole row.
__device__ void sample_general(const Row& row, Candidates cand, const SamplingRowParams& p,
                               double u, SamplingRowResult& res, SharedStorage& sh) {
  if (p.top_k > 0) {
    const Cutoff k = find_cutoff(row, cand, false, u64(p.top_k), 1.0, sh);
    if (k.found) cand.lo = fmaxf(cand.lo, k.value);
  }
  Cutoff top{false, 0.0f, kNoIndex};
  if (p.top_p < 1.0) top = find_cutoff(row, cand, true, 0, p.top_p, sh);
  const float m = row.max;
  res.token = find_first_above(
      row,
      [=](int i, float y) -> u64 {
        const bool kept =
            cand(y) && (!top.found || y > top.value || (y == top.value && i <= top.index));
        return kept ? u64(token_mass(__fsub_rn(y, m))) : 0ull;
      },
      [=](u64 total) -> u64 { return u64(draw_target(u, total)); }, sh);
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(SamplingBatch b) {
  __shared__ SharedStorage sh;
  const int r = blockIdx.x, tid = threadIdx.x;
  const SamplingRowParams p = b.rows[r];
  const int n = b.vocab;
  const float* __restrict__ raw = b.logits + int64_t(r) * b.logits_stride;
  const bool penalized = p.work_row >= 0;
  const uint32_t* mask =
      p.mask_row >= 0 ? b.masks + int64_t(p.mask_row) * sampling_mask_words(n) : nullptr;
  Row row{penalized ? b.work + int64_t(p.work_row) * n : raw, mask, n,
          p.greedy ? 1.0f : p.inv_temperature, 0.0f};
  SamplingRowResult res;

  // Pass 1: checks, max and argmax (lowest id) of the transformed logits. As the CPU sampler,
  // NaN / +inf anywhere in the row is an error, masked out or not; the mask applies before the
  // overflow check and the max.
  u64 best = 0;
  int nan_at = kNoIndex, inf_at = kNoIndex, overflow_at = kNoIndex, any_finite = 0;
  for_each_value(row.src, nullptr, n, [&](int i, float x, bool valid) {
    if (!valid) return;
    const bool allowed = mask == nullptr || mask_allows(mask, i);
    if (isnan(x)) {
      nan_at = min(nan_at, i);
    } else if (x == INFINITY) {
      // Penalties keep a raw +inf +inf; otherwise they overflowed a finite logit.
      if (!penalized || __ldg(raw + i) == INFINITY) {
        inf_at = min(inf_at, i);
      } else if (allowed) {
        overflow_at = min(overflow_at, i);
      }
    } else if (x != -INFINITY) {
      any_finite = 1;
      const float y = row.eff(x);
      if (!allowed) return;
      if (y == INFINITY) {
        overflow_at = min(overflow_at, i);
      } else if (y != -INFINITY) {
        best = max(best, max_key(y, i));
      }
    }
  });
  best = block_allreduce(best, MaxOp(), sh);
  nan_at = block_allreduce(nan_at, MinOp(), sh);
  inf_at = block_allreduce(inf_at, MinOp(), sh);
  overflow_at = block_allreduce(overflow_at, MinOp(), sh);
  any_finite = block_allreduce(any_finite, MaxOp(), sh);
  if (!any_finite && penalized) {
    // Penalties may have pushed every finite logit to -inf: look at the raw row itself.
    for_each_value(raw, nullptr, n, [&](int, float x, bool valid) {
      if (valid && isfinite(x)) any_finite = 1;
    });
    any_finite = block_allreduce(any_finite, MaxOp(), sh);
  }
  // The CPU sampler's order: raw NaN / +inf (first id), raw all -inf, then the transformed row.
  res.status = kSamplingOk;
  if (min(nan_at, inf_at) != kNoIndex) {
    res.status = nan_at < inf_at ? kSamplingNaN : kSamplingPosInf;
    res.bad_index = min(nan_at, inf_at);
  } else if (!any_finite) {
    res.status = kSamplingAllNegInf;
  } else if (overflow_at != kNoIndex) {
    res.status = kSamplingOverflow;
    res.bad_index = overflow_at;
  } else if (best == 0) {
    res.status = kSamplingAllNegInfAfter;
  }
  if (res.status != kSamplingOk) {
    if (tid == 0) b.results[r] = res;
    return;
  }
  row.max = max_key_value(best);

  if (p.greedy) {
    res.token = max_key_index(best);
  } else {
    Candidates cand{row.max, -INFINITY};
    if (p.use_min_p) cand.lo = __double2float_ru(__dadd_rn(double(row.max), p.log_min_p));
    const double u = sampling_uniform(p.seed, p.step);
    int token = -1;
    if (p.top_k > 0 && sample_small_top_k(row, cand, u64(p.top_k), p.top_p, u, sh, &token)) {
      res.token = token;
    } else {
      sample_general(row, cand, p, u, res, sh);
    }
  }
  if (p.logprobs >= 0) {
    // row.max is the raw max only for a raw row with every token allowed.
    const bool raw_max_known = !penalized && mask == nullptr && row.inv_temperature == 1.0f;
    row_logprobs(raw, n, res.token, min(p.logprobs, kSamplingMaxTop), raw_max_known, row.max, res,
                 sh);
  }
  if (tid == 0) b.results[r] = res;
}

}  // namespace

void sample_rows(const SamplingBatch& b, cudaStream_t stream) {
  LONGCTX_CHECK(b.num_rows >= 0, ErrorCode::kInvalidArgument, "sample_rows: {} rows", b.num_rows);
  LONGCTX_CHECK(b.vocab >= 1 && b.vocab <= kMaxSamplingVocab, ErrorCode::kInvalidArgument,
                "sample_rows: vocabulary {} not in [1, {}]", b.vocab, kMaxSamplingVocab);
  LONGCTX_CHECK(b.logits_stride >= b.vocab, ErrorCode::kInvalidArgument,
                "sample_rows: row stride {} below the vocabulary {}", b.logits_stride, b.vocab);
  if (b.num_rows == 0) return;
  LONGCTX_CHECK(b.logits && b.rows && b.results &&
                    (b.num_penalized == 0 || (b.work && b.penalized_rows && b.penalties)),
                ErrorCode::kInvalidArgument, "sample_rows: missing device pointers");
  if (b.num_penalized > 0) {
    apply_penalties_kernel<<<b.num_penalized, kThreads, 0, stream>>>(b);
    LONGCTX_CUDA_CHECK_LAUNCH("apply_penalties_kernel");
  }
  sample_rows_kernel<<<b.num_rows, kThreads, 0, stream>>>(b);
  LONGCTX_CUDA_CHECK_LAUNCH("sample_rows_kernel");
}

}  // namespace longctx::kernels::cuda
