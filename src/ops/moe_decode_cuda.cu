// The decode path of the CUDA MoE ops (<= kMoeDecodeMaxTokens tokens): two kernels that read
// only the routed experts' rows.
//
// gate/up: each warp kMoeDecodeRowsPerWarp activation columns of one slot (token, j): the gate
//   row and the up row of each streamed with 16-byte loads, silu(gate) * up written in fp32.
//   The slots' experts come from topk_ids: moe_forward_cuda routes first with moe_route's
//   kernel (4.4 us at 128 experts, 10 us at 512 on an H100). Routing inside this kernel instead
//   (every CTA sorting its token's probabilities before its loads) measured 1-2 us a layer slower
//   at one token than the two launches (docs/benchmarks.md, sixteenth session).
// down + combine: a CTA computes kMoeDecodeRowsPerWarp output rows of one token, one warp per
//   slot; the slots' fp32 rows meet in shared memory and one thread per row sums
//   weight[t, j] * row_j in slot order (+ sigmoid(shared_gate) * shared), as the combine kernel
//   of the prefill paths does: deterministic, no atomics, and no [slots, hidden] buffer.
// FP8 block experts (MoeArgs' codes and scales): the same kernels on the codes, 16 per 16-byte
//   load (half the bytes of bf16 rows, so the GEMVs stream half as long), converted in
//   registers; each lane's 16 products are summed and the sum multiplied by its block's scale
//   (one multiply per 16 weights rather than per weight, block_in % 16 == 0 so a load is in one
//   block). The fp32 result differs from the CPU twin's (which scales each weight, then dots) by
//   rounding alone.
// Both are launched with programmatic dependent launch and wait for the kernel before them
// first thing (kernels/cuda/pdl.cuh), so the block is router GEMV -> gate/up -> down. The down
// kernel does not prefetch its rows into L2 before that wait (its CTAs routing their token
// during gate/up, gate/up's loads evict-first): that measured slower on an H100, 48.0 against
// 42.0 us a Qwen3-30B-A3B layer at one token (FP8 experts: 41.1 against 33.4).
#include <cuda_runtime.h>

#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/stream.h"
#include "ops/moe.h"
#include "ops/moe_decode.h"
#include "ops/moe_fp8_device.cuh"
#include "ops/moe_schedule.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

constexpr int R = kMoeDecodeRowsPerWarp;

// The L2 policy of the weight loads: evict-normal, what a plain load gets. The loads name it
// (ld.global.nc.L2::cache_hint) rather than being plain __ldg loads for the register allocation
// alone: with __ldg, ptxas (CUDA 13.0) spills 20 bytes in the FP8 gate/up kernel of bf16
// activations at its 128-register bound, and none this way.
__device__ __forceinline__ uint64_t l2_evict_normal() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}

// 16 bytes of weights at p (16-byte aligned) under the L2 cache policy `pol` (createpolicy).
__device__ __forceinline__ uint4 load_hinted_raw(const void* p, uint64_t pol) {
  uint4 u;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
      : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
      : "l"(p), "l"(pol));
  return u;
}

// 16 bytes of float weights at p, as load<kVec> converts them (f32: two 16-byte loads).
template <typename TW>
__device__ __forceinline__ void load_hinted(const TW* p, uint64_t pol, float (&v)[kVec]) {
  uint4 u[sizeof(TW) == 4 ? 2 : 1];
#pragma unroll
  for (int h = 0; h < (sizeof(TW) == 4 ? 2 : 1); ++h)
    u[h] = load_hinted_raw(reinterpret_cast<const uint4*>(p) + h, pol);
  if constexpr (sizeof(TW) == 4) {
    const float* f = reinterpret_cast<const float*>(u);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = f[i];
  } else {
    const uint32_t w[4] = {u[0].x, u[0].y, u[0].z, u[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = unpack2<TW>(w[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

// Weights per 16-byte load: 8 of a 16-bit dtype (f32: two loads), 16 FP8 codes.
template <typename TW>
constexpr int kWeightsPerLoad = kIsFp8Weight<TW> ? 16 : kVec;

// Rows [row0, row0 + R) of expert e's weight block w ([n or 2n, k]) dotted with the activation
// row a ([k]); for kGateUp also the up rows n + row. kVecLoads: 16-byte loads of
// kWeightsPerLoad<TW> weights per lane (k a multiple of it, rows 16-byte aligned; FP8: block_in
// too, so a load is in one scale block), all of the warp's rows in flight at once; else one
// element per lane. FP8 codes: a load's 16 products are summed, then times the block's scale
// (one multiply per 16 weights, as the dense FP8 GEMV; the fp32 sums differ from the CPU twin's
// scaled-weight products by rounding only). Rows past n read row n - 1 (so the loads stay
// branch-free). On return every lane holds the sums.
template <typename TA, typename TW, bool kGateUp, bool kVecLoads>
__device__ __forceinline__ void gemv_rows(const TA* __restrict__ a, const TW* __restrict__ w,
                                          const MoeFp8Scales& fs, int64_t e, int64_t n, int64_t k,
                                          int64_t row0, int lane, float (&s0)[R], float (&s1)[R]) {
  const uint64_t pol = l2_evict_normal();  // the weight loads' (kVecLoads)
  const TW* wg[R];
  const TW* wu[R];
  const float* sg[R];  // FP8: the rows' scales
  const float* su[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = min(row0 + r, n - 1);
    const int64_t up_row = kGateUp ? n + row : row;
    wg[r] = w + row * k;
    wu[r] = w + up_row * k;
    if constexpr (kIsFp8Weight<TW>) {
      sg[r] = fs.row(e, row);
      su[r] = fs.row(e, up_row);
    } else {
      sg[r] = su[r] = nullptr;
    }
    s0[r] = s1[r] = 0.f;
  }
  if constexpr (kVecLoads && kIsFp8Weight<TW>) {
    constexpr int W = 16;
#pragma unroll 2
    for (int64_t i = int64_t(lane) * W; i < k; i += 32 * W) {
      uint4 c0[R], c1[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        c0[r] = load_hinted_raw(wg[r] + i, pol);
        if constexpr (kGateUp) c1[r] = load_hinted_raw(wu[r] + i, pol);
      }
      float x[2][kVec];
      load<kVec>(a + i, x[0]);
      load<kVec>(a + i + kVec, x[1]);
      const int col = static_cast<int>(i) / static_cast<int>(fs.block_in);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[W];
        fp8x16_to_f32(c0[r], wf);
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < W; ++j) part = fmaf(wf[j], x[j / kVec][j % kVec], part);
        s0[r] = fmaf(sg[r][col], part, s0[r]);
        if constexpr (kGateUp) {
          fp8x16_to_f32(c1[r], wf);
          part = 0.f;
#pragma unroll
          for (int j = 0; j < W; ++j) part = fmaf(wf[j], x[j / kVec][j % kVec], part);
          s1[r] = fmaf(su[r][col], part, s1[r]);
        }
      }
    }
  } else if constexpr (kVecLoads) {
#pragma unroll 2
    for (int64_t i = int64_t(lane) * kVec; i < k; i += 32 * kVec) {
      float x[kVec];
      load<kVec>(a + i, x);
      float w0[R][kVec], w1[R][kVec];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        load_hinted(wg[r] + i, pol, w0[r]);
        if constexpr (kGateUp) load_hinted(wu[r] + i, pol, w1[r]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          s0[r] = fmaf(w0[r][j], x[j], s0[r]);
          if constexpr (kGateUp) s1[r] = fmaf(w1[r][j], x[j], s1[r]);
        }
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) {
      const float x = to_f32(a[i]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s0[r] = fmaf(weight_f32(wg[r], i, sg[r], fs.block_in), x, s0[r]);
        if constexpr (kGateUp) s1[r] = fmaf(weight_f32(wu[r], i, su[r], fs.block_in), x, s1[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    for (int o = 16; o > 0; o /= 2) {
      s0[r] += __shfl_xor_sync(0xffffffffu, s0[r], o);
      if constexpr (kGateUp) s1[r] += __shfl_xor_sync(0xffffffffu, s1[r], o);
    }
}

struct GateUpParams {
  const void* x;        // [T, hidden]
  const void* gate_up;  // [E, 2 inter, hidden]
  const int32_t* ids;   // [T, k]
  float* act;           // [T * k, inter] f32
  int experts, top_k;
  int64_t inter, hidden;
  MoeFp8Scales fp8;  // gate_up's block scales (FP8 experts)
};

// grid (moe_decode_blocks(inter), T * k), 32 * kMoeDecodeWarps threads.
template <typename TA, typename TW, bool kVecLoads>
__global__ void __launch_bounds__(32 * kMoeDecodeWarps) gate_up_kernel(GateUpParams p) {
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t slot = blockIdx.y;
  const int64_t t = slot / p.top_k;
  const int e = p.ids[slot];
  const int64_t row0 = (int64_t(blockIdx.x) * kMoeDecodeWarps + threadIdx.x / 32) * R;
  if (row0 >= p.inter) return;
  float* out = p.act + slot * p.inter;
  if (e < 0 || e >= p.experts) {
    if (lane < R && row0 + lane < p.inter) out[row0 + lane] = 0.f;
    return;
  }
  const TW* w = static_cast<const TW*>(p.gate_up) + int64_t(e) * 2 * p.inter * p.hidden;
  const TA* a = static_cast<const TA*>(p.x) + t * p.hidden;
  float s0[R], s1[R];
  gemv_rows<TA, TW, true, kVecLoads>(a, w, p.fp8, e, p.inter, p.hidden, row0, lane, s0, s1);
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (lane == r && row0 + r < p.inter) out[row0 + r] = s0[r] / (1.0f + expf(-s0[r])) * s1[r];
}

struct DownParams {
  const float* act;      // [T * k, inter] f32
  const void* down;      // [E, hidden, inter]
  const int32_t* ids;    // [T, k]
  const float* weights;  // [T, k]
  const void* shared;    // [T, hidden] or nullptr
  DType shared_dtype;
  const void* shared_gate;  // [T, 1]
  DType gate_dtype;
  void* out;  // [T, hidden]
  int experts, top_k;
  int64_t hidden, inter;
  MoeFp8Scales fp8;  // down's block scales (FP8 experts)
};

// grid (moe_combine_blocks(hidden), T), 32 * moe_combine_warps(k) threads, k * R floats of
// dynamic shared memory: slot j's rows at [j * R, j * R + R).
template <typename TW, typename TO, bool kVecLoads>
__global__ void __launch_bounds__(32 * kMoeCombineWarps) down_combine_kernel(DownParams p) {
  extern __shared__ float s_rows[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t t = blockIdx.y;
  const int64_t row0 = int64_t(blockIdx.x) * R;
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  for (int j = warp; j < p.top_k; j += warps) {
    const int64_t slot = t * p.top_k + j;
    const int e = p.ids[slot];
    float s0[R], s1[R];
    if (e >= 0 && e < p.experts) {
      const TW* w = static_cast<const TW*>(p.down) + int64_t(e) * p.hidden * p.inter;
      gemv_rows<float, TW, false, kVecLoads>(p.act + slot * p.inter, w, p.fp8, e, p.hidden, p.inter,
                                             row0, lane, s0, s1);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) s0[r] = 0.f;
    }
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) s_rows[j * R + r] = s0[r];
  }
  __syncthreads();
  const int r = threadIdx.x;
  const int64_t c = row0 + r;
  if (r >= R || c >= p.hidden) return;
  float acc = 0.f;
  for (int j = 0; j < p.top_k; ++j) acc += p.weights[t * p.top_k + j] * s_rows[j * R + r];
  if (p.shared) {
    const float g = load_any(p.shared_gate, p.gate_dtype, t);
    acc += load_any(p.shared, p.shared_dtype, t * p.hidden + c) / (1.0f + expf(-g));
  }
  static_cast<TO*>(p.out)[t * p.hidden + c] = from_f32<TO>(acc);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void moe_decode_experts(const MoeArgs& a, const MoeShape& s, cudaStream_t stream) {
  LONGCTX_CHECK(s.top_k <= kMoeDecodeMaxTopK, ErrorCode::kUnsupported,
                "moe_experts_cuda: top-{} at decode (at most {})", s.top_k, kMoeDecodeMaxTopK);
  const Device d = a.x.device();
  const int64_t slots = s.tokens * s.top_k;
  Tensor act = Tensor::empty({slots, s.inter}, DType::kF32, d);  // [T * k, inter]
  // The 16-byte loads: rows of whole loads (FP8: 16 codes, each load within one scale block).
  const bool fp8 = a.gate_up_scales.defined();
  const int64_t per_load = fp8 ? 16 : kVec;
  const bool blocks_ok = !fp8 || a.block_in % 16 == 0;
  const bool vec1 = s.hidden % per_load == 0 && blocks_ok && aligned16(a.x.data_ptr()) &&
                    aligned16(a.gate_up.data_ptr());
  const bool vec2 =
      s.inter % per_load == 0 && blocks_ok && aligned16(a.down.data_ptr());  // act: a fresh buffer
  GateUpParams g{a.x.data_ptr(),
                 a.gate_up.data_ptr(),
                 a.topk_ids.data<int32_t>(),
                 act.data<float>(),
                 static_cast<int>(s.experts),
                 static_cast<int>(s.top_k),
                 s.inter,
                 s.hidden};
  DownParams dn{act.data<float>(),
                a.down.data_ptr(),
                a.topk_ids.data<int32_t>(),
                a.topk_weights.data<float>(),
                a.shared.defined() ? a.shared.data_ptr() : nullptr,
                a.shared.dtype(),
                a.shared_gate.defined() ? a.shared_gate.data_ptr() : nullptr,
                a.shared_gate.dtype(),
                a.out.data_ptr(),
                static_cast<int>(s.experts),
                static_cast<int>(s.top_k),
                s.hidden,
                s.inter};
  g.fp8 = moe_fp8_scales(a, s, true);
  dn.fp8 = moe_fp8_scales(a, s, false);
  const dim3 grid1(unsigned(moe_decode_blocks(s.inter)), unsigned(slots));
  const dim3 grid2(unsigned(moe_combine_blocks(s.hidden)), unsigned(s.tokens));
  const dim3 block2(unsigned(32 * moe_combine_warps(s.top_k)));
  const int smem2 = static_cast<int>(s.top_k * R * sizeof(float));
  visit_float(a.x.dtype(), "moe_experts", [&](auto ta) {
    visit_expert_weight(a.gate_up.dtype(), "moe_experts", [&](auto tw) {
      using TA = decltype(ta);
      using TW = decltype(tw);
      kernels::cuda::launch_pdl(vec1 ? gate_up_kernel<TA, TW, true> : gate_up_kernel<TA, TW, false>,
                                grid1, dim3(32 * kMoeDecodeWarps), 0, stream, g);
    });
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
  visit_expert_weight(a.down.dtype(), "moe_experts", [&](auto tw) {
    visit_float(a.out.dtype(), "moe_experts", [&](auto to) {
      using TW = decltype(tw);
      using TO = decltype(to);
      auto kernel = vec2 ? down_combine_kernel<TW, TO, true> : down_combine_kernel<TW, TO, false>;
      kernels::cuda::require_dynamic_smem(kernel, smem2);
      kernels::cuda::launch_pdl(kernel, grid2, block2, smem2, stream, dn);
    });
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace longctx::ops
