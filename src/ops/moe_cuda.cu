// CUDA twins of the MoE ops. Only the cuBLASLt prefill path reads expert counts on the host; it
// never runs under graph capture, so a decode step with routing inside stays capturable. Tile sizes
// and index maps: moe_schedule.h.
//
// moe_route: softmax in fp32 (expf), then the top k over the total order (probability
// descending, expert index ascending). Up to kMoeRouteSortMaxExperts experts, one CTA per token
// (moe_route_device.cuh): the softmax in every warp, then a bitonic sort of the experts'
// (probability, expert) keys in shared memory by all 128 threads, whose first k are the picks.
// Above, one warp per token runs k rounds of a warp argmax, each recomputing the probabilities
// from the logits and taking the first expert after the previous pick (so nothing is marked).
// Both give the same ids and weights to the bit. (A warp's k serial argmax rounds took 9.8 us at
// 128 experts and 30.1 us at 512, top-8 / top-10, even with the probabilities in registers, on an
// H100: single-warp serial code in the one routing launch of a decode step.)
//
// moe_experts, prefill (more than kMoeDecodeMaxTokens tokens):
//   align:   one block counts the slots (token, j) per expert, pads each expert's run to whole
//            row tiles, lists each tile's expert and each padded row's slot (-1: padding), and
//            each slot's row (inv);
//   gate_up: a grouped GEMM over the tiles: rows gathered from x by slot, the expert's gate and
//            up rows as two accumulators, silu(gate) * up written as the activation row;
//   down:    the same grouped GEMM over the activations into fp32 rows;
//   combine: out[t] = sum_j weight[t, j] * row(inv[t, j]) (+ sigmoid(shared_gate) * shared),
//            in a fixed j order, so the result does not depend on the atomics' order.
//   The GEMMs are launched over the most tiles the routing can need (moe_max_tiles); the tiles
//   past the count the align step wrote return at once.
//   Two GEMM kernels (moe_path): the tensor-core one (128 x 128 tiles, or 32 x 128 when the
//   routed experts average few rows (moe_tc_rows), mma.sync m16n8k16 with
//   fp32 accumulation, a 3-stage cp.async ring that gathers the rows; the activation rounded to
//   the 16-bit dtype between the GEMMs, as transformers keeps it) when x and the weights share a
//   16-bit dtype and hidden, inter are multiples of 8 with 16-byte aligned data; else the SIMT
//   one (64 x 64 tiles of fp32 FMAs, activation in fp32), which serves f32 and mixed-dtype
//   operands and rows that are not whole 16-byte chunks.
//   FP8 block experts (gate_up_scales / down_scales) take the tensor-core kernel with x's 16-bit
//   dtype: its W tiles are the codes (8 bytes a chunk instead of 16), converted with their
//   block's scale into the shared-memory stage (moe_fp8_device.cuh: fp8x8_to_elements, the
//   weights a dequantize to x's dtype at load gives); the SIMT kernel scales each weight in f32.
// moe_experts, prefill on cuBLASLt (MoePath::kCublasLt, from kMoeLtMinRowsPerExpert rows per
//   expert on average, eager only): moe_cublas_cuda.cu, then the same combine (FP8 experts:
//   each expert dequantized into a one-expert scratch before its GEMMs).
// moe_experts, decode (<= kMoeDecodeMaxTokens tokens): moe_decode_cuda.cu's two kernels, the
//   gate/up GEMVs and the down GEMVs with the combine fused.
// moe_forward_cuda is moe_route_cuda then moe_experts_cuda (moe_decode_cuda.cu says why the
//   decode kernels do not route themselves).
// The decode-step kernels (route, the GEMVs, combine) are launched with programmatic dependent
// launch (kernels/cuda/pdl.cuh): each waits for the kernel before it first thing.
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/mma_device.cuh"
#include "longctx/core/stream.h"
#include "ops/moe.h"
#include "ops/moe_cublas.h"
#include "ops/moe_decode.h"
#include "ops/moe_fp8_device.cuh"
#include "ops/moe_route_device.cuh"
#include "ops/moe_schedule.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;
using namespace kernels::cuda::detail;  // NOLINT: the PTX wrappers of mma_device.cuh

// ---- routing ----

constexpr int kRouteSortThreads = 128;

template <typename TL>
__global__ void route_kernel(const TL* __restrict__ logits, int64_t tokens, int experts, int k,
                             bool renormalize, int32_t* __restrict__ ids,
                             float* __restrict__ weights) {
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= tokens) return;
  const TL* l = logits + t * experts;
  const RouteSoftmax sm = warp_route_softmax<0>(experts, [&](int, int e) { return to_f32(l[e]); });
  Pick prev{INFINITY, -1};
  float picked = 0.f;
  for (int j = 0; j < k; ++j) {
    Pick best{-1.f, experts};  // after every real pick
    for (int e = lane; e < experts; e += 32) {
      const Pick c{sm.prob(to_f32(l[e])), e};
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

// The routing kernel of up to kMoeRouteSortMaxExperts experts: one CTA per token, which sorts its
// keys (cta_route_topk, moe_route_device.cuh; lane holds logits lane + 32 i, i < kPerLane =
// moe_route_sort_per_lane). The softmax sums in route_kernel's order and the keys' order is
// before()'s, so ids and weights are route_kernel's to the bit.
template <typename TL, int kPerLane>
__global__ void __launch_bounds__(kRouteSortThreads)
    route_sort_kernel(const TL* __restrict__ logits, int experts, int k, bool renormalize,
                      int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ uint64_t s_keys[32 * kPerLane];
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const TL* l = logits + t * experts;
  cta_route_topk<kPerLane>(
      experts, k, [&](int e) { return to_f32(l[e]); }, s_keys);
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    ids[t * k + j] = moe_route_key_expert(s_keys[j]);
    weights[t * k + j] = moe_route_weight(s_keys, k, j, renormalize);
  }
}

// ---- prefill: align, grouped GEMMs ----

struct AlignOut {
  int32_t* tile_expert;  // [max_tiles], or nullptr (not written)
  int32_t* num_tiles;    // [1]
  int32_t* sorted;       // [max_tiles * rows]: the slot of each padded row, -1 for padding
  int32_t* inv;          // [slots]: the padded row of each slot
  int32_t* counts;       // [experts] slots per expert, or nullptr (not written)
};

// One block; counts and cursors in shared memory ([2 experts] ints). Ids outside [0, E) (the CPU
// twin refuses them) are dropped: their slots get row -1 and add nothing. The order of the rows
// within an expert's run depends on the atomics, but each row is computed on its own and the
// combine reads them by slot, so the result does not.
__global__ void align_kernel(const int32_t* __restrict__ ids, int64_t slots, int experts, int rows,
                             int64_t max_tiles, AlignOut o) {
  extern __shared__ int32_t s_align[];
  int32_t* counts = s_align;
  int32_t* cursor = s_align + experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  for (int64_t i = threadIdx.x; i < max_tiles * rows; i += blockDim.x) o.sorted[i] = -1;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (o.counts)
    for (int e = threadIdx.x; e < experts; e += blockDim.x) o.counts[e] = counts[e];
  if (threadIdx.x == 0) {
    int32_t tile = 0;
    for (int e = 0; e < experts; ++e) {
      cursor[e] = tile * rows;
      tile += (counts[e] + rows - 1) / rows;
    }
    *o.num_tiles = tile;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts && o.tile_expert; e += blockDim.x) {
    const int32_t first = cursor[e] / rows, tiles = (counts[e] + rows - 1) / rows;
    for (int32_t i = 0; i < tiles; ++i) o.tile_expert[first + i] = e;
  }
  __syncthreads();  // the cursors are read above before the slots advance them below
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    int32_t row = -1;
    if (e >= 0 && e < experts) {
      row = atomicAdd(&cursor[e], 1);
      o.sorted[row] = static_cast<int32_t>(s);
    }
    o.inv[s] = row;
  }
}

struct GemmArgs {
  const void* a;               // gate_up: x [T, K]; down: act [rows, K]
  const void* w;               // [E, N_total, K]
  void* out;                   // gate_up: act [rows, N]; down: y [rows, N] f32
  const int32_t* sorted;       // padded row -> slot
  const int32_t* tile_expert;  // tile -> expert
  const int32_t* num_tiles;
  int top_k;
  int64_t n, k;      // output columns (inter for gate_up, hidden for down), reduction length
  MoeFp8Scales fp8;  // w's block scales (FP8 experts)
};

// SIMT path (f32 or mixed operands, rows not 16-byte chunks): a [kBM, kBN] tile of one expert's
// rows on fp32 FMAs. kGateUp: A rows are x[slot / top_k] and two accumulators take the gate rows
// [n0, n0 + kBN) and the up rows [n + n0, ...) of W, written as silu(gate) * up in f32; else A
// rows are the (f32) activation rows themselves.
template <typename TA, typename TW, bool kGateUp>
__global__ void __launch_bounds__(256) simt_grouped_gemm_kernel(GemmArgs g) {
  constexpr int kBM = kMoeSimtRows, kBN = kMoeSimtCols, kBK = 16;
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
        const int64_t n = n0 + r, kk = k0 + c, wr = half * g.n + n;
        float v = 0.f;
        if (n < g.n && kk < g.k)
          v = weight_f32(w + wr * g.k, kk, kIsFp8Weight<TW> ? g.fp8.row(e, wr) : nullptr,
                         g.fp8.block_in);
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
  float* out = static_cast<float*>(g.out);
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
      out[row * g.n + n] = v;
    }
  }
}

// Tensor-core path: a [BM, kMoeTcWRows] tile of one expert's rows, BM kMoeTcRows or
// kMoeTcSmallRows (moe_schedule.h has the layout and the choice). TW: T, or Fp8Weight for FP8
// experts, whose W tiles are not copied by cp.async but loaded into registers (8 codes per
// chunk) one stage ahead, while the stage before them is multiplied, then converted to T with
// their block's scale (fp8x8_to_elements) and stored to the stage: the MMAs see the weights a
// load-time dequantize to T gives, and the codes stream at half the bytes. 8 warps, 2 along the
// rows (BM / 2 each: BM / 32 m16 tiles) x 4 along the weight rows (32 each: 4 n8 tiles); A and W
// tiles of kMoeTcK columns come by cp.async into a kMoeTcStages-deep ring of swizzled shared-memory
// stages (the A rows gathered by slot in the copies, padding rows and columns past K zero-filled),
// fragments by ldmatrix, mma.sync m16n8k16 with fp32 accumulators. kGateUp: the warp's n-tiles 0-1
// hold gate columns and 2-3 the up columns of the same activation columns; the epilogue writes
// silu(gate) * up rounded to T (the down GEMM's A operand). Else the accumulators are written as
// f32 rows for the combine.
template <typename T, typename TW, bool kGateUp, int BM>
__global__ void __launch_bounds__(kMoeTcThreads, 2) tc_grouped_gemm_kernel(GemmArgs g) {
  constexpr bool kFp8 = kIsFp8Weight<TW>;
  static_assert(kFp8 || std::is_same_v<T, TW>);
  constexpr int WR = kMoeTcWRows, BK = kMoeTcK, kStages = kMoeTcStages;
  constexpr int kChunks = BK / 8;  // 16-byte chunks per tile row
  constexpr int kMi = BM / 32;     // m16 tiles per warp along the rows
  static_assert(kChunks == 8 && kMoeTcThreads == 256 && WR == 128);
  static_assert(BM % 32 == 0 && BM <= kMoeTcThreads);
  const int tile = blockIdx.y;
  if (tile >= *g.num_tiles) return;
  const int e = g.tile_expert[tile];
  const int64_t col_tile = blockIdx.x;
  const int64_t w_rows = kGateUp ? 2 * g.n : g.n;
  const TW* __restrict__ w = static_cast<const TW*>(g.w) + int64_t(e) * w_rows * g.k;
  const T* __restrict__ a = static_cast<const T*>(g.a);
  extern __shared__ __align__(128) uint8_t smem[];
  T* s_a = reinterpret_cast<T*>(smem);  // [kStages][BM][BK]
  T* s_w = s_a + kStages * BM * BK;     // [kStages][WR][BK]
  __shared__ int64_t a_row[BM];         // source row of A per tile row, -1: padding
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < BM) {
    const int32_t slot = g.sorted[int64_t(tile) * BM + tid];
    a_row[tid] = slot < 0 ? -1 : (kGateUp ? slot / g.top_k : int64_t(tile) * BM + tid);
  }
  __syncthreads();

  // Copies: thread tid takes chunk tid % 8 of rows tid / 8 + 32 i of both tiles (i < BM / 32 of A,
  // i < 4 of W): each row's 8 chunks are 128 contiguous bytes (coalesced) and land conflict-free
  // when swizzled.
  const int lc = tid % kChunks, lr = tid / kChunks;
  constexpr int kRowsPerPass = kMoeTcThreads / kChunks;  // 32
  const int num_k = static_cast<int>((g.k + BK - 1) / BK);
  auto load_stage = [&](int kt, int stage) {
    const int64_t kc = int64_t(kt) * BK + lc * 8;
    const bool k_ok = kc < g.k;  // K % 8 == 0: a chunk is all in or all out
    T* da = s_a + stage * BM * BK;
    T* dw = s_w + stage * WR * BK;
#pragma unroll
    for (int i = 0; i < BM / kRowsPerPass; ++i) {
      const int r = lr + i * kRowsPerPass;
      const int64_t ar = a_row[r];
      const bool ok = k_ok && ar >= 0;
      cp_async_16(smem_addr(da + swz<BK>(r, lc)), ok ? a + ar * g.k + kc : a, ok ? 16 : 0);
    }
    if constexpr (!kFp8) {
#pragma unroll
      for (int i = 0; i < WR / kRowsPerPass; ++i) {
        const int r = lr + i * kRowsPerPass;
        const int64_t wr = moe_tc_w_row(kGateUp, col_tile, r, g.n);
        const bool ok = k_ok && wr >= 0;
        cp_async_16(smem_addr(dw + swz<BK>(r, lc)), ok ? w + wr * g.k + kc : w, ok ? 16 : 0);
      }
    }
  };
  // FP8 W tiles: this thread's rows (as the copies above; -1 past the end) and the index of
  // each one's scale row, the codes of stage kt and their scales into registers, then converted
  // into a stage. (Pointers to the rows and their scales kept across the loop spilled the
  // 128-row kernel's registers; 32-bit indices do not.)
  constexpr int kWLoads = WR / kRowsPerPass;
  int w_tile_row[kWLoads], w_scale_row[kWLoads];
#pragma unroll
  for (int i = 0; i < kWLoads; ++i) {
    const int64_t wr = moe_tc_w_row(kGateUp, col_tile, lr + i * kRowsPerPass, g.n);
    w_tile_row[i] = static_cast<int>(wr);
    w_scale_row[i] = kFp8 && wr >= 0
                         ? static_cast<int>((g.fp8.row(e, wr) - g.fp8.scales) / g.fp8.block_cols)
                         : 0;
  }
  auto load_w_codes = [&](int kt, uint2(&codes)[kWLoads], float(&scale)[kWLoads]) {
    const int kc = kt * BK + lc * 8;
    const int col = kc / static_cast<int>(g.fp8.block_in);
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      const bool ok = kc < g.k && w_tile_row[i] >= 0;
      codes[i] = ok ? __ldg(reinterpret_cast<const uint2*>(w + w_tile_row[i] * g.k + kc))
                    : make_uint2(0, 0);
      scale[i] = ok ? g.fp8.scales[int64_t(w_scale_row[i]) * g.fp8.block_cols + col] : 0.f;
    }
  };
  auto store_w = [&](int stage, const uint2(&codes)[kWLoads], const float(&scale)[kWLoads]) {
    T* dw = s_w + stage * WR * BK;
#pragma unroll
    for (int i = 0; i < kWLoads; ++i)
      *reinterpret_cast<uint4*>(dw + swz<BK>(lr + i * kRowsPerPass, lc)) =
          fp8x8_to_elements<T>(codes[i], scale[i]);
  };

  const int wm = warp / 4, wn = warp % 4;
  float acc[kMi][4][4];
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
      acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.f;

  uint2 w_codes[kWLoads];
  float w_scale[kWLoads];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_k) {
      load_stage(s, s);
      if constexpr (kFp8) {
        load_w_codes(s, w_codes, w_scale);
        store_w(s, w_codes, w_scale);
      }
    }
    cp_async_commit();
  }
  for (int kt = 0; kt < num_k; ++kt) {
    cp_async_wait<kStages - 2>();  // stage kt has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's, and stage kt - 1 is no longer read
    const int nk = kt + kStages - 1;
    if (nk < num_k) {
      load_stage(nk, nk % kStages);
      if constexpr (kFp8) load_w_codes(nk, w_codes, w_scale);
    }
    cp_async_commit();
    const T* sa = s_a + (kt % kStages) * BM * BK;
    const T* sw = s_w + (kt % kStages) * WR * BK;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[kMi][4];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        const int r = wm * (BM / 2) + mi * 16 + (lane & 15);
        ldmatrix_x4(af[mi], smem_addr(sa + swz<BK>(r, kk * 2 + (lane >> 4))));
      }
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        uint32_t bf[4];
        const int r = moe_tc_warp_w_row(kGateUp, wn, 2 * nj) + ((lane >> 4) << 3) + (lane & 7);
        ldmatrix_x4(bf, smem_addr(sw + swz<BK>(r, kk * 2 + ((lane >> 3) & 1))));
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi) {
          Mma<T>::k16(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
          Mma<T>::k16(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
    // Stage nk's slot was last read in iteration kt - 1, and is read after the barriers of
    // iterations kt + 1 and nk.
    if constexpr (kFp8)
      if (nk < num_k) store_w(nk % kStages, w_codes, w_scale);
  }
  cp_async_wait<0>();

  // Epilogue: accumulator element (h, e) of a thread is row g + 8 h, column 2 t4 + e of its
  // m16n8 tile. n % 8 == 0 and columns come in even pairs, so a pair is all in or all out.
  const int gq = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * (BM / 2) + mi * 16 + gq + 8 * h;
      if (a_row[r] < 0) continue;
      const int64_t row = int64_t(tile) * BM + r;
      if constexpr (kGateUp) {
        T* out = static_cast<T*>(g.out);
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const int64_t col = moe_tc_out_col(true, col_tile, wn, ni, t4, 0);
          if (col >= g.n) continue;
          float v[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float gate = acc[mi][ni][2 * h + c], up = acc[mi][ni + 2][2 * h + c];
            v[c] = gate / (1.0f + expf(-gate)) * up;
          }
          *reinterpret_cast<uint32_t*>(out + row * g.n + col) = Mma<T>::pack(v[0], v[1]);
        }
      } else {
        float* out = static_cast<float*>(g.out);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int64_t col = moe_tc_out_col(false, col_tile, wn, ni, t4, 0);
          if (col >= g.n) continue;
          *reinterpret_cast<float2*>(out + row * g.n + col) =
              make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        }
      }
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the 16-bit paths (tensor cores, cuBLASLt) take the operands: x bf16 or f16, and the
// experts of x's dtype, or FP8 experts whose scale blocks hold whole 8-weight chunks (the
// tensor-core kernel converts a chunk with one scale).
bool moe_tc_operands(const MoeArgs& a) {
  const DType xt = a.x.dtype(), wt = a.gate_up.dtype();
  if (xt != DType::kBF16 && xt != DType::kF16) return false;
  return wt == DType::kFP8E4M3 ? a.block_in % 8 == 0 : wt == xt;
}

// ---- combine ----

template <typename TY, typename TO>
__global__ void combine_kernel(const TY* __restrict__ y, const int32_t* __restrict__ inv,
                               const float* __restrict__ weights, int64_t tokens, int top_k,
                               int64_t hidden, const void* shared, DType shared_dtype,
                               const void* shared_gate, DType gate_dtype, TO* __restrict__ out) {
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden, c = i % hidden;
  float acc = 0.f;
  for (int j = 0; j < top_k; ++j) {
    const int64_t s = t * top_k + j;
    const int64_t row = inv ? inv[s] : s;
    if (row >= 0) acc += weights[s] * to_f32(y[row * hidden + c]);
  }
  if (shared) {
    const float g = load_any(shared_gate, gate_dtype, t);
    acc += load_any(shared, shared_dtype, i) / (1.0f + expf(-g));
  }
  out[i] = from_f32<TO>(acc);
}

// f(TA{}, TW{}): a float dtype's type, and w's (visit_expert_weight: FP8 experts too).
template <typename F>
void visit_act_weight(DType a, DType w, F&& f) {
  visit_float(a, "moe_experts",
              [&](auto ta) { visit_expert_weight(w, "moe_experts", [&](auto tw) { f(ta, tw); }); });
}

// The align step: each expert's slots listed in o.sorted, its run padded to whole tiles of `rows`.
void launch_align(const MoeArgs& a, const MoeShape& s, int rows, int64_t max_tiles,
                  const AlignOut& o, cudaStream_t stream) {
  // The align step keeps two ints per expert in shared memory.
  LONGCTX_CHECK(s.experts <= 8192, ErrorCode::kUnsupported,
                "moe_experts_cuda: {} experts (at most 8192)", s.experts);
  const int align_smem = static_cast<int>(2 * s.experts * sizeof(int32_t));
  kernels::cuda::require_dynamic_smem(align_kernel, align_smem);
  align_kernel<<<1, 1024, align_smem, stream>>>(a.topk_ids.data<int32_t>(), s.tokens * s.top_k,
                                                static_cast<int>(s.experts), rows, max_tiles, o);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

// The path a call takes: the backend's choice (moe_schedule.h), or a clear error where a forced
// cuBLASLt path cannot run.
MoePath choose_path(const MoeArgs& a, const MoeShape& s, MoeBackend backend, cudaStream_t stream) {
  const bool tc_operands = moe_tc_operands(a);
  const bool aligned =
      aligned16(a.x.data_ptr()) && aligned16(a.gate_up.data_ptr()) && aligned16(a.down.data_ptr());
  if (backend == MoeBackend::kKernels)
    return moe_path(s.tokens, s.hidden, s.inter, tc_operands, aligned);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LONGCTX_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  if (backend == MoeBackend::kAuto)
    return moe_auto_path(s.tokens, s.top_k, s.experts, s.hidden, s.inter, tc_operands, aligned,
                         capturing);
  const char* refusal = moe_lt_refusal(s.hidden, s.inter, tc_operands, aligned, capturing);
  LONGCTX_CHECK(refusal[0] == '\0', ErrorCode::kUnsupported,
                "moe_experts_cuda: the cuBLASLt path cannot run x {} with gate_up {}: {}",
                a.x.str(), a.gate_up.str(), refusal);
  return MoePath::kCublasLt;
}

}  // namespace

void moe_align_rows(const MoeArgs& a, const MoeShape& s, const MoeAlignRows& rows,
                    cudaStream_t stream) {
  AlignOut o;
  o.counts = rows.counts;
  o.tile_expert = nullptr;  // one entry per row, from one thread per expert: not needed
  o.num_tiles = rows.num_tiles;
  o.sorted = rows.sorted;
  o.inv = rows.inv;
  launch_align(a, s, 1, moe_max_tiles(s.tokens * s.top_k, s.experts, 1), o, stream);
}

void moe_route_cuda(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
                    const Tensor& topk_weights, MoeRouteKernel kernel_choice) {
  check_moe_route_args(logits, topk_ids, topk_weights);
  const Device d = logits.device();
  DeviceGuard guard(d.index);
  cudaStream_t stream = op_stream(d, "moe_route");
  const int64_t t = logits.size(0);
  const int e = static_cast<int>(logits.size(1)), k = static_cast<int>(topk_ids.size(1));
  if (t == 0) return;
  LONGCTX_CHECK(kernel_choice != MoeRouteKernel::kSort || moe_route_sort_per_lane(e) > 0,
                ErrorCode::kUnsupported,
                "moe_route_cuda: {} experts sorted by one CTA (at most {})", e,
                kMoeRouteSortMaxExperts);
  const int per_lane = kernel_choice == MoeRouteKernel::kPerPick ? 0 : moe_route_sort_per_lane(e);
  visit_float(logits.dtype(), "moe_route", [&](auto tl) {
    using TL = decltype(tl);
    const TL* l = static_cast<const TL*>(logits.data_ptr());
    if (per_lane == 0) {
      constexpr int kWarps = 4;
      kernels::cuda::launch_pdl(route_kernel<TL>, dim3(unsigned((t + kWarps - 1) / kWarps)),
                                dim3(32 * kWarps), 0, stream, l, t, e, k, renormalize,
                                topk_ids.data<int32_t>(), topk_weights.data<float>());
      return;
    }
    auto kernel = per_lane == 4    ? route_sort_kernel<TL, 4>
                  : per_lane == 8  ? route_sort_kernel<TL, 8>
                  : per_lane == 16 ? route_sort_kernel<TL, 16>
                                   : route_sort_kernel<TL, 32>;
    kernels::cuda::launch_pdl(kernel, dim3(unsigned(t)), dim3(kRouteSortThreads), 0, stream, l, e,
                              k, renormalize, topk_ids.data<int32_t>(), topk_weights.data<float>());
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void moe_experts_cuda(const MoeArgs& a, MoeBackend backend, MoeTcTile tile) {
  const MoeShape s = check_moe_args(a);
  const Device d = a.x.device();
  DeviceGuard guard(d.index);
  cudaStream_t stream = op_stream(d, "moe_experts");
  LONGCTX_CHECK(a.gate_up.dtype() == a.down.dtype(), ErrorCode::kUnsupported,
                "moe_experts_cuda: gate_up ({}) and down ({}) must share a dtype",
                dtype_name(a.gate_up.dtype()), dtype_name(a.down.dtype()));
  if (s.tokens == 0) return;
  const int64_t slots = s.tokens * s.top_k;
  const int k = static_cast<int>(s.top_k);
  const DType wt = a.gate_up.dtype();
  const DType ct = a.x.dtype();  // the 16-bit paths' dtype (x's: the experts' or FP8's compute)
  const MoePath path = choose_path(a, s, backend, stream);
  const int32_t* inv = nullptr;
  Tensor y;              // [rows, hidden] f32 (cuBLASLt: 16-bit): each slot's expert output
  Tensor align_buffers;  // holds inv until the combine is enqueued
  if (path == MoePath::kDecode) {
    moe_decode_experts(a, s, stream);  // the combine is fused into down
    return;
  }
  if (path == MoePath::kCublasLt) {
    y = moe_cublas_experts(a, s, stream, align_buffers, &inv);
  } else {
    const int rows = path != MoePath::kTensorCore ? moe_tile_rows(path)
                     : tile == MoeTcTile::kLarge  ? kMoeTcRows
                     : tile == MoeTcTile::kSmall  ? kMoeTcSmallRows
                                                  : moe_tc_rows(s.tokens, s.top_k, s.experts);
    const int64_t max_tiles = moe_max_tiles(slots, s.experts, rows);
    LONGCTX_CHECK(max_tiles <= 65535, ErrorCode::kInvalidArgument,
                  "moe_experts: {} tokens x top-{} need up to {} row tiles (at most 65535)",
                  s.tokens, s.top_k, max_tiles);
    Tensor ints = Tensor::empty({max_tiles + 1 + max_tiles * rows + slots}, DType::kI32, d);
    AlignOut o;
    o.tile_expert = ints.data<int32_t>();
    o.num_tiles = o.tile_expert + max_tiles;
    o.sorted = o.num_tiles + 1;
    o.inv = o.sorted + max_tiles * rows;
    o.counts = nullptr;
    launch_align(a, s, rows, max_tiles, o, stream);
    const DType act_dtype = path == MoePath::kTensorCore ? ct : DType::kF32;
    Tensor act = Tensor::empty({max_tiles * rows, s.inter}, act_dtype, d);
    y = Tensor::empty({max_tiles * rows, s.hidden}, DType::kF32, d);
    GemmArgs g1{a.x.data_ptr(),
                a.gate_up.data_ptr(),
                act.data_ptr(),
                o.sorted,
                o.tile_expert,
                o.num_tiles,
                k,
                s.inter,
                s.hidden,
                moe_fp8_scales(a, s, true)};
    GemmArgs g2{act.data_ptr(),
                a.down.data_ptr(),
                y.data_ptr(),
                o.sorted,
                o.tile_expert,
                o.num_tiles,
                k,
                s.hidden,
                s.inter,
                moe_fp8_scales(a, s, false)};
    const dim3 grid1(unsigned(moe_gate_up_col_tiles(path, s.inter)), unsigned(max_tiles));
    const dim3 grid2(unsigned(moe_down_col_tiles(path, s.hidden)), unsigned(max_tiles));
    if (path == MoePath::kTensorCore) {
      auto launch = [&](auto tag, auto bm) {
        using T = decltype(tag);
        constexpr int BM = decltype(bm)::value;
        constexpr int smem = moe_tc_smem_bytes(BM);
        auto launch_w = [&](auto wtag) {
          using TW = decltype(wtag);
          kernels::cuda::require_dynamic_smem(tc_grouped_gemm_kernel<T, TW, true, BM>, smem);
          kernels::cuda::require_dynamic_smem(tc_grouped_gemm_kernel<T, TW, false, BM>, smem);
          tc_grouped_gemm_kernel<T, TW, true, BM><<<grid1, kMoeTcThreads, smem, stream>>>(g1);
          tc_grouped_gemm_kernel<T, TW, false, BM><<<grid2, kMoeTcThreads, smem, stream>>>(g2);
        };
        if (wt == DType::kFP8E4M3)
          launch_w(Fp8Weight{});
        else
          launch_w(T{});
      };
      auto launch_rows = [&](auto tag) {
        if (rows == kMoeTcSmallRows)
          launch(tag, std::integral_constant<int, kMoeTcSmallRows>{});
        else
          launch(tag, std::integral_constant<int, kMoeTcRows>{});
      };
      if (ct == DType::kBF16)
        launch_rows(__nv_bfloat16{});
      else
        launch_rows(__half{});
    } else {
      visit_act_weight(ct, wt, [&](auto ta, auto tw) {
        using TA = decltype(ta);
        using TW = decltype(tw);
        simt_grouped_gemm_kernel<TA, TW, true><<<grid1, 256, 0, stream>>>(g1);
        simt_grouped_gemm_kernel<float, TW, false><<<grid2, 256, 0, stream>>>(g2);
      });
    }
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    inv = o.inv;
    align_buffers = ints;
  }
  const int64_t n = s.tokens * s.hidden;
  visit_float(y.dtype(), "moe_experts", [&](auto ty) {
    visit_float(a.out.dtype(), "moe_experts", [&](auto to) {
      using TY = decltype(ty);
      using TO = decltype(to);
      kernels::cuda::launch_pdl(combine_kernel<TY, TO>, dim3(unsigned((n + 255) / 256)), dim3(256),
                                0, stream, static_cast<const TY*>(y.data_ptr()), inv,
                                static_cast<const float*>(a.topk_weights.data<float>()), s.tokens,
                                k, s.hidden, a.shared.defined() ? a.shared.data_ptr() : nullptr,
                                a.shared.dtype(),
                                a.shared_gate.defined() ? a.shared_gate.data_ptr() : nullptr,
                                a.shared_gate.dtype(), static_cast<TO*>(a.out.data_ptr()));
    });
  });
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

void moe_forward_cuda(const Tensor& logits, bool renormalize, const MoeArgs& a) {
  check_moe_route_args(logits, a.topk_ids, a.topk_weights);
  const MoeShape s = check_moe_args(a);
  LONGCTX_CHECK(logits.size(0) == s.tokens && logits.size(1) == s.experts,
                ErrorCode::kInvalidArgument, "moe_forward: logits {} must be [{}, {} experts]",
                logits.str(), s.tokens, s.experts);
  moe_route_cuda(logits, renormalize, a.topk_ids, a.topk_weights);
  moe_experts_cuda(a);
}

}  // namespace longctx::ops
