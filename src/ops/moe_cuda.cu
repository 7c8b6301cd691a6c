// CUDA twins of the MoE ops. No step reads expert counts on the host, so a decode step with
// routing inside stays capturable in a CUDA graph.
//
// moe_route: one warp per token: softmax in fp32 (expf), then k rounds of a warp argmax over the
// total order (probability descending, expert index ascending), each round taking the first
// expert after the previous pick, so nothing is marked and ties go to the lower index.
//
// moe_experts, prefill (more than kDecodeMaxTokens tokens):
//   align:   one block counts the slots (token, j) per expert, pads each expert's run to whole
//            BM-row tiles, lists each tile's expert and each padded row's slot (-1: padding), and
//            each slot's row (inv);
//   gate_up: a grouped GEMM over the tiles: rows gathered from x by slot, the expert's gate and
//            up rows as two accumulators, silu(gate) * up written as the activation row;
//   down:    the same grouped GEMM over the activations into fp32 rows;
//   combine: out[t] = sum_j weight[t, j] * row(inv[t, j]) (+ sigmoid(shared_gate) * shared),
//            in a fixed j order, so the result does not depend on the atomics' order.
//   The GEMMs are launched over the most tiles the routing can need (ceil(T k / BM) + E); the
//   tiles past the count the align step wrote return at once.
// moe_experts, decode: one warp per (slot, output row) dot product that reads only the routed
// experts' rows, then the same combine.
#include <cuda_runtime.h>

#include "longctx/core/stream.h"
#include "ops/moe.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

constexpr int kBM = 64, kBN = 64, kBK = 16;  // grouped GEMM tile
constexpr int64_t kDecodeMaxTokens = 4;

// ---- routing ----

struct Pick {
  float p;
  int e;
};
// a before b in the order of picks
__device__ __forceinline__ bool before(const Pick& a, const Pick& b) {
  return a.p > b.p || (a.p == b.p && a.e < b.e);
}

template <typename TL>
__global__ void route_kernel(const TL* __restrict__ logits, int64_t tokens, int experts, int k,
                             bool renormalize, int32_t* __restrict__ ids,
                             float* __restrict__ weights) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= tokens) return;
  const TL* l = logits + t * experts;
  float mx = -INFINITY;
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, to_f32(l[e]));
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  for (int e = lane; e < experts; e += 32) sum += expf(to_f32(l[e]) - mx);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  Pick prev{INFINITY, -1};
  float picked = 0.f;
  for (int j = 0; j < k; ++j) {
    Pick best{-1.f, experts};  // after every real pick
    for (int e = lane; e < experts; e += 32) {
      const Pick c{expf(to_f32(l[e]) - mx) / sum, e};
      if (before(prev, c) && before(c, best)) best = c;
    }
    for (int o = 16; o > 0; o /= 2) {
      const Pick other{__shfl_xor_sync(0xffffffffu, best.p, o),
                       __shfl_xor_sync(0xffffffffu, best.e, o)};
      if (before(other, best)) best = other;
    }
    if (lane == 0) {
      ids[t * k + j] = best.e;
      weights[t * k + j] = best.p;
    }
    picked += best.p;
    prev = best;
  }
  __syncwarp();
  if (renormalize && lane < k) weights[t * k + lane] /= picked;
  if (renormalize)
    for (int j = lane + 32; j < k; j += 32) weights[t * k + j] /= picked;
}

// ---- prefill: align, grouped GEMMs ----

struct AlignOut {
  int32_t* counts;       // [E]
  int32_t* cursor;       // [E]
  int32_t* tile_expert;  // [max_tiles]
  int32_t* num_tiles;    // [1]
  int32_t* sorted;       // [max_tiles * kBM]: the slot of each padded row, -1 for padding
  int32_t* inv;          // [slots]: the padded row of each slot
};

// One block. Ids outside [0, E) (the CPU twin refuses them) are dropped: their slots get row -1
// and add nothing.
__global__ void align_kernel(const int32_t* __restrict__ ids, int64_t slots, int experts,
                             int64_t max_tiles, AlignOut o) {
  for (int e = threadIdx.x; e < experts; e += blockDim.x) o.counts[e] = 0;
  for (int64_t i = threadIdx.x; i < max_tiles * kBM; i += blockDim.x) o.sorted[i] = -1;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < experts) atomicAdd(&o.counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t tile = 0;
    for (int e = 0; e < experts; ++e) {
      o.cursor[e] = tile * kBM;
      const int32_t tiles = (o.counts[e] + kBM - 1) / kBM;
      for (int32_t i = 0; i < tiles; ++i) o.tile_expert[tile + i] = e;
      tile += tiles;
    }
    *o.num_tiles = tile;
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    int32_t row = -1;
    if (e >= 0 && e < experts) {
      row = atomicAdd(&o.cursor[e], 1);
      o.sorted[row] = static_cast<int32_t>(s);
    }
    o.inv[s] = row;
  }
}

struct GemmArgs {
  const void* a;               // gate_up: x [T, K]; down: act [rows, K] f32
  const void* w;               // [E, N_total, K]
  float* out;                  // gate_up: act [rows, N]; down: y [rows, N]
  const int32_t* sorted;       // padded row -> slot
  const int32_t* tile_expert;  // tile -> expert
  const int32_t* num_tiles;
  int top_k;
  int64_t n, k;  // output columns (inter for gate_up, hidden for down), reduction length
};

// A [kBM, kBN] tile of one expert's rows. kGateUp: A rows are x[slot / top_k] and two
// accumulators take the gate rows [n0, n0 + kBN) and the up rows [n + n0, ...) of W, written as
// silu(gate) * up; else A rows are the activation rows themselves.
template <typename TA, typename TW, bool kGateUp>
__global__ void __launch_bounds__(256) grouped_gemm_kernel(GemmArgs g) {
  const int tile = blockIdx.y;
  if (tile >= *g.num_tiles) return;
  const int e = g.tile_expert[tile];
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  const int64_t w_rows = kGateUp ? 2 * g.n : g.n;
  const TW* w = static_cast<const TW*>(g.w) + int64_t(e) * w_rows * g.k;
  __shared__ float as[kBK][kBM + 1];
  __shared__ float ws[kGateUp ? 2 : 1][kBK][kBN + 1];
  __shared__ int64_t a_row[kBM];
  const int tid = threadIdx.x;
  if (tid < kBM) {
    const int32_t slot = g.sorted[int64_t(tile) * kBM + tid];
    a_row[tid] = slot < 0 ? -1 : (kGateUp ? slot / g.top_k : int64_t(tile) * kBM + tid);
  }
  __syncthreads();
  const int tr = tid / 16, tc = tid % 16;  // each thread: rows tr + 16 i, cols tc + 16 j
  float acc[2][4][4] = {};
  for (int64_t k0 = 0; k0 < g.k; k0 += kBK) {
    for (int i = tid; i < kBM * kBK; i += 256) {
      const int r = i / kBK, c = i % kBK;
      const int64_t kk = k0 + c;
      float v = 0.f;
      if (a_row[r] >= 0 && kk < g.k) v = to_f32(static_cast<const TA*>(g.a)[a_row[r] * g.k + kk]);
      as[c][r] = v;
    }
    for (int half = 0; half < (kGateUp ? 2 : 1); ++half)
      for (int i = tid; i < kBN * kBK; i += 256) {
        const int r = i / kBK, c = i % kBK;
        const int64_t n = n0 + r, kk = k0 + c;
        float v = 0.f;
        if (n < g.n && kk < g.k) v = to_f32(w[(half * g.n + n) * g.k + kk]);
        ws[half][c][r] = v;
      }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kBK; ++c) {
      float a[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = as[c][tr + 16 * i];
#pragma unroll
      for (int half = 0; half < (kGateUp ? 2 : 1); ++half)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float b = ws[half][c][tc + 16 * j];
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[half][i][j] = fmaf(a[i], b, acc[half][i][j]);
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = tr + 16 * i;
    if (a_row[r] < 0) continue;
    const int64_t row = int64_t(tile) * kBM + r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tc + 16 * j;
      if (n >= g.n) continue;
      float v = acc[0][i][j];
      if constexpr (kGateUp) v = v / (1.0f + expf(-v)) * acc[1][i][j];
      g.out[row * g.n + n] = v;
    }
  }
}

// ---- decode: one warp per (slot, output column) ----

// kVecLoads: 16-byte loads of 8 elements per lane (k % 8 == 0, rows 16-byte aligned), so a warp
// streams 256 elements of a weight row per step; else one element per lane.
template <typename TA, typename TW, bool kGateUp, bool kVecLoads>
__global__ void __launch_bounds__(256)
    decode_gemv_kernel(const void* a_ptr, const void* w_ptr, const int32_t* __restrict__ ids,
                       int experts, int top_k, int64_t n, int64_t k, float* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t col = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int64_t slot = blockIdx.y;
  if (col >= n) return;
  const int e = ids[slot];
  if (e < 0 || e >= experts) {
    if (lane == 0) out[slot * n + col] = 0.f;
    return;
  }
  const int64_t w_rows = kGateUp ? 2 * n : n;
  const TW* w = static_cast<const TW*>(w_ptr) + int64_t(e) * w_rows * k;
  const TA* a = static_cast<const TA*>(a_ptr) + (kGateUp ? slot / top_k : slot) * k;
  float s0 = 0.f, s1 = 0.f;
  if constexpr (kVecLoads) {
    for (int64_t i = int64_t(lane) * kVec; i < k; i += 32 * kVec) {
      float x[kVec], w0[kVec], w1[kVec];
      load<kVec>(a + i, x);
      load<kVec>(w + col * k + i, w0);
      if constexpr (kGateUp) load<kVec>(w + (n + col) * k + i, w1);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        s0 = fmaf(w0[j], x[j], s0);
        if constexpr (kGateUp) s1 = fmaf(w1[j], x[j], s1);
      }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
      const float x = to_f32(a[i]);
      s0 = fmaf(to_f32(w[col * k + i]), x, s0);
      if constexpr (kGateUp) s1 = fmaf(to_f32(w[(n + col) * k + i]), x, s1);
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    s0 += __shfl_xor_sync(0xffffffffu, s0, o);
    if constexpr (kGateUp) s1 += __shfl_xor_sync(0xffffffffu, s1, o);
  }
  if (lane == 0) out[slot * n + col] = kGateUp ? s0 / (1.0f + expf(-s0)) * s1 : s0;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- combine ----

template <typename TO>
__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ inv,
                               const float* __restrict__ weights, int64_t tokens, int top_k,
                               int64_t hidden, const void* shared, DType shared_dtype,
                               const void* shared_gate, DType gate_dtype, TO* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden, c = i % hidden;
  float acc = 0.f;
  for (int j = 0; j < top_k; ++j) {
    const int64_t s = t * top_k + j;
    const int64_t row = inv ? inv[s] : s;
    if (row >= 0) acc += weights[s] * y[row * hidden + c];
  }
  if (shared) {
    const float g = load_any(shared_gate, gate_dtype, t);
    acc += load_any(shared, shared_dtype, i) / (1.0f + expf(-g));
  }
  out[i] = from_f32<TO>(acc);
}

template <typename F>
void visit_act_weight(DType a, DType w, F&& f) {
  visit_float(a, "moe_experts",
              [&](auto ta) { visit_float(w, "moe_experts", [&](auto tw) { f(ta, tw); }); });
}

}  // namespace

void moe_route_cuda(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
                    const Tensor& topk_weights) {
  check_moe_route_args(logits, topk_ids, topk_weights);
  const Device d = logits.device();
  DeviceGuard guard(d.index);
  cudaStream_t stream = op_stream(d, "moe_route");
  const int64_t t = logits.size(0);
  const int e = static_cast<int>(logits.size(1)), k = static_cast<int>(topk_ids.size(1));
  if (t == 0) return;
  constexpr int kWarps = 4;
  visit_float(logits.dtype(), "moe_route", [&](auto tl) {
    using TL = decltype(tl);
    route_kernel<TL><<<unsigned((t + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(
        static_cast<const TL*>(logits.data_ptr()), t, e, k, renormalize, topk_ids.data<int32_t>(),
        topk_weights.data<float>());
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void moe_experts_cuda(const MoeArgs& a) {
  const MoeShape s = check_moe_args(a);
  const Device d = a.x.device();
  DeviceGuard guard(d.index);
  cudaStream_t stream = op_stream(d, "moe_experts");
  LONGCTX_CHECK(a.gate_up.dtype() == a.down.dtype(), ErrorCode::kUnsupported,
                "moe_experts_cuda: gate_up ({}) and down ({}) must share a dtype",
                dtype_name(a.gate_up.dtype()), dtype_name(a.down.dtype()));
  if (s.tokens == 0) return;
  const int64_t slots = s.tokens * s.top_k;
  const int k = static_cast<int>(s.top_k), experts = static_cast<int>(s.experts);
  const int32_t* inv = nullptr;
  Tensor y;              // [rows, hidden] f32: each slot's expert output
  Tensor align_buffers;  // holds inv until the combine is enqueued
  if (s.tokens <= kDecodeMaxTokens) {
    Tensor act = Tensor::empty({slots, s.inter}, DType::kF32, d);
    y = Tensor::empty({slots, s.hidden}, DType::kF32, d);
    const bool vec1 =
        s.hidden % kVec == 0 && aligned16(a.x.data_ptr()) && aligned16(a.gate_up.data_ptr());
    const bool vec2 =
        s.inter % kVec == 0 && aligned16(act.data_ptr()) && aligned16(a.down.data_ptr());
    const dim3 grid1(unsigned((s.inter + 7) / 8), unsigned(slots));
    const dim3 grid2(unsigned((s.hidden + 7) / 8), unsigned(slots));
    const int32_t* ids = a.topk_ids.data<int32_t>();
    visit_act_weight(a.x.dtype(), a.gate_up.dtype(), [&](auto ta, auto tw) {
      using TA = decltype(ta);
      using TW = decltype(tw);
      if (vec1)
        decode_gemv_kernel<TA, TW, true, true>
            <<<grid1, 256, 0, stream>>>(a.x.data_ptr(), a.gate_up.data_ptr(), ids, experts, k,
                                        s.inter, s.hidden, act.data<float>());
      else
        decode_gemv_kernel<TA, TW, true, false>
            <<<grid1, 256, 0, stream>>>(a.x.data_ptr(), a.gate_up.data_ptr(), ids, experts, k,
                                        s.inter, s.hidden, act.data<float>());
      if (vec2)
        decode_gemv_kernel<float, TW, false, true><<<grid2, 256, 0, stream>>>(
            act.data_ptr(), a.down.data_ptr(), ids, experts, k, s.hidden, s.inter, y.data<float>());
      else
        decode_gemv_kernel<float, TW, false, false><<<grid2, 256, 0, stream>>>(
            act.data_ptr(), a.down.data_ptr(), ids, experts, k, s.hidden, s.inter, y.data<float>());
    });
    LONGCTX_CUDA_CHECK(cudaGetLastError());
  } else {
    const int64_t max_tiles = (slots + kBM - 1) / kBM + s.experts;
    LONGCTX_CHECK(max_tiles <= 65535, ErrorCode::kInvalidArgument,
                  "moe_experts: {} tokens x top-{} need up to {} row tiles (at most 65535)",
                  s.tokens, s.top_k, max_tiles);
    Tensor ints =
        Tensor::empty({2 * s.experts + max_tiles + 1 + max_tiles * kBM + slots}, DType::kI32, d);
    AlignOut o;
    o.counts = ints.data<int32_t>();
    o.cursor = o.counts + s.experts;
    o.tile_expert = o.cursor + s.experts;
    o.num_tiles = o.tile_expert + max_tiles;
    o.sorted = o.num_tiles + 1;
    o.inv = o.sorted + max_tiles * kBM;
    align_kernel<<<1, 1024, 0, stream>>>(a.topk_ids.data<int32_t>(), slots, experts, max_tiles, o);
    Tensor act = Tensor::empty({max_tiles * kBM, s.inter}, DType::kF32, d);
    y = Tensor::empty({max_tiles * kBM, s.hidden}, DType::kF32, d);
    GemmArgs g1{a.x.data_ptr(),
                a.gate_up.data_ptr(),
                act.data<float>(),
                o.sorted,
                o.tile_expert,
                o.num_tiles,
                k,
                s.inter,
                s.hidden};
    GemmArgs g2{act.data_ptr(),
                a.down.data_ptr(),
                y.data<float>(),
                o.sorted,
                o.tile_expert,
                o.num_tiles,
                k,
                s.hidden,
                s.inter};
    visit_act_weight(a.x.dtype(), a.gate_up.dtype(), [&](auto ta, auto tw) {
      using TA = decltype(ta);
      using TW = decltype(tw);
      grouped_gemm_kernel<TA, TW, true>
          <<<dim3(unsigned((s.inter + kBN - 1) / kBN), unsigned(max_tiles)), 256, 0, stream>>>(g1);
      grouped_gemm_kernel<float, TW, false>
          <<<dim3(unsigned((s.hidden + kBN - 1) / kBN), unsigned(max_tiles)), 256, 0, stream>>>(g2);
    });
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    inv = o.inv;
    align_buffers = ints;
  }
  const int64_t n = s.tokens * s.hidden;
  visit_float(a.out.dtype(), "moe_experts", [&](auto to) {
    using TO = decltype(to);
    combine_kernel<TO><<<unsigned((n + 255) / 256), 256, 0, stream>>>(
        y.data<float>(), inv, a.topk_weights.data<float>(), s.tokens, k, s.hidden,
        a.shared.defined() ? a.shared.data_ptr() : nullptr, a.shared.dtype(),
        a.shared_gate.defined() ? a.shared_gate.data_ptr() : nullptr, a.shared_gate.dtype(),
        static_cast<TO*>(a.out.data_ptr()));
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace longctx::ops
