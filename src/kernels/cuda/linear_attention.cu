#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/linear_attention.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using detail::from_f32;
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

// ---------------------------------------------------------------------------------------------
// Chunked (WY) form.

constexpr int kChunkThreads = 256;

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
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
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
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  for (int64_t c0 = begin; c0 < end; c0 += cs) {
    const int n = int(end - c0 < cs ? end - c0 : int64_t(cs));
    __syncthreads();  // the previous chunk is done with every shared array
    // q, k rows l2-normalized, a warp per row.
    for (int i = warp; i < n; i += kWarps) {
      const int64_t t = c0 + i;
      const T* qt = q + t * p.q_stride_t + kh * p.q_stride_h;
      const T* kt = k + t * p.k_stride_t + kh * p.k_stride_h;
      float ssq = 0.f, ssk = 0.f;
      for (int64_t e = lane; e < dk; e += kWarp) {
        const float a = to_f32(qt[e]), b = to_f32(kt[e]);
        qs[i * dk + e] = a;
        ks[i * dk + e] = b;
        ssq += a * a;
        ssk += b * b;
      }
      ssq = warp_sum(ssq);
      ssk = warp_sum(ssk);
      const float inv_q = p.scale / sqrtf(ssq + p.l2norm_eps);
      const float inv_k = 1.f / sqrtf(ssk + p.l2norm_eps);
      for (int64_t e = lane; e < dk; e += kWarp) {
        qs[i * dk + e] *= inv_q;
        ks[i * dk + e] *= inv_k;
      }
      if (lane == 0) {
        gc[i] = p.g[t * p.g_stride_t + h];
        bt[i] = p.beta[t * p.beta_stride_t + h];
      }
    }
    __syncthreads();
    if (tid == 0) {  // the cumulative sum in row order, as the reference adds it
      float cum = 0.f;
      for (int i = 0; i < n; ++i) {
        cum += gc[i];
        gc[i] = cum;
      }
    }
    __syncthreads();
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

void gated_delta_rule_chunked(const GatedDeltaRuleParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.num_v_heads == 0) return;
  const int64_t blocks = p.num_seqs * p.num_v_heads;
  LONGCTX_CHECK(blocks <= 0x7fffffff, ErrorCode::kInvalidArgument,
                "gated_delta_rule: {} sequences x {} heads", p.num_seqs, p.num_v_heads);
  int device = 0, optin = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&device));
  LONGCTX_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
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
