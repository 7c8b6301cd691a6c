#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/linear_attention.h"
#include "kernels/cuda/mma_device.cuh"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using detail::cp_async_16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::from_f32;
using detail::smem_addr;
using detail::to_f32;

constexpr int kWarp = 32;

using detail::visit_float;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of v over the block (every thread calls it; `red` holds 32 floats of shared memory, free
// on entry and on return).
__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += red[w];
  __syncthreads();
  return total;
}

// The sequence that owns `row`: the last s with qo_indptr[s] <= row (empty sequences skipped).
__device__ int64_t seq_of_row(const int32_t* qo_indptr, int64_t num_seqs, int64_t row) {
  int64_t lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (qo_indptr[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// ---------------------------------------------------------------------------------------------
// Recurrent form.

constexpr int kRecurrentThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kRecurrentThreads)
    delta_rule_recurrent_kernel(GatedDeltaRuleParams p) {
  const int64_t s = blockIdx.x / p.num_v_heads, h = blockIdx.x % p.num_v_heads;
  const int64_t begin = p.qo_indptr[s], end = p.qo_indptr[s + 1];
  const int64_t dk = p.k_dim, dv = p.v_dim, kh = h / (p.num_v_heads / p.num_k_heads);
  extern __shared__ float smem[];
  float* qs = smem;       // [dk] normalized, scaled q of the token
  float* ks = smem + dk;  // [dk] normalized k
  float* red = ks + dk;   // [32]
  float* st = p.states[s] + h * dk * dv;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  for (int64_t t = begin; t < end; ++t) {
    const T* qt = q + t * p.q_stride_t + kh * p.q_stride_h;
    const T* kt = k + t * p.k_stride_t + kh * p.k_stride_h;
    float ssq = 0.f, ssk = 0.f;
    for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
      const float a = to_f32(qt[i]), b = to_f32(kt[i]);
      qs[i] = a;
      ks[i] = b;
      ssq += a * a;
      ssk += b * b;
    }
    ssq = block_sum(ssq, red);
    ssk = block_sum(ssk, red);
    const float inv_q = p.scale / sqrtf(ssq + p.l2norm_eps);
    const float inv_k = 1.f / sqrtf(ssk + p.l2norm_eps);
    for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
      qs[i] *= inv_q;
      ks[i] *= inv_k;
    }
    __syncthreads();
    const float decay = expf(p.g[t * p.g_stride_t + h]);
    const float beta = p.beta[t * p.beta_stride_t + h];
    const T* vt = v + t * p.v_stride_t + h * p.v_stride_h;
    T* ot = out + t * p.out_stride_t + h * p.out_stride_h;
    for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
      float* col = st + j;
      // S = decay S; delta = beta (v - S^T k)
      float kv = 0.f;
      for (int64_t i = 0; i < dk; ++i) {
        const float x = col[i * dv] * decay;
        col[i * dv] = x;
        kv += x * ks[i];
      }
      const float delta = (to_f32(vt[j]) - kv) * beta;
      // S += k delta^T; o = S^T q
      float o = 0.f;
      for (int64_t i = 0; i < dk; ++i) {
        const float x = col[i * dv] + ks[i] * delta;
        col[i * dv] = x;
        o += x * qs[i];
      }
      ot[j] = from_f32<T>(o);
    }
    __syncthreads();  // qs/ks are rewritten by the next token
  }
}

// The recurrent form with the state's columns split over CTAs: a CTA per (sequence, value head,
// kSplitCols columns), kSplitWarps warps splitting the k_dim rows (warp w: rows [w r, (w + 1) r),
// r = ceil(k_dim / kSplitWarps) <= kRows), a lane per column. Each thread keeps its rows of its
// column in registers across the sequence's tokens, so the state is read and written once per
// call, its loads independent of one another and coalesced (a warp's lanes are adjacent columns).
// The per-column dots S^T k and S^T q are partial sums per warp, added through shared memory; the
// l2 norms of q and k scale those sums (and k's update) instead of the vectors, which saves a
// barrier per token.
constexpr int kSplitCols = 32;
constexpr int kSplitWarps = 4;
constexpr int kSplitThreads = kSplitWarps * kWarp;

template <typename T, int kRows>
__global__ void __launch_bounds__(kSplitThreads)
    delta_rule_recurrent_split_kernel(GatedDeltaRuleParams p) {
  const int64_t s = blockIdx.x / p.num_v_heads, h = blockIdx.x % p.num_v_heads;
  const int64_t begin = p.qo_indptr[s], end = p.qo_indptr[s + 1];
  if (begin == end) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t dk = p.k_dim, dv = p.v_dim, kh = h / (p.num_v_heads / p.num_k_heads);
  const int64_t j = int64_t(blockIdx.y) * kSplitCols + lane;  // the thread's column
  const bool col = j < dv;
  const int rows = int((dk + kSplitWarps - 1) / kSplitWarps);
  const int64_t i0 = int64_t(warp) * rows;
  const int64_t left = dk - i0;
  const int mine = left <= 0 ? 0 : left < rows ? int(left) : rows;    // the rows it holds
  __shared__ float qs[kRows * kSplitWarps], ks[kRows * kSplitWarps];  // the token's raw q, k
  __shared__ float norms[2][kSplitWarps];                             // partial |q|^2, |k|^2
  __shared__ float dots[2][kSplitWarps][kWarp];  // partial S^T k, S^T q per warp and column
  float* st = p.states[s] + h * dk * dv;
  float S[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) S[r] = col && r < mine ? st[(i0 + r) * dv + j] : 0.f;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  for (int64_t t = begin; t < end; ++t) {
    const T* qt = q + t * p.q_stride_t + kh * p.q_stride_h;
    const T* kt = k + t * p.k_stride_t + kh * p.k_stride_h;
    float ssq = 0.f, ssk = 0.f;
    for (int64_t e = threadIdx.x; e < dk; e += blockDim.x) {
      const float a = to_f32(qt[e]), b = to_f32(kt[e]);
      qs[e] = a;
      ks[e] = b;
      ssq += a * a;
      ssk += b * b;
    }
    ssq = warp_sum(ssq);
    ssk = warp_sum(ssk);
    if (lane == 0) norms[0][warp] = ssq, norms[1][warp] = ssk;
    const float decay = expf(p.g[t * p.g_stride_t + h]);
    const float beta = p.beta[t * p.beta_stride_t + h];
    const float vj = col ? to_f32(v[t * p.v_stride_t + h * p.v_stride_h + j]) : 0.f;
    __syncthreads();
    ssq = 0.f, ssk = 0.f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) ssq += norms[0][w], ssk += norms[1][w];
    const float inv_q = p.scale / sqrtf(ssq + p.l2norm_eps);
    const float inv_k = 1.f / sqrtf(ssk + p.l2norm_eps);
    // S = decay S; delta = beta (v - S^T k)
    float kv = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < mine) {
        S[r] *= decay;
        kv += S[r] * ks[i0 + r];
      }
    }
    dots[0][warp][lane] = kv;
    __syncthreads();
    kv = 0.f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) kv += dots[0][w][lane];
    const float delta = (vj - kv * inv_k) * beta;
    // S += k delta^T; o = S^T q
    const float kd = delta * inv_k;
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < mine) {
        S[r] += ks[i0 + r] * kd;
        o += S[r] * qs[i0 + r];
      }
    }
    dots[1][warp][lane] = o;
    // Every warp is past its reads of qs / ks / norms / dots[0] once this barrier opens, so the
    // next token may rewrite them; dots[1] is rewritten only after two more barriers.
    __syncthreads();
    if (warp == 0 && col) {
      o = 0.f;
#pragma unroll
      for (int w = 0; w < kSplitWarps; ++w) o += dots[1][w][lane];
      out[t * p.out_stride_t + h * p.out_stride_h + j] = from_f32<T>(o * inv_q);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (col && r < mine) st[(i0 + r) * dv + j] = S[r];
}

// ---------------------------------------------------------------------------------------------
// Chunked (WY) form.

constexpr int kChunkThreads = 256;

// A chunk's rows c0 .. c0 + n - 1 of value head h (key head kh) into shared memory, a warp per
// row over `warps` warps: q and k l2-normalized (q also scaled) at row stride ld, the log decay
// as its cumulative sum within the chunk (in row order, as the reference adds it) and beta.
// Every thread of the block calls it; it ends on a barrier.
template <typename T>
__device__ void load_chunk_rows(const GatedDeltaRuleParams& p, int64_t c0, int n, int64_t h,
                                int64_t kh, int64_t ld, int warps, float* qs, float* ks, float* gc,
                                float* bt) {
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int64_t dk = p.k_dim;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  for (int i = warp; i < n; i += warps) {
    const int64_t t = c0 + i;
    const T* qt = q + t * p.q_stride_t + kh * p.q_stride_h;
    const T* kt = k + t * p.k_stride_t + kh * p.k_stride_h;
    float ssq = 0.f, ssk = 0.f;
    for (int64_t e = lane; e < dk; e += kWarp) {
      const float a = to_f32(qt[e]), b = to_f32(kt[e]);
      qs[i * ld + e] = a;
      ks[i * ld + e] = b;
      ssq += a * a;
      ssk += b * b;
    }
    ssq = warp_sum(ssq);
    ssk = warp_sum(ssk);
    const float inv_q = p.scale / sqrtf(ssq + p.l2norm_eps);
    const float inv_k = 1.f / sqrtf(ssk + p.l2norm_eps);
    for (int64_t e = lane; e < dk; e += kWarp) {
      qs[i * ld + e] *= inv_q;
      ks[i * ld + e] *= inv_k;
    }
    if (lane == 0) {
      gc[i] = p.g[t * p.g_stride_t + h];
      bt[i] = p.beta[t * p.beta_stride_t + h];
    }
  }
  __syncthreads();
  if (tid == 0) {
    float cum = 0.f;
    for (int i = 0; i < n; ++i) {
      cum += gc[i];
      gc[i] = cum;
    }
  }
  __syncthreads();
}

// Shared floats of one block at chunk size cs.
int64_t chunk_smem_floats(int64_t cs, int64_t dk, int64_t dv) {
  return 3 * cs * dk + cs * dv + cs * cs + 3 * cs + kWarp;
}

template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    delta_rule_chunked_kernel(GatedDeltaRuleParams p, int cs) {
  const int64_t s = blockIdx.x / p.num_v_heads, h = blockIdx.x % p.num_v_heads;
  const int64_t begin = p.qo_indptr[s], end = p.qo_indptr[s + 1];
  const int64_t dk = p.k_dim, dv = p.v_dim, kh = h / (p.num_v_heads / p.num_k_heads);
  const int tid = threadIdx.x;
  constexpr int kWarps = kChunkThreads / kWarp;
  extern __shared__ float smem[];
  float* qs = smem;          // [cs, dk] l2-normalized, scaled q
  float* ks = qs + cs * dk;  // [cs, dk] l2-normalized k
  float* ws = ks + cs * dk;  // [cs, dk] W = T (beta exp(G) k)
  float* us = ws + cs * dk;  // [cs, dv] U = T (beta v), then v_new = U - W S
  float* am = us + cs * dv;  // [cs, cs] A, then T = (I - A)^-1, then (q_i . k_j) exp(G_i - G_j)
  float* gc = am + cs * cs;  // [cs] cumulative log decay within the chunk
  float* bt = gc + cs;       // [cs] beta
  float* tmp = bt + cs;      // [cs] a row being solved, then exp(G_last - G_j)
  float* st = p.states[s] + h * dk * dv;
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  for (int64_t c0 = begin; c0 < end; c0 += cs) {
    const int n = int(end - c0 < cs ? end - c0 : int64_t(cs));
    __syncthreads();  // the previous chunk is done with every shared array
    load_chunk_rows<T>(p, c0, n, h, kh, dk, kWarps, qs, ks, gc, bt);
    // A = -(beta_i k_i . k_j) exp(G_i - G_j) below the diagonal, 1 on it.
    for (int idx = tid; idx < n * n; idx += kChunkThreads) {
      const int i = idx / n, j = idx % n;
      float a = i == j ? 1.f : 0.f;
      if (j < i) {
        float dot = 0.f;
        for (int64_t e = 0; e < dk; ++e) dot += ks[i * dk + e] * ks[j * dk + e];
        a = -bt[i] * dot * expf(gc[i] - gc[j]);
      }
      am[i * cs + j] = a;
    }
    __syncthreads();
    // T = (I - A)^-1 by forward substitution, row by row (rows above i already hold T):
    //   T[i][j] = A[i][j] + sum_{j<m<i} A[i][m] T[m][j]
    for (int i = 1; i < n; ++i) {
      for (int j = tid; j < i; j += kChunkThreads) {
        float acc = am[i * cs + j];
        for (int m = j + 1; m < i; ++m) acc += am[i * cs + m] * am[m * cs + j];
        tmp[j] = acc;
      }
      __syncthreads();
      for (int j = tid; j < i; j += kChunkThreads) am[i * cs + j] = tmp[j];
      __syncthreads();
    }
    // U = T (beta v), W = T (beta exp(G) k)
    for (int64_t idx = tid; idx < int64_t(n) * dv; idx += kChunkThreads) {
      const int i = int(idx / dv);
      const int64_t e = idx % dv;
      float acc = 0.f;
      for (int j = 0; j <= i; ++j)
        acc += am[i * cs + j] * bt[j] * to_f32(v[(c0 + j) * p.v_stride_t + h * p.v_stride_h + e]);
      us[i * dv + e] = acc;
    }
    for (int64_t idx = tid; idx < int64_t(n) * dk; idx += kChunkThreads) {
      const int i = int(idx / dk);
      const int64_t e = idx % dk;
      float acc = 0.f;
      for (int j = 0; j <= i; ++j) acc += am[i * cs + j] * bt[j] * expf(gc[j]) * ks[j * dk + e];
      ws[i * dk + e] = acc;
    }
    __syncthreads();
    // v_new = U - W S
    for (int64_t idx = tid; idx < int64_t(n) * dv; idx += kChunkThreads) {
      const int i = int(idx / dv);
      const int64_t j = idx % dv;
      float acc = us[i * dv + j];
      for (int64_t e = 0; e < dk; ++e) acc -= ws[i * dk + e] * st[e * dv + j];
      us[i * dv + j] = acc;
    }
    // (q_i . k_j) exp(G_i - G_j) for j <= i (T is no longer read), and exp(G_last - G_j).
    for (int idx = tid; idx < n * n; idx += kChunkThreads) {
      const int i = idx / n, j = idx % n;
      float f = 0.f;
      if (j <= i) {
        float dot = 0.f;
        for (int64_t e = 0; e < dk; ++e) dot += qs[i * dk + e] * ks[j * dk + e];
        f = dot * expf(gc[i] - gc[j]);
      }
      am[i * cs + j] = f;
    }
    if (tid < n) tmp[tid] = expf(gc[n - 1] - gc[tid]);
    __syncthreads();
    // o_i = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) v_new_j
    for (int64_t idx = tid; idx < int64_t(n) * dv; idx += kChunkThreads) {
      const int i = int(idx / dv);
      const int64_t j = idx % dv;
      const float di = expf(gc[i]);
      float o = 0.f;
      for (int64_t e = 0; e < dk; ++e) o += qs[i * dk + e] * di * st[e * dv + j];
      for (int m = 0; m <= i; ++m) o += am[i * cs + m] * us[m * dv + j];
      out[(c0 + i) * p.out_stride_t + h * p.out_stride_h + j] = from_f32<T>(o);
    }
    __syncthreads();  // every read of the old state is done
    // S = exp(G_last) S + sum_j exp(G_last - G_j) k_j v_new_j^T
    const float dl = expf(gc[n - 1]);
    for (int64_t idx = tid; idx < dk * dv; idx += kChunkThreads) {
      const int64_t e = idx / dv, j = idx % dv;
      float x = st[idx] * dl;
      for (int m = 0; m < n; ++m) x += ks[m * dk + e] * tmp[m] * us[m * dv + j];
      st[idx] = x;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Chunked form in two passes (the organisation of fla's chunk_gated_delta_rule): a
// chunk-parallel precompute of everything that does not depend on the state, then a sequential
// pass per (sequence, value head, slice of kSlice state columns) that carries its state slice in
// shared memory across the chunks. The calls' chunks are numbered in sequence order ("slots":
// sequence s owns ceil(n_s / cs) of them); the workspace holds a segment of slots at a time.

constexpr int kMaxChunk = 64;  // the two-pass path's largest chunk (rows of every tile)
constexpr int kSlice = 32;     // state columns per sequential block, a lane per column
constexpr int kPassThreads = 256;
constexpr int kPassWarps = kPassThreads / kWarp;
constexpr int64_t kWorkspaceBudgetBytes = int64_t(256) << 20;

// Floats of one (slot, value head) in the workspace, every tile kMaxChunk rows (zero past the
// chunk's n rows):
//   W   [kMaxChunk, dk]   T (beta exp(G) k)
//   Qd  [kMaxChunk, dk]   exp(G_i) q_i (normalized, scaled)
//   Kd  [kMaxChunk, dk]   exp(G_last - G_j) k_j (normalized)
//   Aqk [kMaxChunk, kMaxChunk]  (q_i . k_j) exp(G_i - G_j) for j <= i, else 0
//   U   [kMaxChunk, dv]   T (beta v)
//   dl  [4]               exp(G_last), then padding (float4 alignment)
__host__ __device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

__host__ __device__ inline int64_t slot_floats(int64_t dk, int64_t dv) {
  return kMaxChunk * (3 * dk + kMaxChunk + dv) + 4;
}

// The slot's sequence and chunk: the first s whose chunks reach past `slot`; false when the
// call has fewer slots. Every thread walks the (few) sequences itself.
__device__ bool locate_slot(const int32_t* qo_indptr, int64_t num_seqs, int cs, int64_t slot,
                            int64_t& seq, int64_t& chunk) {
  int64_t first = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t n = qo_indptr[s + 1] - qo_indptr[s];
    const int64_t chunks = (n + cs - 1) / cs;
    if (slot < first + chunks) {
      seq = s;
      chunk = slot - first;
      return true;
    }
    first += chunks;
  }
  return false;
}

// Shared floats of the precompute at chunk cs: q and k rows padded to dk + 1 (the row-by-row
// dot products read a column across lanes without bank conflicts), the triangular matrix and
// the per-row gates.
int64_t prep_smem_floats(int64_t cs, int64_t dk) { return 2 * cs * (dk + 1) + cs * cs + 4 * cs; }

template <typename T>
__global__ void __launch_bounds__(kPassThreads)
    delta_rule_prep_kernel(GatedDeltaRuleParams p, int cs, int64_t slot0, float* workspace) {
  const int64_t h = blockIdx.y;
  int64_t s = 0, chunk = 0;
  if (!locate_slot(p.qo_indptr, p.num_seqs, cs, slot0 + blockIdx.x, s, chunk)) return;
  const int64_t c0 = p.qo_indptr[s] + chunk * cs;
  const int n = int(min64(p.qo_indptr[s + 1] - c0, cs));
  const int64_t dk = p.k_dim, dv = p.v_dim, kh = h / (p.num_v_heads / p.num_k_heads);
  const int64_t ld = dk + 1;
  const int tid = threadIdx.x;
  extern __shared__ float smem[];
  float* qs = smem;          // [cs, ld] l2-normalized, scaled q
  float* ks = qs + cs * ld;  // [cs, ld] l2-normalized k
  float* am = ks + cs * ld;  // [cs, cs] A, then T = (I - A)^-1
  float* gc = am + cs * cs;  // [cs] cumulative log decay within the chunk
  float* bt = gc + cs;       // [cs] beta
  float* eg = bt + cs;       // [cs] exp(G_j)
  float* tmp = eg + cs;      // [cs] a row being solved
  float* ws = workspace + (int64_t(blockIdx.x) * p.num_v_heads + h) * slot_floats(dk, dv);
  float* w_out = ws;                               // [kMaxChunk, dk]
  float* qd_out = w_out + kMaxChunk * dk;          // [kMaxChunk, dk]
  float* kd_out = qd_out + kMaxChunk * dk;         // [kMaxChunk, dk]
  float* aqk_out = kd_out + kMaxChunk * dk;        // [kMaxChunk, kMaxChunk]
  float* u_out = aqk_out + kMaxChunk * kMaxChunk;  // [kMaxChunk, dv]
  float* dl_out = u_out + kMaxChunk * dv;          // [4]
  const T* v = static_cast<const T*>(p.v);
  load_chunk_rows<T>(p, c0, n, h, kh, ld, kPassWarps, qs, ks, gc, bt);
  if (tid < n) eg[tid] = expf(gc[tid]);
  const float g_last = gc[n - 1];
  if (tid == 0) dl_out[0] = expf(g_last);
  // Qd, Kd (rows past n zero)
  for (int64_t idx = tid; idx < kMaxChunk * dk; idx += kPassThreads) {
    const int i = int(idx / dk);
    const int64_t e = idx % dk;
    float a = 0.f, b = 0.f;
    if (i < n) {
      a = qs[i * ld + e] * expf(gc[i]);
      b = ks[i * ld + e] * expf(g_last - gc[i]);
    }
    qd_out[idx] = a;
    kd_out[idx] = b;
  }
  // (q_i . k_j) exp(G_i - G_j) for j <= i < n, else 0.
  for (int idx = tid; idx < kMaxChunk * kMaxChunk; idx += kPassThreads) {
    const int i = idx / kMaxChunk, j = idx % kMaxChunk;
    float f = 0.f;
    if (j <= i && i < n) {
      float dot = 0.f;
      for (int64_t e = 0; e < dk; ++e) dot += qs[i * ld + e] * ks[j * ld + e];
      f = dot * expf(gc[i] - gc[j]);
    }
    aqk_out[idx] = f;
  }
  // A = -(beta_i k_i . k_j) exp(G_i - G_j) below the diagonal, 1 on it.
  for (int idx = tid; idx < n * n; idx += kPassThreads) {
    const int i = idx / n, j = idx % n;
    float a = i == j ? 1.f : 0.f;
    if (j < i) {
      float dot = 0.f;
      for (int64_t e = 0; e < dk; ++e) dot += ks[i * ld + e] * ks[j * ld + e];
      a = -bt[i] * dot * expf(gc[i] - gc[j]);
    }
    am[i * cs + j] = a;
  }
  __syncthreads();
  // T = (I - A)^-1 by forward substitution, row by row (rows above i already hold T).
  for (int i = 1; i < n; ++i) {
    for (int j = tid; j < i; j += kPassThreads) {
      float acc = am[i * cs + j];
      for (int m = j + 1; m < i; ++m) acc += am[i * cs + m] * am[m * cs + j];
      tmp[j] = acc;
    }
    __syncthreads();
    for (int j = tid; j < i; j += kPassThreads) am[i * cs + j] = tmp[j];
    __syncthreads();
  }
  // U = T (beta v), W = T (beta exp(G) k), rows past n zero.
  for (int64_t idx = tid; idx < kMaxChunk * dv; idx += kPassThreads) {
    const int i = int(idx / dv);
    const int64_t e = idx % dv;
    float acc = 0.f;
    for (int j = 0; j <= i && i < n; ++j)
      acc += am[i * cs + j] * bt[j] * to_f32(v[(c0 + j) * p.v_stride_t + h * p.v_stride_h + e]);
    u_out[idx] = acc;
  }
  for (int64_t idx = tid; idx < kMaxChunk * dk; idx += kPassThreads) {
    const int i = int(idx / dk);
    const int64_t e = idx % dk;
    float acc = 0.f;
    for (int j = 0; j <= i && i < n; ++j) acc += am[i * cs + j] * bt[j] * eg[j] * ks[j * ld + e];
    w_out[idx] = acc;
  }
}

// Shared floats of the sequential pass: the chunk's W, Qd, Kd, Aqk, its U slice, v_new's slice
// and the state slice.
template <int DK>
constexpr int64_t pass_smem_floats() {
  return 3 * kMaxChunk * DK + kMaxChunk * kMaxChunk + 2 * kMaxChunk * kSlice + DK * kSlice;
}

// One block per (sequence, value head, slice of kSlice columns), over the sequence's slots in
// [slot0, slot0 + num_slots). A lane owns a state column; warp w owns chunk rows
// [8 w, 8 w + 8) for v_new and o, and state rows [w DK / 8, (w + 1) DK / 8) for the update.
template <typename T, int DK>
__global__ void __launch_bounds__(kPassThreads)
    delta_rule_state_kernel(GatedDeltaRuleParams p, int cs, int64_t slot0, int64_t num_slots,
                            const float* workspace) {
  static_assert(kMaxChunk == 8 * kPassWarps && DK % (4 * kPassWarps) == 0);
  constexpr int kRows = kMaxChunk / kPassWarps;  // chunk rows per warp
  constexpr int kStateRows = DK / kPassWarps;    // state rows per warp
  const int64_t dv = p.v_dim, slices = dv / kSlice;
  const int64_t s = blockIdx.x / (p.num_v_heads * slices);
  const int64_t h = blockIdx.x / slices % p.num_v_heads, j0 = blockIdx.x % slices * kSlice;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  int64_t first = 0;  // the sequence's first slot
  for (int64_t r = 0; r < s; ++r) first += (p.qo_indptr[r + 1] - p.qo_indptr[r] + cs - 1) / cs;
  const int64_t begin = p.qo_indptr[s], len = p.qo_indptr[s + 1] - begin;
  const int64_t lo = max64(first, slot0);
  const int64_t hi = min64(first + (len + cs - 1) / cs, slot0 + num_slots);
  if (lo >= hi) return;
  extern __shared__ float smem[];
  float* w_s = smem;                           // [kMaxChunk, DK]
  float* qd_s = w_s + kMaxChunk * DK;          // [kMaxChunk, DK]
  float* kd_s = qd_s + kMaxChunk * DK;         // [kMaxChunk, DK]
  float* aqk_s = kd_s + kMaxChunk * DK;        // [kMaxChunk, kMaxChunk]
  float* u_s = aqk_s + kMaxChunk * kMaxChunk;  // [kMaxChunk, kSlice] U, then v_new
  float* st_s = u_s + kMaxChunk * kSlice;      // [DK, kSlice]
  float* state = p.states[s] + h * DK * dv + j0;
  for (int e = warp; e < DK; e += kPassWarps) st_s[e * kSlice + lane] = state[e * dv + lane];
  T* out = static_cast<T*>(p.out);
  const int64_t sf = slot_floats(DK, dv);
  auto tile = [&](int64_t slot) { return workspace + ((slot - slot0) * p.num_v_heads + h) * sf; };
  // Asynchronous copies of `floats` contiguous floats into shared memory.
  auto copy = [&](float* dst, const float* src, int floats) {
    for (int idx = tid; idx < floats / 4; idx += kPassThreads)
      cp_async_16(smem_addr(dst + 4 * idx), src + 4 * idx, 16);
  };
  // W and Qd of a chunk are copied while the chunk before it finishes (they are dead after its
  // q S), Kd, Aqk and U when it starts.
  copy(w_s, tile(lo), 2 * kMaxChunk * DK);
  cp_async_commit();
  for (int64_t slot = lo; slot < hi; ++slot) {
    const int64_t c0 = begin + (slot - first) * cs;
    const int n = int(min64(begin + len - c0, cs));
    const float* ws = tile(slot);
    __syncthreads();  // the previous chunk is done with Kd, Aqk and v_new
    copy(kd_s, ws + 2 * kMaxChunk * DK, kMaxChunk * DK + kMaxChunk * kMaxChunk);
    {
      const float* u = ws + 3 * kMaxChunk * DK + kMaxChunk * kMaxChunk + j0;
      for (int idx = tid; idx < kMaxChunk * kSlice / 4; idx += kPassThreads) {
        const int i = idx / (kSlice / 4), c = idx % (kSlice / 4);
        cp_async_16(smem_addr(u_s + i * kSlice + 4 * c), u + i * dv + 4 * c, 16);
      }
    }
    cp_async_commit();
    const float dl = ws[3 * kMaxChunk * DK + kMaxChunk * kMaxChunk + kMaxChunk * dv];
    cp_async_wait<0>();
    __syncthreads();
    const int r0 = warp * kRows;
    // v_new = U - W S
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = u_s[(r0 + r) * kSlice + lane];
    for (int e = 0; e < DK; e += 4) {
      const float s0 = st_s[e * kSlice + lane], s1 = st_s[(e + 1) * kSlice + lane];
      const float s2 = st_s[(e + 2) * kSlice + lane], s3 = st_s[(e + 3) * kSlice + lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 w = *reinterpret_cast<const float4*>(w_s + (r0 + r) * DK + e);
        acc[r] -= w.x * s0;
        acc[r] -= w.y * s1;
        acc[r] -= w.z * s2;
        acc[r] -= w.w * s3;
      }
    }
    // v_new into U's rows (each warp its own), then o_i = exp(G_i) q_i S (the old state) ...
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      u_s[(r0 + r) * kSlice + lane] = acc[r];
      acc[r] = 0.f;
    }
    for (int e = 0; e < DK; e += 4) {
      const float s0 = st_s[e * kSlice + lane], s1 = st_s[(e + 1) * kSlice + lane];
      const float s2 = st_s[(e + 2) * kSlice + lane], s3 = st_s[(e + 3) * kSlice + lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(qd_s + (r0 + r) * DK + e);
        acc[r] += x.x * s0;
        acc[r] += x.y * s1;
        acc[r] += x.z * s2;
        acc[r] += x.w * s3;
      }
    }
    __syncthreads();  // v_new complete; every read of the old state, W and Qd is done
    if (slot + 1 < hi) {
      copy(w_s, tile(slot + 1), 2 * kMaxChunk * DK);
      cp_async_commit();
    }
    // ... + sum_{m<=i} (q_i . k_j) exp(G_i - G_j) v_new_m (Aqk is zero past the diagonal)
    for (int m = 0; m < r0 + kRows; m += 4) {
      const float v0 = u_s[m * kSlice + lane], v1 = u_s[(m + 1) * kSlice + lane];
      const float v2 = u_s[(m + 2) * kSlice + lane], v3 = u_s[(m + 3) * kSlice + lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 a = *reinterpret_cast<const float4*>(aqk_s + (r0 + r) * kMaxChunk + m);
        acc[r] += a.x * v0;
        acc[r] += a.y * v1;
        acc[r] += a.z * v2;
        acc[r] += a.w * v3;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r0 + r < n)
        out[(c0 + r0 + r) * p.out_stride_t + h * p.out_stride_h + j0 + lane] = from_f32<T>(acc[r]);
    // S = exp(G_last) S + sum_m exp(G_last - G_m) k_m v_new_m^T
    const int e0 = warp * kStateRows;
    float sa[kStateRows];
#pragma unroll
    for (int r = 0; r < kStateRows; ++r) sa[r] = st_s[(e0 + r) * kSlice + lane] * dl;
    for (int m = 0; m < n; ++m) {
      const float vm = u_s[m * kSlice + lane];
#pragma unroll
      for (int r = 0; r < kStateRows; r += 4) {
        const float4 kd = *reinterpret_cast<const float4*>(kd_s + m * DK + e0 + r);
        sa[r] += kd.x * vm;
        sa[r + 1] += kd.y * vm;
        sa[r + 2] += kd.z * vm;
        sa[r + 3] += kd.w * vm;
      }
    }
#pragma unroll
    for (int r = 0; r < kStateRows; ++r) st_s[(e0 + r) * kSlice + lane] = sa[r];
  }
  __syncthreads();
  for (int e = warp; e < DK; e += kPassWarps) state[e * dv + lane] = st_s[e * kSlice + lane];
}

// ---------------------------------------------------------------------------------------------
// Causal conv1d.

template <typename T>
__global__ void conv_out_kernel(CausalConv1dParams p, int64_t rows) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.channels) return;
  const int64_t hist = p.kernel - 1;
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const float* wc = p.weight + c * p.kernel;
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y) {
    const int64_t s = seq_of_row(p.qo_indptr, p.num_seqs, t);
    const int64_t begin = p.qo_indptr[s];
    const float* state = p.states[s];  // the hist inputs before `begin`, oldest first
    float acc = 0.f;
    for (int64_t j = 0; j < p.kernel; ++j) {
      const int64_t src = t - hist + j;
      const float xv = src >= begin ? to_f32(x[src * p.x_stride_t + c])
                                    : state[(hist - (begin - src)) * p.channels + c];
      acc += wc[j] * xv;
    }
    out[t * p.out_stride_t + c] = from_f32<T>(p.silu ? acc / (1.f + expf(-acc)) : acc);
  }
}

// The new state: the last hist inputs of the sequence (old state entries where it had fewer
// rows). Entry j reads old entry j + n >= j, so ascending j updates in place.
template <typename T>
__global__ void conv_state_kernel(CausalConv1dParams p) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = blockIdx.y;
  if (c >= p.channels) return;
  const int64_t hist = p.kernel - 1, begin = p.qo_indptr[s], end = p.qo_indptr[s + 1];
  const int64_t n = end - begin;
  if (n == 0) return;
  const T* x = static_cast<const T*>(p.x);
  float* state = p.states[s];
  for (int64_t j = 0; j < hist; ++j) {
    const int64_t pos = end - hist + j;
    state[j * p.channels + c] =
        pos >= begin ? to_f32(x[pos * p.x_stride_t + c]) : state[(j + n) * p.channels + c];
  }
}

}  // namespace

void gated_delta_rule_recurrent(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return;
  const int64_t rows = (p.k_dim + kSplitWarps - 1) / kSplitWarps;
  if (rows > 64) return gated_delta_rule_recurrent_per_head(p, stream);
  const int64_t blocks = p.num_seqs * p.num_v_heads;
  const int64_t col_blocks = (p.v_dim + kSplitCols - 1) / kSplitCols;
  LONGCTX_CHECK(blocks <= 0x7fffffff && col_blocks <= 65535, ErrorCode::kInvalidArgument,
                "gated_delta_rule: {} sequences x {} heads, v_dim {}", p.num_seqs, p.num_v_heads,
                p.v_dim);
  const dim3 grid{unsigned(blocks), unsigned(col_blocks)};
  visit_float(p.dtype, "gated_delta_rule", [&](auto tag) {
    using T = decltype(tag);
    if (rows <= 32)
      delta_rule_recurrent_split_kernel<T, 32><<<grid, kSplitThreads, 0, stream>>>(p);
    else
      delta_rule_recurrent_split_kernel<T, 64><<<grid, kSplitThreads, 0, stream>>>(p);
    LONGCTX_CUDA_CHECK(cudaGetLastError());
  });
}

void gated_delta_rule_recurrent_per_head(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return;
  const int64_t blocks = p.num_seqs * p.num_v_heads;
  LONGCTX_CHECK(blocks <= 0x7fffffff, ErrorCode::kInvalidArgument,
                "gated_delta_rule: {} sequences x {} heads", p.num_seqs, p.num_v_heads);
  const int64_t smem = (2 * p.k_dim + kWarp) * int64_t(sizeof(float));
  visit_float(p.dtype, "gated_delta_rule", [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = delta_rule_recurrent_kernel<T>;
    require_dynamic_smem(kernel, int(smem));
    kernel<<<unsigned(blocks), kRecurrentThreads, size_t(smem), stream>>>(p);
    LONGCTX_CUDA_CHECK(cudaGetLastError());
  });
}

namespace {

int smem_optin() {
  int device = 0, optin = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  LONGCTX_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return optin;
}

// Whether the two-pass path takes the call: the tiles' shapes it is compiled for (the models'
// head dims), else the one-pass kernel runs.
bool two_pass(const GatedDeltaRuleParams& p, int optin) {
  const int64_t cs = std::max<int64_t>(1, p.chunk_size), f = int64_t(sizeof(float));
  if (cs > kMaxChunk || (p.k_dim != 64 && p.k_dim != 128) || p.v_dim % kSlice != 0) return false;
  if (p.v_dim == 0 || p.num_v_heads > 65535) return false;
  const int64_t pass = p.k_dim == 64 ? pass_smem_floats<64>() : pass_smem_floats<128>();
  return prep_smem_floats(cs, p.k_dim) * f <= optin && pass * f <= optin;
}

// An upper bound on the call's slots: sum_s ceil(n_s / cs) <= rows / cs + num_seqs.
int64_t max_slots(const GatedDeltaRuleParams& p, int64_t rows) {
  return rows / std::max<int64_t>(1, p.chunk_size) + p.num_seqs;
}

void one_pass(const GatedDeltaRuleParams& p, int optin, cudaStream_t stream) {
  const int64_t blocks = p.num_seqs * p.num_v_heads;
  LONGCTX_CHECK(blocks <= 0x7fffffff, ErrorCode::kInvalidArgument,
                "gated_delta_rule: {} sequences x {} heads", p.num_seqs, p.num_v_heads);
  int64_t cs = std::max<int64_t>(1, p.chunk_size);
  auto bytes = [&](int64_t c) {
    return chunk_smem_floats(c, p.k_dim, p.v_dim) * int64_t(sizeof(float));
  };
  while (cs > 1 && bytes(cs) > optin) cs = (cs + 1) / 2;
  LONGCTX_CHECK(bytes(cs) <= optin, ErrorCode::kUnsupported,
                "gated_delta_rule: head dims {}, {} need {} bytes of shared memory at chunk 1 "
                "(the device has {})",
                p.k_dim, p.v_dim, bytes(cs), optin);
  visit_float(p.dtype, "gated_delta_rule", [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = delta_rule_chunked_kernel<T>;
    require_dynamic_smem(kernel, int(bytes(cs)));
    kernel<<<unsigned(blocks), kChunkThreads, size_t(bytes(cs)), stream>>>(p, int(cs));
    LONGCTX_CUDA_CHECK(cudaGetLastError());
  });
}

template <typename T, int DK>
void launch_two_pass(const GatedDeltaRuleParams& p, int64_t rows, float* workspace, int64_t segment,
                     cudaStream_t stream) {
  const int cs = int(std::max<int64_t>(1, p.chunk_size));
  const int64_t slots = max_slots(p, rows);
  const int64_t state_blocks = p.num_seqs * p.num_v_heads * (p.v_dim / kSlice);
  LONGCTX_CHECK(state_blocks <= 0x7fffffff, ErrorCode::kInvalidArgument,
                "gated_delta_rule: {} sequences x {} heads", p.num_seqs, p.num_v_heads);
  const int64_t prep_bytes = prep_smem_floats(cs, DK) * int64_t(sizeof(float));
  const int64_t pass_bytes = pass_smem_floats<DK>() * int64_t(sizeof(float));
  auto* prep = delta_rule_prep_kernel<T>;
  auto* pass = delta_rule_state_kernel<T, DK>;
  require_dynamic_smem(prep, int(prep_bytes));
  require_dynamic_smem(pass, int(pass_bytes));
  for (int64_t slot0 = 0; slot0 < slots; slot0 += segment) {
    const int64_t num = std::min(segment, slots - slot0);
    prep<<<dim3(unsigned(num), unsigned(p.num_v_heads)), kPassThreads, size_t(prep_bytes),
           stream>>>(p, cs, slot0, workspace);
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    pass<<<unsigned(state_blocks), kPassThreads, size_t(pass_bytes), stream>>>(p, cs, slot0, num,
                                                                               workspace);
    LONGCTX_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

int64_t gated_delta_rule_chunked_workspace(const GatedDeltaRuleParams& p, int64_t rows) {
  if (p.num_seqs == 0 || p.num_v_heads == 0 || rows == 0 || !two_pass(p, smem_optin())) return 0;
  const int64_t per_slot = p.num_v_heads * slot_floats(p.k_dim, p.v_dim);
  const int64_t budget = std::max<int64_t>(1, kWorkspaceBudgetBytes / (per_slot * 4));
  return std::min(budget, max_slots(p, rows)) * per_slot;
}

void gated_delta_rule_chunked(const GatedDeltaRuleParams& p, int64_t rows, float* workspace,
                              int64_t workspace_floats, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return;
  const int optin = smem_optin();
  if (!two_pass(p, optin)) return one_pass(p, optin, stream);
  const int64_t segment = workspace_floats / (p.num_v_heads * slot_floats(p.k_dim, p.v_dim));
  LONGCTX_CHECK(workspace != nullptr && segment >= 1, ErrorCode::kInvalidArgument,
                "gated_delta_rule: a workspace of {} floats holds no chunk of {} heads",
                workspace_floats, p.num_v_heads);
  visit_float(p.dtype, "gated_delta_rule", [&](auto tag) {
    using T = decltype(tag);
    if (p.k_dim == 64)
      launch_two_pass<T, 64>(p, rows, workspace, segment, stream);
    else
      launch_two_pass<T, 128>(p, rows, workspace, segment, stream);
  });
}

void causal_conv1d(const CausalConv1dParams& p, int64_t rows, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.channels == 0) return;
  constexpr int kThreads = 128;
  const int64_t gx = (p.channels + kThreads - 1) / kThreads;
  LONGCTX_CHECK(gx <= 0x7fffffff && p.num_seqs <= 65535, ErrorCode::kInvalidArgument,
                "causal_conv1d: {} channels, {} sequences", p.channels, p.num_seqs);
  visit_float(p.dtype, "causal_conv1d", [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0) {
      const unsigned gy = unsigned(std::min<int64_t>(rows, 65535));
      conv_out_kernel<T><<<dim3(unsigned(gx), gy), kThreads, 0, stream>>>(p, rows);
      LONGCTX_CUDA_CHECK(cudaGetLastError());
    }
    if (p.kernel > 1) {
      conv_state_kernel<T><<<dim3(unsigned(gx), unsigned(p.num_seqs)), kThreads, 0, stream>>>(p);
      LONGCTX_CUDA_CHECK(cudaGetLastError());
    }
  });
}

}  // namespace longctx::kernels::cuda
