// CUDA decode GEMVs over packed quantized weights (kernels/quantized_gemv_params.h).
//
// Every kernel: a CTA owns a tile of outputs and a slice of K (blockIdx.y); its warps split the
// slice, add their sums through shared memory in warp order, and write the finished outputs (+
// bias) or, with several slices, fp32 partials [splits, n, out] that reduce_splits_kernel adds in
// slice order (deterministic: no float atomics). Weights are read once, with streaming loads
// (__ldcs, evict-first) or cp.async; nothing is allocated.
//
// kMma (int4): the exact (q - z) in x's 16-bit type is the A operand of mma.sync m16n8k16 (16
// outputs x 16 inputs), x the B operand (16 inputs x 8 rows of x: a pass's rows), fp32
// accumulation; each group's sum is scaled in fp32 and added to the total. The products are
// exact, so only the fp32 sums' order differs from the CPU twin. Nibbles become 16-bit values by
// one AND/OR each (the magic-number trick of Marlin: 0x4300 is 128.0 in bf16, 0x6400 1024.0 in
// f16, both with ulp 1, so OR-ing a nibble q into the mantissa gives 128 + q or 1024 + q), and one
// packed subtraction of (128 + z) leaves q - z exactly. The inputs of a thread's A registers may
// be any permutation of the K slice as long as its B registers hold x at the same inputs:
//   - GPTQ (word [r, o]: inputs 8r..8r+7 of output o): thread (g, t) of a warp loads 16 bytes
//     (outputs 4g..4g+3 of a 32-output block) of word row 4s + t; nibbles m, m + 4 form a pair,
//     and x[8r + m], x[8r + m + 4] are paired the same way by prmt.
//   - AWQ (word [i, p]: outputs 8p + {0,2,4,6,1,3,5,7} of input i): thread (g, t) loads 8 bytes
//     (outputs 16g..16g+15) of input rows 4t..4t+3; prmt puts the same nibble of two rows in one
//     word, so a pair is one output at two neighbouring inputs, as x's natural pairs are.
// kMmaAsync: kMma's math, the weights and group parameters copied by cp.async into a per-warp
// ring of shared memory kAsyncStages - 1 steps ahead of the math (kMma keeps one step ahead in
// registers).
// kSimt: int4 words decoded to the exact (q - z) in half2 (the same trick in f16), widened to f32
// and multiplied by x staged in shared memory as f32, the scale applied per 8 inputs (GPTQ) or
// per group (AWQ); FP8 E4M3 -> f16 -> f32 (exact) times x read from L1, the block scale per
// 16-input chunk or the channel scale at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/ceil_div.h"
#include "kernels/cuda/arrival_device.cuh"
#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/mma_device.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/quantized_gemv.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using detail::arrive_last;
using detail::cp_async_16;
using detail::cp_async_4;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::from_f32;
using detail::load_any;
using detail::Mma;
using detail::smem_addr;
using detail::to_f32;
using detail::visit_float;
using Params = QuantizedGemvParams;
using Format = QuantizedGemvFormat;

// SIMT kernels.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int64_t kSliceK = 1024;  // inputs of x a SIMT int4 CTA stages (N x 4 KiB)
constexpr int kFp8Rows = 2;        // output rows per warp (FP8): x chunks are read once per pair
constexpr int kFp8Chunks = 4;      // 16-byte chunks of each row in flight per lane (FP8)
constexpr int kGptqLoads = 8;      // 16-byte words in flight per lane (GPTQ)
// Bytes in flight per lane of the SIMT AWQ GEMV for N rows: 64 at two CTAs per SM (N <= 4), as
// many bytes per SM as 128 at one CTA, which the 8-row kernel keeps (~200 registers).
constexpr int awq_lane_bytes(int n) { return n >= 8 ? 128 : 64; }

// kMma kernels: 4 warps over one 128-output tile.
constexpr int kMmaWarps = 4;
constexpr int kMmaTile = 128;
constexpr int kRows = int(kQuantizedGemvPassRows);  // the B operand's 8 columns

// The finished output (+ bias) of row j, column o when there is one K slice, else the slice's
// partial.
template <typename TO>
__device__ __forceinline__ void write_out(const Params& p, int j, int64_t o, float v) {
  if (gridDim.y == 1) {
    const float b = p.bias ? load_any(p.bias, p.bias_dtype, o) : 0.f;
    static_cast<TO*>(p.out)[j * p.ldo + o] = from_f32<TO>(v + b);
  } else {
    p.partial[(int64_t(blockIdx.y) * p.n + j) * p.out_features + o] = v;
  }
}

// Asks L2 for `rows` rows of `row_bytes` bytes at base + r * stride (the 16-byte-aligned part of
// each), one bulk prefetch a row spread over the CTA's threads: the CTA's weights stream while x
// is staged, and the loads after it find them in L2 or in flight, more bytes in flight than
// registers hold. A hint that reads nothing into the kernel, so it may run before pdl_wait
// (kBeforeWait: L2 is where every SM's stores land, so a line an earlier kernel writes after the
// prefetch is updated there).
__device__ __forceinline__ void prefetch_l2(bool on, const void* base, int64_t stride,
                                            int64_t row_bytes, int64_t rows) {
  if (!on || row_bytes <= 0) return;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(base) + r * stride;
    const uintptr_t b = (a + 15) & ~uintptr_t(15), e = (a + row_bytes) & ~uintptr_t(15);
    if (e <= b) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(b), "r"(uint32_t(e - b))
                 : "memory");
#else
    for (uintptr_t c = b; c < e; c += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(c));
#endif
  }
}

// The CTA's slice of a GPTQ qweight (word rows k0/8.., outputs col0..col0 + tile), of an AWQ
// qweight (input rows k0.., words col0/8..) and of an FP8 weight (rows o0..o0 + tile, bytes
// k0..k1).
using Prefetch = QuantizedGemvPrefetch;

__device__ __forceinline__ void prefetch_gptq(const Params& p, Prefetch when, int64_t k0,
                                              int64_t k1, int64_t col0, int64_t tile) {
  prefetch_l2(p.prefetch == when,
              static_cast<const uint32_t*>(p.qweight) + (k0 / 8) * p.out_features + col0,
              p.out_features * 4, min(tile, p.out_features - col0) * 4, (k1 - k0) / 8);
}
__device__ __forceinline__ void prefetch_awq(const Params& p, Prefetch when, int64_t k0, int64_t k1,
                                             int64_t col0, int64_t tile) {
  prefetch_l2(p.prefetch == when,
              static_cast<const uint32_t*>(p.qweight) + k0 * (p.out_features / 8) + col0 / 8,
              p.out_features / 2, min(tile, p.out_features - col0) / 2, k1 - k0);
}
__device__ __forceinline__ void prefetch_fp8(const Params& p, Prefetch when, int64_t k0, int64_t k1,
                                             int64_t o0, int64_t tile) {
  prefetch_l2(p.prefetch == when, static_cast<const uint8_t*>(p.qweight) + o0 * p.in + k0, p.in,
              k1 - k0, min(tile, p.out_features - o0));
}

// With several K slices and tile counters (kLastCta), called by every thread of the CTA after its
// partials of outputs [col0, col0 + tile) are written: the CTA that arrives last at the tile's
// counter (arrive_last, which also resets it for the next launch and makes every slice's
// partials visible to that CTA) adds every slice's partials in slice order (+ bias;
// reduce_splits_kernel's order, so the same bits) and writes the outputs. It reads them through
// L2 (__ldcg: another SM's stores are not in this SM's L1).
template <typename TO>
__device__ __forceinline__ void finish_splits(const Params& p, int64_t col0, int tile) {
  if (gridDim.y == 1 || p.tile_counters == nullptr) return;
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = arrive_last(p.tile_counters + blockIdx.x, gridDim.y);
  __syncthreads();
  if (!last) return;
  for (int i = threadIdx.x; i < p.n * tile; i += blockDim.x) {
    const int j = i / tile;
    const int64_t o = col0 + (i - j * tile);
    if (o >= p.out_features) continue;
    const float* part = p.partial + int64_t(j) * p.out_features + o;
    float v = 0.f;
    for (int64_t sl = 0; sl < gridDim.y; ++sl) v += __ldcg(part + sl * p.n * p.out_features);
    if (p.bias) v += load_any(p.bias, p.bias_dtype, o);
    static_cast<TO*>(p.out)[j * p.ldo + o] = from_f32<TO>(v);
  }
}

// ---------------------------------------------------------------------------------------------
// SIMT int4 helpers.

__device__ __forceinline__ half2 as_half2(uint32_t u) {
  half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// Four half2 of word v's nibbles as 1024 + q (masks 0x000f000f: nibbles 0/4 and, after >> 8, 2/6)
// and 1024 + 16 q (masks 0x00f000f0: nibbles 1/5 and 3/7), in that order.
__device__ __forceinline__ void magic_nibbles(uint32_t v, half2 (&h)[4]) {
  constexpr uint32_t kLo = 0x000f000fu, kHi = 0x00f000f0u, kMagic = 0x64006400u;
  const uint32_t v8 = v >> 8;
  h[0] = as_half2((v & kLo) | kMagic);
  h[1] = as_half2((v & kHi) | kMagic);
  h[2] = as_half2((v8 & kLo) | kMagic);
  h[3] = as_half2((v8 & kHi) | kMagic);
}

// The negated zero terms of magic_nibbles' four half2 for zero points z = (za, zb) per half:
// -(1024 + z) for the plain halves, -(64 + z) for the x16 ones.
struct ZeroTerms {
  half2 lo, hi;
};

// q - z for the four half2 of magic_nibbles (exact: every value is an integer below 2048).
__device__ __forceinline__ void nibbles_minus_zero(const half2 (&h)[4], const ZeroTerms (&z)[2],
                                                   float (&d)[8]) {
  const half2 sixteenth = __float2half2_rn(0.0625f);
  float2 f;
  f = __half22float2(__hadd2(h[0], z[0].lo));
  d[0] = f.x, d[1] = f.y;
  f = __half22float2(__hfma2(h[1], sixteenth, z[0].hi));
  d[2] = f.x, d[3] = f.y;
  f = __half22float2(__hadd2(h[2], z[1].lo));
  d[4] = f.x, d[5] = f.y;
  f = __half22float2(__hfma2(h[3], sixteenth, z[1].hi));
  d[6] = f.x, d[7] = f.y;
}

// Stages x[:, k0:k1] as f32 rows of kSliceK in shared memory (rows past p.n as zeros).
template <int N, typename T>
__device__ __forceinline__ void stage_x(const Params& p, int64_t k0, int64_t k1, float* xs) {
  const int len = int(k1 - k0);
  const T* x = static_cast<const T*>(p.x);
  for (int i = threadIdx.x; i < N * len; i += kThreads) {
    const int j = i / len, k = i - j * len;
    xs[j * kSliceK + k] = j < p.n ? to_f32(x[j * p.ldx + k0 + k]) : 0.f;
  }
  __syncthreads();
}

// Adds the warps' sums acc (per thread: C columns x N rows, columns lane * C + c of the tile) in
// warp order through `red` [N][32 C], then writes the tile's columns from col0.
template <int N, int C, typename TO>
__device__ __forceinline__ void finish_tile(const Params& p, float (&acc)[C][N], float* red,
                                            int64_t col0) {
  constexpr int kTile = 32 * C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int w = 0; w < kWarps; ++w) {
    __syncthreads();
    if (warp == w) {
#pragma unroll
      for (int j = 0; j < N; ++j)
#pragma unroll
        for (int c = 0; c < C; ++c) {
          float& r = red[j * kTile + lane * C + c];
          r = w == 0 ? acc[c][j] : r + acc[c][j];
        }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < N * kTile; i += kThreads) {
    const int j = i / kTile, c = i - j * kTile;
    const int64_t o = col0 + c;
    if (o >= p.out_features || j >= p.n) continue;
    write_out<TO>(p, j, o, red[i]);
  }
  finish_splits<TO>(p, col0, kTile);
}

// ---------------------------------------------------------------------------------------------
// SIMT GPTQ: a lane reads 4 columns of a word row (16 bytes); a warp 128 columns.

// The zeros (as magic_nibbles' zero terms) and scales of outputs o..o + C - 1 for the group of
// word row r, and the first word row past that group. A function rather than a lambda capturing
// the arrays by reference (see awq_flush).
template <int C>
__device__ __forceinline__ void gptq_group_params(const Params& p, int64_t r, int64_t group_rows,
                                                  int64_t o, int64_t& grp_end,
                                                  ZeroTerms (&zt)[C][2], float (&s)[C]) {
  const int64_t grp = r / group_rows;  // a division per group, not per word
  grp_end = (grp + 1) * group_rows;
  const uint32_t zw = __ldg(p.qzeros + grp * (p.out_features / 8) + o / 8) >> (4 * (o % 8));
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const float z = float(((zw >> (4 * c)) & 0xf) + p.zero_offset);
    zt[c][0].lo = zt[c][1].lo = __float2half2_rn(-1024.f - z);
    zt[c][0].hi = zt[c][1].hi = __float2half2_rn(-64.f - z);
    s[c] = load_any(p.scales, p.scale_dtype, grp * p.out_features + o + c);
  }
}

template <int N, typename T, typename TO>
__global__ void __launch_bounds__(kThreads) gptq_simt_kernel(Params p, int64_t k_per_split) {
  constexpr int C = 4, U = kGptqLoads;
  __shared__ __align__(16) float xs[N * kSliceK];
  __shared__ float red[N * 32 * C];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k0 = int64_t(blockIdx.y) * k_per_split;
  const int64_t k1 = min(p.in, k0 + k_per_split);
  prefetch_gptq(p, Prefetch::kBeforeWait, k0, k1, int64_t(blockIdx.x) * 32 * C, 32 * C);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_gptq(p, Prefetch::kAfterWait, k0, k1, int64_t(blockIdx.x) * 32 * C, 32 * C);
  const int64_t col0 = int64_t(blockIdx.x) * 32 * C, o = col0 + lane * C;
  const int64_t r_begin = k0 / 8, rows = (k1 - k0) / 8;
  const int64_t per_warp = ceil_div(rows, kWarps);
  const int64_t r0 = r_begin + min(rows, warp * per_warp);
  const int64_t r1 = r_begin + min(rows, (warp + 1) * per_warp);
  const bool live = o < p.out_features;
  const uint4* qw =
      reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(p.qweight) + (live ? o : 0));
  const int64_t row_words = p.out_features / 4;  // uint4 per qweight row
  const int64_t group_rows = p.group / 8;        // word rows per group
  // The first words and the first group's zeros and scales are in flight while x is staged.
  uint4 wv[U];
  ZeroTerms zt[C][2];
  float s[C];
  int64_t grp_end = -1;  // first word row past the current group
  if (live) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r0 + u < r1) wv[u] = __ldcs(qw + (r0 + u) * row_words);
    if (r0 < r1) gptq_group_params<C>(p, r0, group_rows, o, grp_end, zt, s);
  }
  stage_x<N, T>(p, k0, k1, xs);
  float acc[C][N];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[c][j] = 0.f;
  if (live) {
    for (int64_t r = r0; r < r1; r += U) {
      if (r != r0) {
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (r + u < r1) wv[u] = __ldcs(qw + (r + u) * row_words);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r + u >= r1) break;
        if (r + u >= grp_end) gptq_group_params<C>(p, r + u, group_rows, o, grp_end, zt, s);
        const float* xr = xs + (r + u - r_begin) * 8;
        const uint32_t words[C] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
        for (int c = 0; c < C; ++c) {
          half2 h[4];
          magic_nibbles(words[c], h);
          float d[8];  // d[2m], d[2m+1] = nibbles m, m + 4: inputs m and m + 4
          nibbles_minus_zero(h, zt[c], d);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const float4 xa = *reinterpret_cast<const float4*>(xr + j * kSliceK);
            const float4 xb = *reinterpret_cast<const float4*>(xr + j * kSliceK + 4);
            float part = xa.x * d[0];
            part = fmaf(xb.x, d[1], part);
            part = fmaf(xa.y, d[2], part);
            part = fmaf(xb.y, d[3], part);
            part = fmaf(xa.z, d[4], part);
            part = fmaf(xb.z, d[5], part);
            part = fmaf(xa.w, d[6], part);
            part = fmaf(xb.w, d[7], part);
            acc[c][j] = fmaf(s[c], part, acc[c][j]);
          }
        }
      }
    }
  }
  finish_tile<N, C, TO>(p, acc, red, col0);
}

// ---------------------------------------------------------------------------------------------
// SIMT AWQ: a lane reads V words of a row (4 V bytes: 8 V columns); a warp 256 V columns.

template <int V>
struct Words;
template <>
struct Words<1> {
  using type = uint32_t;
  static __device__ __forceinline__ uint32_t get(const type& t, int) { return t; }
};
template <>
struct Words<2> {
  using type = uint2;
  static __device__ __forceinline__ uint32_t get(const type& t, int i) { return i ? t.y : t.x; }
};
template <>
struct Words<4> {
  using type = uint4;
  static __device__ __forceinline__ uint32_t get(const type& t, int i) {
    return i == 0 ? t.x : i == 1 ? t.y : i == 2 ? t.z : t.w;
  }
};

// Adds group grp's unscaled sums gp (columns o..o + C - 1) times their scales into acc and
// clears gp. A function rather than a lambda capturing the arrays by reference: ptxas keeps the
// arrays in registers then (the lambda spilled them).
template <int N, int C>
__device__ __forceinline__ void awq_flush(const Params& p, int64_t grp, int64_t o,
                                          float (&acc)[C][N], float (&gp)[C][N]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const float s = load_any(p.scales, p.scale_dtype, grp * p.out_features + o + c);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      acc[c][j] = fmaf(s, gp[c][j], acc[c][j]);
      gp[c][j] = 0.f;
    }
  }
}

// Two CTAs per SM for N <= 4: at one (ptxas' own choice) the N = 1 and 4 kernels capped
// themselves at 80 / 128 registers and spilled 28-56 bytes; N = 8 needs ~200 registers.
template <int N, int V, typename T, typename TO>
__global__ void __launch_bounds__(kThreads, N >= 8 ? 1 : 2)
    awq_simt_kernel(Params p, int64_t k_per_split) {
  constexpr int C = 8 * V, U = awq_lane_bytes(N) / (4 * V);
  using W = typename Words<V>::type;
  __shared__ __align__(16) float xs[N * kSliceK];
  __shared__ float red[N * 32 * C];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k0 = int64_t(blockIdx.y) * k_per_split;
  const int64_t k1 = min(p.in, k0 + k_per_split);
  prefetch_awq(p, Prefetch::kBeforeWait, k0, k1, int64_t(blockIdx.x) * 32 * C, 32 * C);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_awq(p, Prefetch::kAfterWait, k0, k1, int64_t(blockIdx.x) * 32 * C, 32 * C);
  stage_x<N, T>(p, k0, k1, xs);
  const int64_t col0 = int64_t(blockIdx.x) * 32 * C, o = col0 + lane * C;
  const int64_t rows = k1 - k0, per_warp = ceil_div(rows, kWarps);
  const int64_t i0 = k0 + min(rows, warp * per_warp), i1 = k0 + min(rows, (warp + 1) * per_warp);
  float acc[C][N], gp[C][N];  // the total, and the current group's unscaled sum
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[c][j] = gp[c][j] = 0.f;
  if (o < p.out_features) {
    const int64_t row_words = p.out_features / 8;
    const W* qw = reinterpret_cast<const W*>(static_cast<const uint32_t*>(p.qweight) + o / 8);
    const int64_t w_stride = row_words / V;  // W per qweight row (out % (8 V) == 0)
    int64_t cur = -1, grp_end = -1;
    ZeroTerms zt[V][2];
    for (int64_t i = i0; i < i1; i += U) {
      W wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u < i1) wv[u] = __ldcs(qw + (i + u) * w_stride);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u >= i1) break;
        if (i + u >= grp_end) {  // a division per group, not per row
          if (cur >= 0) awq_flush<N, C>(p, cur, o, acc, gp);
          cur = (i + u) / p.group;
          grp_end = (cur + 1) * p.group;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const uint32_t zw = __ldg(p.qzeros + cur * row_words + o / 8 + v);
            half2 zh[4];
            magic_nibbles(zw, zh);  // 1024 + z, 1024 + 16 z
            const half2 neg = __float2half2_rn(-1.f), sixteenth = __float2half2_rn(0.0625f);
            zt[v][0].lo = __hmul2(zh[0], neg);
            zt[v][0].hi = __hmul2(__hmul2(zh[1], sixteenth), neg);
            zt[v][1].lo = __hmul2(zh[2], neg);
            zt[v][1].hi = __hmul2(__hmul2(zh[3], sixteenth), neg);
          }
        }
        float xv[N];
#pragma unroll
        for (int j = 0; j < N; ++j) xv[j] = xs[j * kSliceK + (i + u - k0)];
#pragma unroll
        for (int v = 0; v < V; ++v) {
          half2 h[4];
          magic_nibbles(Words<V>::get(wv[u], v), h);
          float d[8];  // columns 8 (o/8 + v) + 0..7 in order
          nibbles_minus_zero(h, zt[v], d);
#pragma unroll
          for (int c = 0; c < 8; ++c)
#pragma unroll
            for (int j = 0; j < N; ++j) gp[v * 8 + c][j] = fmaf(xv[j], d[c], gp[v * 8 + c][j]);
        }
      }
    }
    if (cur >= 0) awq_flush<N, C>(p, cur, o, acc, gp);
  }
  finish_tile<N, C, TO>(p, acc, red, col0);
}

// ---------------------------------------------------------------------------------------------
// SIMT FP8 E4M3: weight [out, in] row-major. Warp w of a CTA owns rows (blockIdx.x * kWarps + w) *
// kFp8Rows + r; its lanes read 16-input chunks lane, lane + 32, ... of the CTA's K slice.

// 16 E4M3 values -> f32 (exact, through f16).
__device__ __forceinline__ void fp8x16_to_f32(const uint4& v, float (&f)[16]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw raw =
          __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w[i] >> (16 * h)), __NV_E4M3);
      half2 hv;
      memcpy(&hv, &raw, 4);
      const float2 fv = __half22float2(hv);
      f[4 * i + 2 * h] = fv.x;
      f[4 * i + 2 * h + 1] = fv.y;
    }
  }
}

// 8 x elements of type T packed in u as f32.
template <typename T>
__device__ __forceinline__ void cvt_x8(const uint4& u, float* v) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      __nv_bfloat162 h;
      memcpy(&h, &w[i], 4);
      f = __bfloat1622float2(h);
    } else {
      __half2 h;
      memcpy(&h, &w[i], 4);
      f = __half22float2(h);
    }
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// 8 consecutive x elements (16-byte aligned) as f32.
template <typename T>
__device__ __forceinline__ void load_x8(const T* p, float* v) {
  cvt_x8<T>(__ldg(reinterpret_cast<const uint4*>(p)), v);
}

template <int N, bool kBlockScale, typename T, typename TO>
__global__ void __launch_bounds__(kThreads) fp8_simt_kernel(Params p, int64_t k_per_split) {
  constexpr int R = kFp8Rows, U = kFp8Chunks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
  const int64_t c_begin = int64_t(blockIdx.y) * k_per_split / 16;
  const int64_t c_end = min(p.in, int64_t(blockIdx.y + 1) * k_per_split) / 16;
  const uint8_t* wbase = static_cast<const uint8_t*>(p.qweight);
  const T* x = static_cast<const T*>(p.x);
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[r][j] = 0.f;
  // Rows past the end read row out - 1 again and are not written.
  const uint4* wrow[R];
  int64_t srow[R];  // the rows' first block scale
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = min(o0 + r, p.out_features - 1);
    wrow[r] = reinterpret_cast<const uint4*>(wbase + row * p.in);
    srow[r] = kBlockScale ? (row / p.block_out) * p.scale_cols : 0;
  }
  // A chunk's scale column is chunk / (block_in / 16): a shift when that is a power of two.
  const int chunks_per_block = int(p.block_in / 16);
  const bool pow2 = (chunks_per_block & (chunks_per_block - 1)) == 0;
  const int shift = __ffs(chunks_per_block) - 1;
  const int64_t o_cta = int64_t(blockIdx.x) * kWarps * R;
  prefetch_fp8(p, Prefetch::kBeforeWait, c_begin * 16, c_end * 16, o_cta, kWarps * R);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_fp8(p, Prefetch::kAfterWait, c_begin * 16, c_end * 16, o_cta, kWarps * R);
  for (int64_t c = c_begin + lane; c < c_end; c += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (c + u * 32 < c_end) wv[u][r] = __ldcs(wrow[r] + c + u * 32);
    // The chunks' block scales and (one row of x) x's chunks are loaded with the weights, before
    // any math, so their latencies overlap the weights' instead of following them.
    float sc[U][R];
    uint4 xq[N == 1 ? U : 1][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + u * 32;
      if (cc >= c_end) break;
      if constexpr (kBlockScale) {
        const int ci = int(cc);
        const int col = pow2 ? ci >> shift : ci / chunks_per_block;
#pragma unroll
        for (int r = 0; r < R; ++r) sc[u][r] = load_any(p.scales, p.scale_dtype, srow[r] + col);
      }
      if constexpr (N == 1) {
        const uint4* xc = reinterpret_cast<const uint4*>(x + cc * 16);
        xq[u][0] = __ldg(xc);
        xq[u][1] = __ldg(xc + 1);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + u * 32;
      if (cc >= c_end) break;
      float wf[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) fp8x16_to_f32(wv[u][r], wf[r]);
      float s[R];
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] = kBlockScale ? sc[u][r] : 1.f;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (j >= p.n) break;
        float xv[16];
        if constexpr (N == 1) {
          cvt_x8<T>(xq[u][0], xv);
          cvt_x8<T>(xq[u][1], xv + 8);
        } else {
          load_x8<T>(x + j * p.ldx + cc * 16, xv);
          load_x8<T>(x + j * p.ldx + cc * 16 + 8, xv + 8);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float part = 0.f;
#pragma unroll
          for (int e = 0; e < 16; ++e) part = fmaf(wf[r][e], xv[e], part);
          if constexpr (kBlockScale)
            acc[r][j] = fmaf(s[r], part, acc[r][j]);
          else
            acc[r][j] += part;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], m);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t o = o0 + r;
      if (o >= p.out_features) break;
      const float s =
          kBlockScale ? 1.f : load_any(p.scales, p.scale_dtype, int64_t(p.scale_stride) * o);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (j >= p.n) break;
        write_out<TO>(p, j, o, kBlockScale ? acc[r][j] : acc[r][j] * s);
      }
    }
  }
  finish_splits<TO>(p, int64_t(blockIdx.x) * kWarps * R, kWarps * R);
}

// ---------------------------------------------------------------------------------------------
// kMma int4 helpers.

// The magic base of T: 128 in bf16, 1024 in f16, each with ulp 1, in both halves.
template <typename T>
constexpr uint32_t kMagic2 = std::is_same_v<T, __nv_bfloat16> ? 0x43004300u : 0x64006400u;

// (base + nibble at bits 0-3, base + nibble at bits 16-19) of v as T2.
template <typename T>
__device__ __forceinline__ uint32_t magic2(uint32_t v) {
  return (v & 0x000f000fu) | kMagic2<T>;
}

// a - b of two T2 (exact here: integers of magnitude < 2^8 for bf16, < 2^11 for f16).
template <typename T>
__device__ __forceinline__ uint32_t sub2(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __nv_bfloat162 d = __hsub2(x, y);
    memcpy(&r, &d, 4);
  } else {
    __half2 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __half2 d = __hsub2(x, y);
    memcpy(&r, &d, 4);
  }
  return r;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// The warps' totals through shared memory `red` [kMmaWarps][kRows][kMmaTile], added in warp
// order, then written from col0. Each thread has put its values in red[warp] before.
template <typename TO>
__device__ __forceinline__ void mma_finish(const Params& p, const float* red, int64_t col0) {
  __syncthreads();
  for (int i = threadIdx.x; i < p.n * kMmaTile; i += kMmaWarps * 32) {
    const int j = i / kMmaTile, c = i - j * kMmaTile;
    const int64_t o = col0 + c;
    if (o >= p.out_features) continue;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) v += red[(w * kRows + j) * kMmaTile + c];
    write_out<TO>(p, j, o, v);
  }
  finish_splits<TO>(p, col0, kMmaTile);
}

// The warp's range of `steps` steps of the CTA's slice.
__device__ __forceinline__ void warp_steps(int steps, int warp, int& begin, int& end) {
  const int per_warp = (steps + kMmaWarps - 1) / kMmaWarps;
  begin = min(steps, warp * per_warp);
  end = min(steps, begin + per_warp);
}

// ---------------------------------------------------------------------------------------------
// kMma GPTQ: a warp step is 32 inputs (word rows 4s..4s+3) x 128 outputs (U = 4 blocks of 32:
// thread (g, t) reads outputs 32u + 4g..4g+3 of word row 4s + t). Tile h = 0, 1 of a block puts
// outputs 4g + 2h (row g) and 4g + 2h + 1 (row g + 8) in the A operand.

constexpr int kGptqMmaU = 4;

struct GptqMma {
  static constexpr int U = kGptqMmaU;
  float tot[U][2][4], dg[U][2][4];  // the total and the current group's sum, D fragments
  uint32_t zt[U][4];                // (base + z) in both halves, per output 4g + c of block u
  float sc[U][4];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) tot[u][h][e] = dg[u][h][e] = 0.f;
  }
  // Adds the group's sums times their scales to the totals and clears them.
  __device__ __forceinline__ void flush() {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tot[u][h][e] = fmaf(sc[u][2 * h + (e >> 1)], dg[u][h][e], tot[u][h][e]);
          dg[u][h][e] = 0.f;
        }
  }
  // Block u's zero points (nibble c of zw: output 4g + c) and scales of a new group.
  template <typename T>
  __device__ __forceinline__ void set_group(int u, uint32_t zw, int zero_offset,
                                            const float (&s)[4]) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      // base + z: z (<= 16) added to the base's mantissa bits (ulp 1) adds it to the value.
      const uint32_t z = ((zw >> (4 * c)) & 0xf) + uint32_t(zero_offset);
      const uint32_t lo = (std::is_same_v<T, __nv_bfloat16> ? 0x4300u : 0x6400u) + z;
      zt[u][c] = lo | (lo << 16);
      sc[u][c] = s[c];
    }
  }
  // One step: the words of the thread's word row (16 bytes a block) and x[g][8r..8r+7].
  template <typename T>
  __device__ __forceinline__ void step(const uint4 (&w)[U], const uint4& xv) {
    // x[8r + m], x[8r + m + 4] paired as the nibbles are.
    const uint32_t b[2][2] = {{prmt(xv.x, xv.z, 0x5410), prmt(xv.x, xv.z, 0x7632)},
                              {prmt(xv.y, xv.w, 0x5410), prmt(xv.y, xv.w, 0x7632)}};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
      uint32_t a[4][4];  // [output c][m]: inputs (m, m + 4) of the word, minus the zero
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int m = 0; m < 4; ++m) a[c][m] = sub2<T>(magic2<T>(words[c] >> (4 * m)), zt[u][c]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const uint32_t frag[4] = {a[2 * h][2 * k], a[2 * h + 1][2 * k], a[2 * h][2 * k + 1],
                                    a[2 * h + 1][2 * k + 1]};
          Mma<T>::k16(dg[u][h], frag, b[k][0], b[k][1]);
        }
    }
  }
  // The totals into red[warp] (D element e of tile h: output 4g + 2h + (e >> 1) of block u, row
  // of x 2t + (e & 1)).
  __device__ __forceinline__ void store(float* red, int warp, int g, int t) const {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          red[(warp * kRows + 2 * t + (e & 1)) * kMmaTile + 32 * u + 4 * g + 2 * h + (e >> 1)] =
              tot[u][h][e];
  }
};

// The thread's output block u: its first output, whether it exists.
__device__ __forceinline__ int64_t gptq_out(int64_t col0, int u, int g) {
  return col0 + 32 * u + 4 * g;
}

// kMma GPTQ, weights through registers: the next step's 16-byte loads are issued before this
// step's math.
template <typename T, typename TO>
__global__ void __launch_bounds__(kMmaWarps * 32) gptq_mma_kernel(Params p, int64_t k_per_split) {
  constexpr int U = kGptqMmaU;
  __shared__ float red[kMmaWarps * kRows * kMmaTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t col0 = int64_t(blockIdx.x) * kMmaTile;
  const int64_t k0 = int64_t(blockIdx.y) * k_per_split, k1 = min(p.in, k0 + k_per_split);
  int s_begin, s_end;
  warp_steps(int((k1 - k0) / 32), warp, s_begin, s_end);
  const int64_t row_vecs = p.out_features / 4;  // uint4 per word row
  const uint4* wq = static_cast<const uint4*>(p.qweight);
  bool valid[U];
#pragma unroll
  for (int u = 0; u < U; ++u) valid[u] = gptq_out(col0, u, g) < p.out_features;
  const T* xrow = static_cast<const T*>(p.x) + int64_t(g) * p.ldx;
  const bool x_row = g < p.n;
  GptqMma m;
  m.clear();
  prefetch_gptq(p, Prefetch::kBeforeWait, k0, k1, col0, kMmaTile);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_gptq(p, Prefetch::kAfterWait, k0, k1, col0, kMmaTile);
  const int group = int(p.group);
  int grp_end = -1;  // the first input past the current group
  uint4 cur[U], nxt[U];
  auto load = [&](int s, uint4(&w)[U]) {
    const int64_t row = (k0 + 32 * int64_t(s)) / 8 + t;
#pragma unroll
    for (int u = 0; u < U; ++u)
      w[u] = valid[u] ? __ldcs(wq + row * row_vecs + gptq_out(col0, u, g) / 4)
                      : make_uint4(0, 0, 0, 0);
  };
  if (s_begin < s_end) load(s_begin, cur);
  for (int s = s_begin; s < s_end; ++s) {
    if (s + 1 < s_end) load(s + 1, nxt);
    const int kin = int(k0) + 32 * s;
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (x_row) xv = __ldg(reinterpret_cast<const uint4*>(xrow + kin + 8 * t));
    if (kin >= grp_end) {
      if (grp_end >= 0) m.flush();
      const int grp = kin / group;
      grp_end = (grp + 1) * group;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t o = gptq_out(col0, u, g);
        uint32_t zw = 0;
        float sv[4] = {0.f, 0.f, 0.f, 0.f};
        if (valid[u]) {
          zw = __ldg(p.qzeros + int64_t(grp) * (p.out_features / 8) + o / 8) >> (4 * (o % 8));
#pragma unroll
          for (int c = 0; c < 4; ++c)
            sv[c] = load_any(p.scales, p.scale_dtype, int64_t(grp) * p.out_features + o + c);
        }
        m.set_group<T>(u, zw, valid[u] ? p.zero_offset : 0, sv);
      }
    }
    m.step<T>(cur, xv);
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = nxt[u];
  }
  if (grp_end >= 0) m.flush();
  m.store(red, warp, g, t);
  mma_finish<TO>(p, red, col0);
}

// ---------------------------------------------------------------------------------------------
// kMma AWQ: a warp step is 16 inputs x 128 outputs: thread (g, t) reads words 2g, 2g + 1 (8
// bytes: outputs 16g..16g+15) of input rows 4t..4t+3. Tile (w, q) puts outputs 16g + 8w + 2q (row
// g) and + 1 (row g + 8) in the A operand, inputs 4t, 4t + 1 (k 2t, 2t + 1) and 4t + 2, 4t + 3
// (k 2t + 8, 2t + 9).

struct AwqMma {
  float tot[2][4][4], dg[2][4][4];  // [word w][pair q][D element]
  uint32_t zt[2][8];                // (base + z) in both halves per output 8w + c
  float sc[2][8];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) tot[w][q][e] = dg[w][q][e] = 0.f;
  }
  __device__ __forceinline__ void flush() {
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tot[w][q][e] = fmaf(sc[w][2 * q + (e >> 1)], dg[w][q][e], tot[w][q][e]);
          dg[w][q][e] = 0.f;
        }
  }
  // Word w's zero points (packed as the weights: output 8w + 2q in nibble q, 8w + 2q + 1 in
  // nibble q + 4) and scales of a new group.
  template <typename T>
  __device__ __forceinline__ void set_group(int w, uint32_t zw, const float (&s)[8]) {
    // Both halves made of zw's low (high) 16 bits: the nibble twice.
    const uint32_t zlo = prmt(zw, zw, 0x1010), zhi = prmt(zw, zw, 0x3232);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      zt[w][2 * q] = magic2<T>(zlo >> (4 * q));
      zt[w][2 * q + 1] = magic2<T>(zhi >> (4 * q));
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) sc[w][c] = s[c];
  }
  // One step: the two words of input rows 4t..4t+3 and x[g][4t..4t+3] (xv.x: inputs 4t, 4t + 1).
  template <typename T>
  __device__ __forceinline__ void step(const uint2 (&rows)[4], const uint2& xv) {
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t v[4] = {w ? rows[0].y : rows[0].x, w ? rows[1].y : rows[1].x,
                             w ? rows[2].y : rows[2].x, w ? rows[3].y : rows[3].x};
      // Pair P: rows 2P, 2P + 1; lo: their nibbles 0-3 (outputs 0, 2, 4, 6), hi: 4-7 (1, 3, 5, 7).
      uint32_t lo[2], hi[2];
#pragma unroll
      for (int P = 0; P < 2; ++P) {
        lo[P] = prmt(v[2 * P], v[2 * P + 1], 0x5410);
        hi[P] = prmt(v[2 * P], v[2 * P + 1], 0x7632);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t frag[4] = {sub2<T>(magic2<T>(lo[0] >> (4 * q)), zt[w][2 * q]),
                                  sub2<T>(magic2<T>(hi[0] >> (4 * q)), zt[w][2 * q + 1]),
                                  sub2<T>(magic2<T>(lo[1] >> (4 * q)), zt[w][2 * q]),
                                  sub2<T>(magic2<T>(hi[1] >> (4 * q)), zt[w][2 * q + 1])};
        Mma<T>::k16(dg[w][q], frag, xv.x, xv.y);
      }
    }
  }
  // D element e of tile (w, q): output 16g + 8w + 2q + (e >> 1), row of x 2t + (e & 1).
  __device__ __forceinline__ void store(float* red, int warp, int g, int t) const {
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          red[(warp * kRows + 2 * t + (e & 1)) * kMmaTile + 16 * g + 8 * w + 2 * q + (e >> 1)] =
              tot[w][q][e];
  }
};

// kMma AWQ, weights through registers (the next step's loads issued before this step's math).
template <typename T, typename TO>
__global__ void __launch_bounds__(kMmaWarps * 32) awq_mma_kernel(Params p, int64_t k_per_split) {
  __shared__ float red[kMmaWarps * kRows * kMmaTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t col0 = int64_t(blockIdx.x) * kMmaTile;
  const int64_t k0 = int64_t(blockIdx.y) * k_per_split, k1 = min(p.in, k0 + k_per_split);
  int s_begin, s_end;
  warp_steps(int((k1 - k0) / 16), warp, s_begin, s_end);
  const int64_t o_first = col0 + 16 * g;  // the thread's 16 outputs
  const bool valid = o_first < p.out_features;
  const int64_t row_words = p.out_features / 8;
  const uint2* wq = reinterpret_cast<const uint2*>(static_cast<const uint32_t*>(p.qweight) +
                                                   (valid ? o_first / 8 : 0));
  const int64_t row_vecs = row_words / 2;  // uint2 per input row
  const T* xrow = static_cast<const T*>(p.x) + int64_t(g) * p.ldx;
  const bool x_row = g < p.n;
  AwqMma m;
  m.clear();
  prefetch_awq(p, Prefetch::kBeforeWait, k0, k1, col0, kMmaTile);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_awq(p, Prefetch::kAfterWait, k0, k1, col0, kMmaTile);
  const int group = int(p.group);
  int grp_end = -1;
  uint2 cur[4], nxt[4];  // input rows 4t + e
  auto load = [&](int s, uint2(&w)[4]) {
    const int64_t row = k0 + 16 * int64_t(s) + 4 * t;
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = valid ? __ldcs(wq + (row + e) * row_vecs) : make_uint2(0, 0);
  };
  if (s_begin < s_end) load(s_begin, cur);
  for (int s = s_begin; s < s_end; ++s) {
    if (s + 1 < s_end) load(s + 1, nxt);
    const int kin = int(k0) + 16 * s;
    uint2 xv = make_uint2(0, 0);
    if (x_row) xv = __ldg(reinterpret_cast<const uint2*>(xrow + kin + 4 * t));
    if (kin >= grp_end) {
      if (grp_end >= 0) m.flush();
      const int grp = kin / group;
      grp_end = (grp + 1) * group;
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        uint32_t zw = 0;
        float sv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (valid) {
          zw = __ldg(p.qzeros + int64_t(grp) * row_words + o_first / 8 + w);
#pragma unroll
          for (int c = 0; c < 8; ++c)
            sv[c] = load_any(p.scales, p.scale_dtype,
                             int64_t(grp) * p.out_features + o_first + 8 * w + c);
        }
        m.set_group<T>(w, zw, sv);
      }
    }
    m.step<T>(cur, xv);
#pragma unroll
    for (int e = 0; e < 4; ++e) cur[e] = nxt[e];
  }
  if (grp_end >= 0) m.flush();
  m.store(red, warp, g, t);
  mma_finish<TO>(p, red, col0);
}

// ---------------------------------------------------------------------------------------------
// kMmaAsync: the same math, the weights (and each group's zero points and 16-bit scales) copied
// by cp.async into a ring of kAsyncStages steps per warp in shared memory, kAsyncStages - 1 steps
// ahead of the math. Each lane reads back only what it copied itself, so the ring needs no
// barrier: cp.async.wait_group orders a lane's copies before its own reads, and a slot is
// refilled only after the step that read it has used the values.

constexpr int kAsyncStages = 4;

__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// The ring has no barrier, so the compiler must not move a lane's shared-memory reads of a slot
// past the copies that refill it, nor above the wait for the copies that filled it.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }

// Two 16-bit scales of `dtype` (bf16 or f16) packed in u -> floats.
__device__ __forceinline__ float2 scales2(uint32_t u, DType dtype) {
  if (dtype == DType::kBF16) {
    __nv_bfloat162 h;
    memcpy(&h, &u, 4);
    return __bfloat1622float2(h);
  }
  __half2 h;
  memcpy(&h, &u, 4);
  return __half22float2(h);
}

// One warp's ring slot (GPTQ): per lane, U 16-byte weight vectors, U zero words and U x 4
// scales (8 bytes), laid out [item][lane] so a warp's accesses are contiguous.
struct GptqSlot {
  uint4 w[kGptqMmaU][32];
  uint32_t z[kGptqMmaU][32];
  uint2 s[kGptqMmaU][32];
};

template <typename T, typename TO>
__global__ void __launch_bounds__(kMmaWarps * 32)
    gptq_mma_async_kernel(Params p, int64_t k_per_split) {
  constexpr int U = kGptqMmaU, S = kAsyncStages;
  extern __shared__ __align__(16) char gptq_smem[];  // gptq_async_smem_bytes
  GptqSlot(*ring)[S] = reinterpret_cast<GptqSlot(*)[S]>(gptq_smem);
  float* red = reinterpret_cast<float*>(gptq_smem);  // reused once the ring is drained
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t col0 = int64_t(blockIdx.x) * kMmaTile;
  const int64_t k0 = int64_t(blockIdx.y) * k_per_split, k1 = min(p.in, k0 + k_per_split);
  int s_begin, s_end;
  warp_steps(int((k1 - k0) / 32), warp, s_begin, s_end);
  const int64_t row_vecs = p.out_features / 4;
  const uint4* wq = static_cast<const uint4*>(p.qweight);
  const T* xrow = static_cast<const T*>(p.x) + int64_t(g) * p.ldx;
  const bool x_row = g < p.n;
  const int group = int(p.group);
  GptqSlot* my = ring[warp];
  GptqMma m;
  m.clear();
  prefetch_gptq(p, Prefetch::kBeforeWait, k0, k1, col0, kMmaTile);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_gptq(p, Prefetch::kAfterWait, k0, k1, col0, kMmaTile);
  // Copies step s into its slot (nothing past the warp's range; an empty commit group keeps the
  // count): the weights, and the group's zeros and scales where s starts one.
  auto issue = [&](int s) {
    compiler_fence();
    if (s < s_end) {
      GptqSlot& slot = my[s % S];
      const int kin = int(k0) + 32 * s;
      const int64_t row = kin / 8 + t;
      const bool starts = s == s_begin || kin % group == 0;
      const int grp = kin / group;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t o = gptq_out(col0, u, g);
        const bool ok = o < p.out_features;
        cp_async_16(smem_addr(&slot.w[u][lane]), ok ? wq + row * row_vecs + o / 4 : wq,
                    ok ? 16 : 0);
        if (starts) {
          cp_async_4(smem_addr(&slot.z[u][lane]),
                     ok ? p.qzeros + int64_t(grp) * (p.out_features / 8) + o / 8 : p.qzeros,
                     ok ? 4 : 0);
          const uint16_t* sp = static_cast<const uint16_t*>(p.scales);
          cp_async_8(smem_addr(&slot.s[u][lane]), ok ? sp + int64_t(grp) * p.out_features + o : sp,
                     ok ? 8 : 0);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(s_begin + i);
  for (int s = s_begin; s < s_end; ++s) {
    issue(s + S - 1);
    const int kin = int(k0) + 32 * s;
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (x_row) xv = __ldg(reinterpret_cast<const uint4*>(xrow + kin + 8 * t));
    cp_async_wait<S - 1>();
    compiler_fence();
    const GptqSlot& slot = my[s % S];
    if (s == s_begin || kin % group == 0) {
      if (s != s_begin) m.flush();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t o = gptq_out(col0, u, g);
        const uint2 sr = slot.s[u][lane];
        const float2 a = scales2(sr.x, p.scale_dtype), b = scales2(sr.y, p.scale_dtype);
        const float sv[4] = {a.x, a.y, b.x, b.y};
        m.set_group<T>(u, slot.z[u][lane] >> (4 * (o % 8)), o < p.out_features ? p.zero_offset : 0,
                       sv);
      }
    }
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) w[u] = slot.w[u][lane];
    m.step<T>(w, xv);
  }
  if (s_begin < s_end) m.flush();
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring before it becomes `red`
  m.store(red, warp, g, t);
  mma_finish<TO>(p, red, col0);
}

// The GPTQ ring (57 KiB at 4 stages: dynamic shared memory), which also holds `red`.
constexpr int gptq_async_smem_bytes() {
  constexpr int ring = int(sizeof(GptqSlot)) * kMmaWarps * kAsyncStages;
  constexpr int red = int(sizeof(float)) * kMmaWarps * kRows * kMmaTile;
  return ring > red ? ring : red;
}

// AWQ's slot: per lane, 4 rows x 8 bytes of weights, 2 zero words (8 bytes) and 16 scales (32
// bytes, two 16-byte halves).
struct AwqSlot {
  uint2 w[4][32];
  uint2 z[32];
  uint4 s[2][32];
};

template <typename T, typename TO>
__global__ void __launch_bounds__(kMmaWarps * 32)
    awq_mma_async_kernel(Params p, int64_t k_per_split) {
  constexpr int S = kAsyncStages;
  constexpr int kRedFloats = kMmaWarps * kRows * kMmaTile;
  constexpr int kRingBytes = int(sizeof(AwqSlot)) * kMmaWarps * S;
  __shared__ __align__(16) char smem[kRingBytes > kRedFloats * 4 ? kRingBytes : kRedFloats * 4];
  AwqSlot(*ring)[S] = reinterpret_cast<AwqSlot(*)[S]>(smem);
  float* red = reinterpret_cast<float*>(smem);  // reused once the ring is drained
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t col0 = int64_t(blockIdx.x) * kMmaTile;
  const int64_t k0 = int64_t(blockIdx.y) * k_per_split, k1 = min(p.in, k0 + k_per_split);
  int s_begin, s_end;
  warp_steps(int((k1 - k0) / 16), warp, s_begin, s_end);
  const int64_t o_first = col0 + 16 * g;
  const bool valid = o_first < p.out_features;
  const int64_t row_words = p.out_features / 8;
  const uint2* wq = reinterpret_cast<const uint2*>(static_cast<const uint32_t*>(p.qweight) +
                                                   (valid ? o_first / 8 : 0));
  const int64_t row_vecs = row_words / 2;
  const T* xrow = static_cast<const T*>(p.x) + int64_t(g) * p.ldx;
  const bool x_row = g < p.n;
  const int group = int(p.group);
  AwqSlot* my = ring[warp];
  AwqMma m;
  m.clear();
  prefetch_awq(p, Prefetch::kBeforeWait, k0, k1, col0, kMmaTile);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  prefetch_awq(p, Prefetch::kAfterWait, k0, k1, col0, kMmaTile);
  auto issue = [&](int s) {
    compiler_fence();
    if (s < s_end) {
      AwqSlot& slot = my[s % S];
      const int kin = int(k0) + 16 * s;
      const int64_t row = kin + 4 * t;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        cp_async_8(smem_addr(&slot.w[e][lane]), valid ? wq + (row + e) * row_vecs : wq,
                   valid ? 8 : 0);
      if (s == s_begin || kin % group == 0) {
        const int grp = kin / group;
        const uint32_t* zp = p.qzeros + (valid ? int64_t(grp) * row_words + o_first / 8 : 0);
        cp_async_8(smem_addr(&slot.z[lane]), zp, valid ? 8 : 0);
        const uint16_t* sp = static_cast<const uint16_t*>(p.scales) +
                             (valid ? int64_t(grp) * p.out_features + o_first : 0);
        cp_async_16(smem_addr(&slot.s[0][lane]), sp, valid ? 16 : 0);
        cp_async_16(smem_addr(&slot.s[1][lane]), sp + 8, valid ? 16 : 0);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(s_begin + i);
  for (int s = s_begin; s < s_end; ++s) {
    issue(s + S - 1);
    const int kin = int(k0) + 16 * s;
    uint2 xv = make_uint2(0, 0);
    if (x_row) xv = __ldg(reinterpret_cast<const uint2*>(xrow + kin + 4 * t));
    cp_async_wait<S - 1>();
    compiler_fence();
    const AwqSlot& slot = my[s % S];
    if (s == s_begin || kin % group == 0) {
      if (s != s_begin) m.flush();
      const uint2 zw = slot.z[lane];
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const uint4 sr = slot.s[w][lane];
        const uint32_t raw[4] = {sr.x, sr.y, sr.z, sr.w};
        float sv[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = scales2(raw[i], p.scale_dtype);
          sv[2 * i] = f.x;
          sv[2 * i + 1] = f.y;
        }
        m.set_group<T>(w, w ? zw.y : zw.x, sv);
      }
    }
    uint2 rows[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) rows[e] = slot.w[e][lane];
    m.step<T>(rows, xv);
  }
  if (s_begin < s_end) m.flush();
  cp_async_wait<0>();
  __syncthreads();
  m.store(red, warp, g, t);
  mma_finish<TO>(p, red, col0);
}

// ---------------------------------------------------------------------------------------------
// The K slices' partials added in slice order (+ bias).

template <typename TO>
__global__ void __launch_bounds__(256) reduce_splits_kernel(Params p, int64_t splits) {
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n * p.out_features) return;
  const int64_t j = i / p.out_features, o = i - j * p.out_features;
  float v = 0.f;
  for (int64_t s = 0; s < splits; ++s) v += p.partial[(s * p.n + j) * p.out_features + o];
  if (p.bias) v += load_any(p.bias, p.bias_dtype, o);
  static_cast<TO*>(p.out)[j * p.ldo + o] = from_f32<TO>(v);
}

// ---------------------------------------------------------------------------------------------
// Launch.

template <int N, typename T, typename TO>
void launch_simt(const Params& p, const QuantizedGemvSchedule& s, cudaStream_t stream) {
  const dim3 grid{unsigned(s.col_tiles), unsigned(s.splits)}, block{kThreads};
  switch (p.format) {
    case Format::kGptq:
      return launch_pdl(gptq_simt_kernel<N, T, TO>, grid, block, 0, stream, p, s.k_per_split);
    case Format::kAwq:
      if constexpr (N == 1) {
        if (s.awq_words == 4)
          return launch_pdl(awq_simt_kernel<N, 4, T, TO>, grid, block, 0, stream, p, s.k_per_split);
      }
      if constexpr (N <= 2) {
        if (s.awq_words == 2)
          return launch_pdl(awq_simt_kernel<N, 2, T, TO>, grid, block, 0, stream, p, s.k_per_split);
      }
      return launch_pdl(awq_simt_kernel<N, 1, T, TO>, grid, block, 0, stream, p, s.k_per_split);
    case Format::kFp8Block:
      return launch_pdl(fp8_simt_kernel<N, true, T, TO>, grid, block, 0, stream, p, s.k_per_split);
    default:
      return launch_pdl(fp8_simt_kernel<N, false, T, TO>, grid, block, 0, stream, p, s.k_per_split);
  }
}

template <typename T, typename TO>
void launch_typed(const Params& p, const QuantizedGemvSchedule& s, cudaStream_t stream) {
  if (s.kernel == QuantizedGemvKernel::kMma) {
    const dim3 grid{unsigned(s.col_tiles), unsigned(s.splits)}, block{kMmaWarps * 32};
    if (p.format == Format::kGptq)
      return launch_pdl(gptq_mma_kernel<T, TO>, grid, block, 0, stream, p, s.k_per_split);
    return launch_pdl(awq_mma_kernel<T, TO>, grid, block, 0, stream, p, s.k_per_split);
  }
  if (s.kernel == QuantizedGemvKernel::kMmaAsync) {
    const dim3 grid{unsigned(s.col_tiles), unsigned(s.splits)}, block{kMmaWarps * 32};
    if (p.format == Format::kGptq) {
      require_dynamic_smem(gptq_mma_async_kernel<T, TO>, gptq_async_smem_bytes());
      return launch_pdl(gptq_mma_async_kernel<T, TO>, grid, block, gptq_async_smem_bytes(), stream,
                        p, s.k_per_split);
    }
    return launch_pdl(awq_mma_async_kernel<T, TO>, grid, block, 0, stream, p, s.k_per_split);
  }
  // Row counts round up to a power of two (a kernel per N, not per n: the GEMVs are bound by
  // the weight's bytes, which every row shares).
  if (p.n == 1) return launch_simt<1, T, TO>(p, s, stream);
  if (p.n == 2) return launch_simt<2, T, TO>(p, s, stream);
  if (p.n <= 4) return launch_simt<4, T, TO>(p, s, stream);
  return launch_simt<8, T, TO>(p, s, stream);
}

}  // namespace

void quantized_gemv_run(const QuantizedGemvParams& p, const QuantizedGemvSchedule& s,
                        cudaStream_t stream) {
  LONGCTX_CHECK(s.refusal.empty(), ErrorCode::kInvalidArgument, "quantized_gemv: {}", s.refusal);
  LONGCTX_CHECK(p.n >= 1 && p.n <= kQuantizedGemvPassRows && s.col_tiles > 0 && s.splits >= 1 &&
                    s.k_per_split > 0 && (s.splits == 1 || p.partial != nullptr),
                ErrorCode::kInvalidArgument,
                "quantized_gemv: n = {}, {} tiles, {} splits, partials {}", p.n, s.col_tiles,
                s.splits, p.partial ? "given" : "missing");
  const bool last_cta = s.splits > 1 && s.reduce == QuantizedGemvReduce::kLastCta;
  LONGCTX_CHECK(
      !last_cta || (p.tile_counters != nullptr && s.col_tiles <= kQuantizedGemvMaxTileCounters),
      ErrorCode::kInvalidArgument,
      "quantized_gemv: the last-CTA reduction of {} tiles needs tile counters", s.col_tiles);
  Params q = p;
  if (!last_cta) q.tile_counters = nullptr;
  q.prefetch = s.prefetch;
  visit_float(p.x_dtype, "quantized_gemv", [&](auto xt) {
    using T = decltype(xt);
    if constexpr (std::is_same_v<T, float>) {
      LONGCTX_THROW(ErrorCode::kUnsupported, "quantized_gemv: f32 x");
    } else {
      if (p.out_dtype == DType::kF32)
        launch_typed<T, float>(q, s, stream);
      else
        launch_typed<T, T>(q, s, stream);
      if (s.splits > 1 && !last_cta) {
        const int64_t total = p.n * p.out_features;
        const dim3 grid{unsigned(ceil_div(total, 256))}, block{256};
        if (p.out_dtype == DType::kF32)
          launch_pdl(reduce_splits_kernel<float>, grid, block, 0, stream, p, s.splits);
        else
          launch_pdl(reduce_splits_kernel<T>, grid, block, 0, stream, p, s.splits);
      }
    }
  });
}

}  // namespace longctx::kernels::cuda
