// CUDA quantized Linear: out[n, out] = x[n, in] @ W^T (+ bias), W packed as its checkpoint stores
// it (include/longctx/loader/quantization.h), fp32 accumulation.
//
// Decode (n <= 64, 8 rows a pass): one GEMV kernel per format streams the packed weight once with
// 16-byte streaming loads (__ldcs) and decodes it in registers. A CTA of kWarps warps owns a tile
// of output columns and a slice of K (blockIdx.y); its warps split the slice into contiguous row
// ranges and add their sums through shared memory in warp order; with more than one slice each
// writes fp32 partials [splits, n, out] to the workspace and a second kernel adds them in slice
// order (deterministic: no float atomics).
//   - int4: x's slice is staged in shared memory as f32. Eight nibbles of a word become four
//     half2 of 1024 + q (or 1024 + 16 q) by one AND/OR each (the magic-number trick of Marlin and
//     the AWQ kernels: 0x6400 is 1024.0 in f16, whose ulp is 1); subtracting 1024 + z (or a fused
//     x/16 - (64 + z)) leaves q - z exactly, which is widened to f32 and multiplied by x in f32.
//     The scale is applied to a sum of exact products: per 8 inputs for GPTQ (a word spans one
//     output's 8 inputs), per group for AWQ (a word spans 8 outputs of one input).
//     AWQ's nibble order (columns 0,2,4,6,1,3,5,7) pairs nibbles k and k + 4 as columns 2k, 2k+1,
//     so each half2 holds two neighbouring columns, and the zero points, packed the same way, are
//     decoded by the same AND/OR.
//   - FP8: each warp owns kFp8Rows output rows and its lanes stride over 16-input chunks (16-byte
//     loads of each row); E4M3 pairs convert to half2 exactly, then to f32. Block scales multiply
//     each chunk's sum (a chunk never straddles a 128-input block); channel or tensor scales
//     multiply the row's sum at the end.
// Otherwise quantized_linear_schedule picks W8A8 for the FP8 formats on sm_90
// (quantized_linear_w8a8_cuda.cu: x quantized to E4M3, cuBLASLt's scaled FP8 GEMM), or a
// dequantizing kernel writes W to a scratch [out, in] in x's dtype (f32 math, one rounding) and
// linear_cuda (cuBLASLt, or its GEMV) runs on it.
#include <cuda_fp8.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/stream_limits.h"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/stream.h"
#include "ops/linear.h"
#include "ops/ops_device.cuh"
#include "ops/quantized_linear.h"
#include "ops/quantized_linear_w8a8.h"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Inputs of x one CTA stages in shared memory (int4 GEMVs): N x 4 KiB.
constexpr int64_t kSliceK = 1024;
// CTAs the split planner aims for per SM.
constexpr int kCtasPerSm = 4;
constexpr int kFp8Rows = 2;    // output rows per warp (FP8): x chunks are read once per pair
constexpr int kFp8Chunks = 4;  // 16-byte chunks of each row in flight per lane (FP8)
constexpr int kGptqLoads = 8;  // 16-byte words in flight per lane (GPTQ)
// Bytes in flight per lane of the AWQ GEMV for N rows (awq_lane_bytes(N) / (4 V) loads of 4 V
// bytes): 64 at two CTAs per SM (N <= 4), as many bytes per SM as 128 at one CTA, which the
// 8-row kernel keeps (it needs ~200 registers).
constexpr int awq_lane_bytes(int n) { return n >= 8 ? 128 : 64; }

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------
// Arguments.

struct QArgs {
  const void* x = nullptr;  // [n, in], row stride ldx
  void* out = nullptr;      // [n, out], row stride ldo
  const void* bias = nullptr;
  int64_t n = 0, in = 0, out_features = 0, ldx = 0, ldo = 0;
  DType x_dtype = DType::kBF16, out_dtype = DType::kBF16, bias_dtype = DType::kF32;
  Device device;
};

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

int64_t row_stride(const Tensor& t) { return t.size(0) > 1 ? t.strides()[0] : t.size(1); }

QArgs q_args(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q, const Tensor& bias,
             const Tensor& out) {
  constexpr const char* kOp = "quantized_linear";
  check_quantized_weight(kOp, w, q);
  for (auto [name, t] : {std::pair{"x", &x}, {"out", &out}}) {
    LONGCTX_CHECK(t->defined() && t->rank() == 2, ErrorCode::kInvalidArgument,
                  "{}: {} must be a matrix, got {}", kOp, name, t->defined() ? t->str() : "none");
    LONGCTX_CHECK(t->strides()[1] == 1 || t->size(1) <= 1, ErrorCode::kInvalidArgument,
                  "{}: {} {} must have a contiguous last dim", kOp, name, t->str());
    LONGCTX_CHECK(t->device().is_cuda() && t->device() == x.device(), ErrorCode::kInvalidArgument,
                  "quantized_linear_cuda: {} {} is not on x's CUDA device", name, t->str());
  }
  for (auto [name, t] : {std::pair{"qweight", &w.qweight},
                         {"scales", &w.scales},
                         {"qzeros", &w.qzeros},
                         {"bias", &bias}})
    LONGCTX_CHECK(!t->defined() || t->device() == x.device(), ErrorCode::kInvalidArgument,
                  "quantized_linear_cuda: {} {} is not on x's device {}", name, t->str(),
                  x.device().str());
  QArgs a;
  a.n = x.size(0);
  a.in = x.size(1);
  a.out_features = w.out_features;
  LONGCTX_CHECK(a.in == w.in_features, ErrorCode::kInvalidArgument,
                "{}: x {} does not match the weight's in_features {}", kOp, x.str(), w.in_features);
  LONGCTX_CHECK(out.size(0) == a.n && out.size(1) == a.out_features, ErrorCode::kInvalidArgument,
                "{}: out must have shape [{}, {}], got {}", kOp, a.n, a.out_features, out.str());
  a.x_dtype = x.dtype();
  a.out_dtype = out.dtype();
  LONGCTX_CHECK(is_float_dtype(a.x_dtype), ErrorCode::kUnsupported,
                "{} (CUDA): x {} must be bf16, f16 or f32", kOp, x.str());
  LONGCTX_CHECK(a.out_dtype == DType::kF32 || a.out_dtype == a.x_dtype, ErrorCode::kUnsupported,
                "{} (CUDA): out {} must be f32 or x's dtype {}", kOp, out.str(),
                dtype_name(a.x_dtype));
  if (bias.defined()) {
    LONGCTX_CHECK(bias.is_contiguous() && bias.rank() == 1 && bias.size(0) == a.out_features &&
                      is_float_dtype(bias.dtype()),
                  ErrorCode::kInvalidArgument,
                  "{}: bias must be a contiguous f32/bf16/f16 [{}], got {}", kOp, a.out_features,
                  bias.str());
    a.bias = bias.data_ptr();
    a.bias_dtype = bias.dtype();
  }
  a.ldx = row_stride(x);
  a.ldo = row_stride(out);
  LONGCTX_CHECK(a.ldx >= a.in && a.ldo >= a.out_features, ErrorCode::kInvalidArgument,
                "{}: row strides of x {} ({}) and out {} ({}) must be at least their widths", kOp,
                x.str(), a.ldx, out.str(), a.ldo);
  a.x = x.data_ptr();
  a.out = out.data_ptr();
  a.device = x.device();
  return a;
}

// ---------------------------------------------------------------------------------------------
// Device helpers.

struct GemvParams {
  const void* x;  // [n, in], row stride ldx
  int64_t ldx;
  int n;  // rows of x (<= the kernel's N: rows n..N-1 are computed on zeros and not written)
  const void* qweight;  // the format's packed weight
  const void* scales;   // the format's scales, scale_dtype
  DType scale_dtype;
  const uint32_t* qzeros;  // int4: [in/g, out/8]
  const void* bias;        // [out] or nullptr (applied where the sum completes)
  DType bias_dtype;
  void* out;  // [n, out], row stride ldo (splits == 1)
  int64_t ldo;
  float* partial;  // [splits, n, out] (splits > 1)
  int64_t in, out_features;
  int64_t k_per_split;                      // inputs per blockIdx.y
  int64_t group;                            // int4: inputs per group
  int zero_offset;                          // GPTQ v1: qzeros hold z - 1
  int64_t block_out, block_in, scale_cols;  // FP8 block scales
  int scale_stride;                         // FP8 channel (1) or tensor (0) scales
};

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
__device__ __forceinline__ void stage_x(const GemvParams& p, int64_t k0, int64_t k1, float* xs) {
  const int64_t len = k1 - k0;
  const T* x = static_cast<const T*>(p.x);
  for (int64_t i = threadIdx.x; i < N * len; i += kThreads) {
    const int64_t j = i / len, k = i - j * len;
    xs[j * kSliceK + k] = j < p.n ? to_f32(x[j * p.ldx + k0 + k]) : 0.f;
  }
  __syncthreads();
}

// Adds the warps' sums acc (per thread: C columns x N rows, columns lane * C + c of the tile) in
// warp order through `red` [N][32 C], then writes the tile's columns from col0: the finished
// outputs (+ bias) when there is one K slice, else this slice's partials.
template <int N, int C, typename TO>
__device__ __forceinline__ void finish_tile(const GemvParams& p, float (&acc)[C][N], float* red,
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
    const float v = red[i];
    if (gridDim.y == 1) {
      const float b = p.bias ? load_any(p.bias, p.bias_dtype, o) : 0.f;
      static_cast<TO*>(p.out)[j * p.ldo + o] = from_f32<TO>(v + b);
    } else {
      p.partial[(int64_t(blockIdx.y) * p.n + j) * p.out_features + o] = v;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GPTQ: qweight [in/8, out] (word [r, o]: inputs 8r..8r+7 of column o in nibbles 0..7). A lane
// reads 4 columns of a row (16 bytes); a warp 128 columns.

template <int N, typename T, typename TO>
__global__ void __launch_bounds__(kThreads) gptq_gemv_kernel(GemvParams p) {
  constexpr int C = 4, U = kGptqLoads;
  __shared__ __align__(16) float xs[N * kSliceK];
  __shared__ float red[N * 32 * C];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k0 = int64_t(blockIdx.y) * p.k_per_split;
  const int64_t k1 = min(p.in, k0 + p.k_per_split);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  stage_x<N, T>(p, k0, k1, xs);
  const int64_t col0 = int64_t(blockIdx.x) * 32 * C, o = col0 + lane * C;
  const int64_t r_begin = k0 / 8, rows = (k1 - k0) / 8;
  const int64_t per_warp = ceil_div(rows, kWarps);
  const int64_t r0 = r_begin + min(rows, warp * per_warp);
  const int64_t r1 = r_begin + min(rows, (warp + 1) * per_warp);
  float acc[C][N];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[c][j] = 0.f;
  if (o < p.out_features) {
    const uint4* qw = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(p.qweight) + o);
    const int64_t row_words = p.out_features / 4;  // uint4 per qweight row
    int64_t cur = -1;
    ZeroTerms zt[C][2];
    float s[C];
    for (int64_t r = r0; r < r1; r += U) {
      uint4 wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u < r1) wv[u] = __ldcs(qw + (r + u) * row_words);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r + u >= r1) break;
        const int64_t grp = (r + u) * 8 / p.group;
        if (grp != cur) {
          cur = grp;
          const uint32_t zw = __ldg(p.qzeros + grp * (p.out_features / 8) + o / 8) >> (4 * (o % 8));
#pragma unroll
          for (int c = 0; c < C; ++c) {
            const float z = float(((zw >> (4 * c)) & 0xf) + p.zero_offset);
            zt[c][0].lo = zt[c][1].lo = __float2half2_rn(-1024.f - z);
            zt[c][0].hi = zt[c][1].hi = __float2half2_rn(-64.f - z);
            s[c] = load_any(p.scales, p.scale_dtype, grp * p.out_features + o + c);
          }
        }
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
// AWQ: qweight [in, out/8] (word [i, p]: columns 8p + {0,2,4,6,1,3,5,7} of input i). A lane reads
// V words of a row (4 V bytes: 8 V columns); a warp 256 V columns.

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
__device__ __forceinline__ void awq_flush(const GemvParams& p, int64_t grp, int64_t o,
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
__global__ void __launch_bounds__(kThreads, N >= 8 ? 1 : 2) awq_gemv_kernel(GemvParams p) {
  constexpr int C = 8 * V, U = awq_lane_bytes(N) / (4 * V);
  using W = typename Words<V>::type;
  __shared__ __align__(16) float xs[N * kSliceK];
  __shared__ float red[N * 32 * C];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t k0 = int64_t(blockIdx.y) * p.k_per_split;
  const int64_t k1 = min(p.in, k0 + p.k_per_split);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
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
    int64_t cur = -1;
    ZeroTerms zt[V][2];
    for (int64_t i = i0; i < i1; i += U) {
      W wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u < i1) wv[u] = __ldcs(qw + (i + u) * w_stride);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u >= i1) break;
        const int64_t grp = (i + u) / p.group;
        if (grp != cur) {
          if (cur >= 0) awq_flush<N, C>(p, cur, o, acc, gp);
          cur = grp;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const uint32_t zw = __ldg(p.qzeros + grp * row_words + o / 8 + v);
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
// FP8 E4M3: weight [out, in] row-major. Warp w of a CTA owns rows (blockIdx.x * kWarps + w) *
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

template <int N, bool kBlockScale, typename T, typename TO>
__global__ void __launch_bounds__(kThreads) fp8_gemv_kernel(GemvParams p) {
  constexpr int R = kFp8Rows, U = kFp8Chunks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
  const int64_t c_begin = int64_t(blockIdx.y) * p.k_per_split / 16;
  const int64_t c_end = min(p.in, int64_t(blockIdx.y + 1) * p.k_per_split) / 16;
  const uint8_t* wbase = static_cast<const uint8_t*>(p.qweight);
  const T* x = static_cast<const T*>(p.x);
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[r][j] = 0.f;
  // Rows past the end read row out - 1 again and are not written.
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    wrow[r] = reinterpret_cast<const uint4*>(wbase + min(o0 + r, p.out_features - 1) * p.in);
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  for (int64_t c = c_begin + lane; c < c_end; c += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (c + u * 32 < c_end) wv[u][r] = __ldcs(wrow[r] + c + u * 32);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + u * 32;
      if (cc >= c_end) break;
      float wf[R][16];
#pragma unroll
      for (int r = 0; r < R; ++r) fp8x16_to_f32(wv[u][r], wf[r]);
      float s[R];
      if constexpr (kBlockScale) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t row = min(o0 + r, p.out_features - 1);
          s[r] = load_any(p.scales, p.scale_dtype,
                          (row / p.block_out) * p.scale_cols + cc * 16 / p.block_in);
        }
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (j >= p.n) break;
        float xv[16], xb[8];
        load<8, T>(x + j * p.ldx + cc * 16, xb);
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[e] = xb[e];
        load<8, T>(x + j * p.ldx + cc * 16 + 8, xb);
#pragma unroll
        for (int e = 0; e < 8; ++e) xv[8 + e] = xb[e];
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
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t o = o0 + r;
    if (o >= p.out_features) break;
    const float s =
        kBlockScale ? 1.f : load_any(p.scales, p.scale_dtype, int64_t(p.scale_stride) * o);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (j >= p.n) break;
      const float v = kBlockScale ? acc[r][j] : acc[r][j] * s;
      if (gridDim.y == 1) {
        const float b = p.bias ? load_any(p.bias, p.bias_dtype, o) : 0.f;
        static_cast<TO*>(p.out)[j * p.ldo + o] = from_f32<TO>(v + b);
      } else {
        p.partial[(int64_t(blockIdx.y) * p.n + j) * p.out_features + o] = v;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The K slices' partials added in slice order (+ bias).

template <typename TO>
struct ReduceSplits {
  const float* partial;  // [splits, n, out]
  int64_t splits, n, out_features;
  const void* bias;
  DType bias_dtype;
  void* out;
  int64_t ldo;
  __device__ void operator()(int64_t j, int64_t o) const {
    float v = 0.f;
    for (int64_t s = 0; s < splits; ++s) v += partial[(s * n + j) * out_features + o];
    if (bias) v += load_any(bias, bias_dtype, o);
    static_cast<TO*>(out)[j * ldo + o] = from_f32<TO>(v);
  }
};

// ---------------------------------------------------------------------------------------------
// Dequantization into a dense [out, in] scratch of T (the prefill path): f32 math, one rounding.

struct DequantParams {
  const void* qweight;
  const void* scales;
  DType scale_dtype;
  const uint32_t* qzeros;
  void* dst;  // [out, in]
  int64_t in, out_features, group;
  int zero_offset;
  int64_t block_out, block_in, scale_cols;
  int scale_stride;
};

// GPTQ: thread (r, o) writes inputs 8r..8r+7 of row o (a group may end inside them).
template <typename T>
struct DequantGptq {
  DequantParams p;
  __device__ void operator()(int64_t r, int64_t o) const {
    const uint32_t v = static_cast<const uint32_t*>(p.qweight)[r * p.out_features + o];
    float d[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t grp = (r * 8 + k) / p.group;
      const int z = int((p.qzeros[grp * (p.out_features / 8) + o / 8] >> (4 * (o % 8))) & 0xf) +
                    p.zero_offset;
      const float s = load_any(p.scales, p.scale_dtype, grp * p.out_features + o);
      d[k] = float(int((v >> (4 * k)) & 0xf) - z) * s;
    }
    store<8, T>(static_cast<T*>(p.dst) + o * p.in + r * 8, d);
  }
};

// AWQ: thread (r, p) reads words [8r..8r+7, p] and writes inputs 8r..8r+7 of columns 8p..8p+7.
template <typename T>
struct DequantAwq {
  DequantParams p;
  __device__ void operator()(int64_t r, int64_t col) const {
    constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column 8p + c sits in nibble kNibble[c]
    const int64_t words = p.out_features / 8;
    float d[8][8];  // [column][input]
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t v = static_cast<const uint32_t*>(p.qweight)[(r * 8 + k) * words + col];
      const int64_t grp = (r * 8 + k) / p.group;
      const uint32_t zw = p.qzeros[grp * words + col];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int z = int((zw >> (4 * kNibble[c])) & 0xf);
        const float s = load_any(p.scales, p.scale_dtype, grp * p.out_features + col * 8 + c);
        d[c][k] = float(int((v >> (4 * kNibble[c])) & 0xf) - z) * s;
      }
    }
#pragma unroll
    for (int c = 0; c < 8; ++c)
      store<8, T>(static_cast<T*>(p.dst) + (col * 8 + c) * p.in + r * 8, d[c]);
  }
};

// FP8: thread (o, k) writes element [o, k].
template <typename T>
struct DequantFp8 {
  DequantParams p;
  bool block;
  __device__ void operator()(int64_t o, int64_t k) const {
    const uint8_t b = static_cast<const uint8_t*>(p.qweight)[o * p.in + k];
    const __half_raw raw = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3);
    const float s =
        block ? load_any(p.scales, p.scale_dtype, (o / p.block_out) * p.scale_cols + k / p.block_in)
              : load_any(p.scales, p.scale_dtype, int64_t(p.scale_stride) * o);
    static_cast<T*>(p.dst)[o * p.in + k] = from_f32<T>(__half2float(__half(raw)) * s);
  }
};

// ---------------------------------------------------------------------------------------------
// Planning.

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct GemvPlan {
  std::string refusal;  // why the GEMV cannot run ("" when it can)
  int64_t tile = 0;     // output columns (int4) or rows (FP8) per CTA
  int awq_words = 1;    // V of awq_gemv_kernel
  int64_t splits = 1, k_per_split = 0;
  int64_t col_tiles = 0;
  int64_t partial_bytes = 0;
};

GemvPlan plan_gemv(const QArgs& a, const QuantizedWeight& w, const QuantConfig& q) {
  GemvPlan pl;
  const int64_t es = int64_t(dtype_size(a.x_dtype));
  if (a.x_dtype == DType::kF32) pl.refusal = "f32 x";
  if (a.n < 1 || a.n > kQuantizedGemvMaxRows)
    pl.refusal = LONGCTX_FORMAT("n = {} outside [1, {}]", a.n, kQuantizedGemvMaxRows);
  const int64_t pass_rows = std::min(a.n, kQuantizedGemvPassRows);
  if (!aligned16(w.qweight.data_ptr())) pl.refusal = "qweight not 16-byte aligned";
  if (!pl.refusal.empty()) return pl;
  int64_t unit = 8;  // K granularity of a slice
  int64_t max_splits = kQuantizedMaxSplits;
  bool stages_x = true;
  switch (w.method) {
    case QuantMethod::kGptq:
      if (q.group_of(a.in) % 8 != 0)
        pl.refusal = LONGCTX_FORMAT("GPTQ group size {} not a multiple of 8", q.group_of(a.in));
      pl.tile = 32 * 4;
      break;
    case QuantMethod::kAwq:
      pl.awq_words = pass_rows == 1 && a.out_features % 32 == 0   ? 4
                     : pass_rows <= 2 && a.out_features % 16 == 0 ? 2
                                                                  : 1;
      pl.tile = 32 * 8 * pl.awq_words;
      break;
    default:  // FP8
      stages_x = false;
      unit = 16;
      if (a.in % 16 != 0) pl.refusal = LONGCTX_FORMAT("in_features {} not a multiple of 16", a.in);
      if (w.method == QuantMethod::kFp8Block && q.block_in % 16 != 0)
        pl.refusal =
            LONGCTX_FORMAT("block width {} not a multiple of 16 (a chunk's one scale)", q.block_in);
      if (!aligned16(a.x) || (a.n > 1 && (a.ldx * es) % 16 != 0))
        pl.refusal = "x rows not 16-byte aligned";
      pl.tile = kWarps * kFp8Rows;
      max_splits = std::max<int64_t>(1, std::min(max_splits, a.in / 1024));
      break;
  }
  if (!pl.refusal.empty()) return pl;
  pl.col_tiles = ceil_div(a.out_features, pl.tile);
  const int64_t min_splits = stages_x ? ceil_div(a.in, kSliceK) : 1;
  const int64_t target = int64_t(kCtasPerSm) * kernels::cuda::device_props(a.device.index).sm_count;
  int64_t splits = std::max(min_splits, std::min(max_splits, ceil_div(target, pl.col_tiles)));
  pl.k_per_split = ceil_div(ceil_div(a.in, splits), unit) * unit;
  pl.splits = ceil_div(a.in, pl.k_per_split);
  if (pl.splits > kQuantizedMaxSplits) {
    pl.refusal = LONGCTX_FORMAT("in_features {} needs {} K slices (at most {})", a.in, pl.splits,
                                kQuantizedMaxSplits);
    return pl;
  }
  if (pl.col_tiles > 0x7fffffff) pl.refusal = "too many output tiles";
  pl.partial_bytes = pl.splits > 1 ? pl.splits * pass_rows * a.out_features * 4 : 0;
  return pl;
}

std::string gemv_name(const QuantizedWeight& w, const GemvPlan& pl) {
  const char* f = w.method == QuantMethod::kGptq       ? "gptq"
                  : w.method == QuantMethod::kAwq      ? "awq"
                  : w.method == QuantMethod::kFp8Block ? "fp8-block"
                                                       : "fp8-channel";
  return LONGCTX_FORMAT(
      "gemv {} tile {} splits {} ({} inputs each){}", f, pl.tile, pl.splits, pl.k_per_split,
      w.method == QuantMethod::kAwq ? LONGCTX_FORMAT(" awq words {}", pl.awq_words)
                                    : std::string());
}

GemvParams gemv_params(const QArgs& a, const QuantizedWeight& w, const QuantConfig& q,
                       const GemvPlan& pl, void* partial) {
  GemvParams p{};
  p.x = a.x;
  p.ldx = a.ldx;
  p.n = int(a.n);
  p.qweight = w.qweight.data_ptr();
  p.scales = w.scales.data_ptr();
  p.scale_dtype = w.scales.dtype();
  p.qzeros = w.qzeros.defined() ? static_cast<const uint32_t*>(w.qzeros.data_ptr()) : nullptr;
  p.bias = a.bias;
  p.bias_dtype = a.bias_dtype;
  p.out = a.out;
  p.ldo = a.ldo;
  p.partial = static_cast<float*>(partial);
  p.in = a.in;
  p.out_features = a.out_features;
  p.k_per_split = pl.k_per_split;
  p.group = q.group_of(a.in);
  p.zero_offset = w.method == QuantMethod::kGptq && q.gptq_zero_minus_one ? 1 : 0;
  p.block_out = std::max<int64_t>(q.block_out, 1);
  p.block_in = std::max<int64_t>(q.block_in, 1);
  p.scale_cols = ceil_div(a.in, p.block_in);
  p.scale_stride = q.fp8_strategy == Fp8ScaleStrategy::kChannel ? 1 : 0;
  return p;
}

template <int N, typename T, typename TO>
void launch_gemv_typed(const QArgs& a, const QuantizedWeight& w, const GemvPlan& pl,
                       const GemvParams& p, cudaStream_t stream) {
  const dim3 grid{unsigned(pl.col_tiles), unsigned(pl.splits)}, block{kThreads};
  switch (w.method) {
    case QuantMethod::kGptq:
      return kernels::cuda::launch_pdl(gptq_gemv_kernel<N, T, TO>, grid, block, 0, stream, p);
    case QuantMethod::kAwq:
      if constexpr (N == 1) {
        if (pl.awq_words == 4)
          return kernels::cuda::launch_pdl(awq_gemv_kernel<N, 4, T, TO>, grid, block, 0, stream, p);
      }
      if constexpr (N <= 2) {
        if (pl.awq_words == 2)
          return kernels::cuda::launch_pdl(awq_gemv_kernel<N, 2, T, TO>, grid, block, 0, stream, p);
      }
      return kernels::cuda::launch_pdl(awq_gemv_kernel<N, 1, T, TO>, grid, block, 0, stream, p);
    case QuantMethod::kFp8Block:
      return kernels::cuda::launch_pdl(fp8_gemv_kernel<N, true, T, TO>, grid, block, 0, stream, p);
    default:
      return kernels::cuda::launch_pdl(fp8_gemv_kernel<N, false, T, TO>, grid, block, 0, stream, p);
  }
}

template <int N>
void launch_gemv_n(const QArgs& a, const QuantizedWeight& w, const GemvPlan& pl,
                   const GemvParams& p, cudaStream_t stream) {
  visit_float(a.x_dtype, "quantized_linear", [&](auto xt) {
    using T = decltype(xt);
    if constexpr (!std::is_same_v<T, float>) {
      if (a.out_dtype == DType::kF32)
        launch_gemv_typed<N, T, float>(a, w, pl, p, stream);
      else
        launch_gemv_typed<N, T, T>(a, w, pl, p, stream);
    }
  });
}

void launch_gemv(const QArgs& a, const QuantizedWeight& w, const GemvPlan& pl, const GemvParams& p,
                 cudaStream_t stream) {
  // Row counts round up to a power of two (a kernel per N, not per n: the GEMVs are bound by the
  // weight's bytes, which every row shares).
  if (a.n == 1) return launch_gemv_n<1>(a, w, pl, p, stream);
  if (a.n == 2) return launch_gemv_n<2>(a, w, pl, p, stream);
  if (a.n <= 4) return launch_gemv_n<4>(a, w, pl, p, stream);
  return launch_gemv_n<8>(a, w, pl, p, stream);
}

void launch_dequant(const QArgs& a, const QuantizedWeight& w, const QuantConfig& q, void* dst,
                    cudaStream_t stream) {
  DequantParams d{};
  d.qweight = w.qweight.data_ptr();
  d.scales = w.scales.data_ptr();
  d.scale_dtype = w.scales.dtype();
  d.qzeros = w.qzeros.defined() ? static_cast<const uint32_t*>(w.qzeros.data_ptr()) : nullptr;
  d.dst = dst;
  d.in = a.in;
  d.out_features = a.out_features;
  d.group = q.group_of(a.in);
  d.zero_offset = w.method == QuantMethod::kGptq && q.gptq_zero_minus_one ? 1 : 0;
  d.block_out = std::max<int64_t>(q.block_out, 1);
  d.block_in = std::max<int64_t>(q.block_in, 1);
  d.scale_cols = ceil_div(a.in, d.block_in);
  d.scale_stride = q.fp8_strategy == Fp8ScaleStrategy::kChannel ? 1 : 0;
  visit_float(a.x_dtype, "quantized_linear", [&](auto xt) {
    using T = decltype(xt);
    switch (w.method) {
      case QuantMethod::kGptq:
        return launch_rows(DequantGptq<T>{d}, a.in / 8, a.out_features, stream);
      case QuantMethod::kAwq:
        return launch_rows(DequantAwq<T>{d}, a.in / 8, a.out_features / 8, stream);
      default:
        return launch_rows(DequantFp8<T>{d, w.method == QuantMethod::kFp8Block}, a.out_features,
                           a.in, stream);
    }
  });
}

// The op's own workspace per (device, stream), for callers that pass none.
Tensor& own_workspace(Device device, cudaStream_t stream) {
  static std::mutex mu;
  static std::unordered_map<cudaStream_t, Tensor>* buffers[kMaxCudaDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  auto*& m = buffers[device.index];
  if (!m) m = new std::unordered_map<cudaStream_t, Tensor>();  // never destroyed (see linear)
  return (*m)[stream];
}

void* workspace_ptr(const Tensor& given, int64_t bytes, Device device, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  if (given.defined()) {
    LONGCTX_CHECK(
        given.device() == device && given.is_contiguous() && int64_t(given.nbytes()) >= bytes,
        ErrorCode::kInvalidArgument,
        "quantized_linear: workspace {} is too small or elsewhere: {} bytes on {} needed",
        given.str(), bytes, device.str());
    return given.data_ptr();
  }
  Tensor& ws = own_workspace(device, stream);
  if (!ws.defined() || int64_t(ws.nbytes()) < bytes) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    LONGCTX_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    LONGCTX_CHECK(status == cudaStreamCaptureStatusNone, ErrorCode::kInvalidArgument,
                  "quantized_linear: {} bytes of workspace needed while capturing a CUDA graph: "
                  "pass a workspace (quantized_linear_workspace_bytes) or warm the shape up first",
                  bytes);
    // The old buffer may still be read by queued kernels of this stream.
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
    ws = Tensor::empty({bytes}, DType::kU8, device);
  }
  return ws.data_ptr();
}

w8a8_detail::W8a8Args w8a8_args(const QArgs& a) {
  w8a8_detail::W8a8Args b;
  b.x = a.x;
  b.out = a.out;
  b.bias = a.bias;
  b.n = a.n;
  b.ldx = a.ldx;
  b.ldo = a.ldo;
  b.x_dtype = a.x_dtype;
  b.out_dtype = a.out_dtype;
  b.bias_dtype = a.bias_dtype;
  b.device = a.device;
  return b;
}

// The path (quantized_linear_schedule) and, for W8A8, the rows per chunk; cuBLASLt's refusal of
// the W8A8 GEMMs sends kAuto to the dequantizing path and is an error for a requested kW8a8.
struct Route {
  QuantizedLinearPath path = QuantizedLinearPath::kDequantGemm;
  GemvPlan gemv;
  int64_t chunk_rows = 0;
  std::string w8a8_refusal;
};

Route route(const QArgs& a, const QuantizedWeight& w, const QuantConfig& q,
            QuantizedLinearPath path, const Tensor& workspace) {
  Route r;
  r.gemv = plan_gemv(a, w, q);
  QuantizedLinearProblem p;
  p.n = a.n;
  p.x_dtype = a.x_dtype;
  p.out_dtype = a.out_dtype;
  const auto& props = kernels::cuda::device_props(a.device.index);
  p.sm = props.major * 10 + props.minor;
  p.requested = path;
  p.gemv_refusal = r.gemv.refusal;
  p.out_aligned16 =
      aligned16(a.out) && (a.n <= 1 || (a.ldo * int64_t(dtype_size(a.out_dtype))) % 16 == 0);
  const QuantizedLinearSchedule s = quantized_linear_schedule(p, w, q);
  r.path = s.path;
  r.w8a8_refusal = s.w8a8_refusal;
  if (r.path != QuantizedLinearPath::kW8a8) return r;
  r.chunk_rows = w8a8_chunk_rows(a.n, w, workspace.defined() ? int64_t(workspace.nbytes()) : 0);
  r.w8a8_refusal = w8a8_detail::w8a8_gemm_refusal(w8a8_args(a), w, q, r.chunk_rows);
  if (!r.w8a8_refusal.empty()) {
    LONGCTX_CHECK(path != QuantizedLinearPath::kW8a8, ErrorCode::kUnsupported,
                  "quantized_linear: W8A8 cannot run n = {}, [{}, {}]: {}", a.n, a.out_features,
                  a.in, r.w8a8_refusal);
    r.path = QuantizedLinearPath::kDequantGemm;
  }
  return r;
}

}  // namespace

void quantized_linear_cuda(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                           const Tensor& bias, const Tensor& out, const Tensor& workspace,
                           QuantizedLinearPath path) {
  const QArgs a = q_args(x, w, q, bias, out);
  DeviceGuard guard(a.device.index);
  cudaStream_t stream = op_stream(a.device, "quantized_linear");
  if (a.n == 0) return;
  const Route r = route(a, w, q, path, workspace);
  const GemvPlan& pl = r.gemv;
  if (r.path == QuantizedLinearPath::kW8a8) {
    const int64_t bytes = w8a8_layout(r.chunk_rows, w).bytes;
    void* ws = workspace_ptr(workspace, bytes, a.device, stream);
    w8a8_detail::run_w8a8(w8a8_args(a), w, q, r.chunk_rows, ws, stream);
    return;
  }
  if (r.path == QuantizedLinearPath::kGemv) {
    void* partial = workspace_ptr(workspace, pl.partial_bytes, a.device, stream);
    // Passes of up to 8 rows, in stream order (a pass's reduction reads the partials before the
    // next pass writes them).
    for (int64_t r0 = 0; r0 < a.n; r0 += kQuantizedGemvPassRows) {
      QArgs pass = a;
      pass.n = std::min(kQuantizedGemvPassRows, a.n - r0);
      pass.x = static_cast<const char*>(a.x) + r0 * a.ldx * int64_t(dtype_size(a.x_dtype));
      pass.out = static_cast<char*>(a.out) + r0 * a.ldo * int64_t(dtype_size(a.out_dtype));
      const GemvParams p = gemv_params(pass, w, q, pl, partial);
      launch_gemv(pass, w, pl, p, stream);
      if (pl.splits > 1)
        visit_float(a.out_dtype, "quantized_linear", [&](auto to) {
          using TO = decltype(to);
          launch_rows(ReduceSplits<TO>{p.partial, pl.splits, pass.n, a.out_features, a.bias,
                                       a.bias_dtype, pass.out, a.ldo},
                      pass.n, a.out_features, stream);
        });
    }
    return;
  }
  const int64_t bytes = a.out_features * a.in * int64_t(dtype_size(a.x_dtype));
  void* scratch = workspace_ptr(workspace, bytes, a.device, stream);
  launch_dequant(a, w, q, scratch, stream);
  const Tensor dense = Tensor::from_blob(scratch, {a.out_features, a.in}, a.x_dtype, a.device);
  linear_cuda(x, dense, bias, out);
}

std::string quantized_linear_cuda_plan(const Tensor& x, const QuantizedWeight& w,
                                       const QuantConfig& q, const Tensor& bias, const Tensor& out,
                                       QuantizedLinearPath path) {
  const QArgs a = q_args(x, w, q, bias, out);
  DeviceGuard guard(a.device.index);
  if (a.n == 0) return "nothing (n = 0)";
  const Route r = route(a, w, q, path, Tensor());
  if (r.path == QuantizedLinearPath::kW8a8)
    return w8a8_detail::w8a8_plan(w8a8_args(a), w, q, r.chunk_rows);
  if (r.path == QuantizedLinearPath::kGemv) return gemv_name(w, r.gemv);
  // The dense plan's operands only need their addresses' alignment: a scratch is 256-aligned.
  const Tensor dense =
      Tensor::from_blob(w.qweight.data_ptr(), {a.out_features, a.in}, a.x_dtype, a.device);
  return "dequant + " + linear_cuda_plan(x, dense, bias, out) + " (w8a8: " + r.w8a8_refusal + ")";
}

}  // namespace longctx::ops
