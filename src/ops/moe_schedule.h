// The tiling of moe_cuda.cu's kernels, written once for the host launch code, the kernels and the
// CPU tests (tests/ops/test_moe_schedule.cpp): which path a call takes, how many row tiles the
// grouped GEMMs are launched over, which weight rows a tensor-core tile reads, and how the decode
// GEMV spreads its rows over warps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace longctx::ops {

// How moe_experts_cuda computes the routed experts.
enum class MoePath {
  kDecode,      // <= kMoeDecodeMaxTokens tokens: GEMVs over the routed experts' rows
  kTensorCore,  // grouped GEMMs on mma.sync (16-bit x and weights of one dtype, K % 8 == 0)
  kSimt,        // grouped GEMMs on fp32 FMAs: f32 operands, mixed dtypes, unaligned rows
  kCublasLt,    // x gathered per expert, one cuBLASLt GEMM per expert (counts read on the host)
};

constexpr int64_t kMoeDecodeMaxTokens = 4;
// moe_route's kernel sorts a token's keys in one CTA, lane l holding logits l + 32 i for
// i < moe_route_sort_per_lane(E) (a power of two from 4, so four instantiations), up to this
// many experts; above, one warp per token recomputes the probabilities on every pick.
constexpr int64_t kMoeRouteSortMaxExperts = 1024;
inline int moe_route_sort_per_lane(int64_t experts) {
  if (experts > kMoeRouteSortMaxExperts) return 0;
  int per_lane = 4;
  while (32 * per_lane < experts) per_lane *= 2;
  return per_lane;
}
// The decode down kernel with the combine fused keeps each slot's partial rows in shared memory
// (top-k x kMoeDecodeRowsPerWarp floats), so it serves at most this top-k.
constexpr int64_t kMoeDecodeMaxTopK = 1024;

// Tensor-core grouped GEMM tile: kMoeTcRows gathered rows x kMoeTcWRows weight rows, kMoeTcK
// elements of the reduction per pipeline stage. gate/up: the weight tile is kMoeTcWRows / 2 gate
// rows then the matching up rows, so a CTA writes kMoeTcWRows / 2 activation columns; down: the
// tile's rows are kMoeTcWRows output columns.
constexpr int kMoeTcRows = 128;
// The small row tile, for steps whose routed experts average few rows (moe_tc_rows): the warps
// keep their 2 x 4 layout with one m16 tile each along the rows instead of four.
constexpr int kMoeTcSmallRows = 32;
constexpr int kMoeTcWRows = 128;
constexpr int kMoeTcK = 64;
constexpr int kMoeTcStages = 3;
constexpr int kMoeTcThreads = 256;  // 8 warps: 2 along the rows x 4 along the weight rows
// SIMT grouped GEMM tile (rows x columns).
constexpr int kMoeSimtRows = 64;
constexpr int kMoeSimtCols = 64;

// Bytes of dynamic shared memory of the tensor-core kernel with `rows`-row tiles (16-bit A and W
// stages).
constexpr int moe_tc_smem_bytes(int rows) {
  return kMoeTcStages * (rows + kMoeTcWRows) * kMoeTcK * 2;
}
constexpr int kMoeTcSmemBytes = moe_tc_smem_bytes(kMoeTcRows);

// The tensor-core path's row tile for `tokens` x top-k slots over `experts` experts: the small
// tile when the experts the slots route to average at most kMoeTcSmallRows / 2 rows under uniform
// routing (E (1 - (1 - k / E)^T) experts), so that nearly all take one small tile and read their
// weights once, as with the large tile, with a quarter of its MMA work on padding rows; else the
// large tile, which reads each weight tile once per 128 rows instead of per 32 (an expert's count
// about its mean of 16 rarely passes 32; about 32 it would often take two small tiles). Batch
// decode is the small case: Qwen3-Next-80B-A3B (512 experts, top-10) at 32 tokens routes to ~240
// experts of ~1.3 rows each, where the 128-row tiles spent ~100x more MMAs than rows.
inline int moe_tc_rows(int64_t tokens, int64_t top_k, int64_t experts) {
  const int64_t slots = tokens * top_k;
  if (slots <= 0 || experts <= 0) return kMoeTcSmallRows;
  const double miss = 1.0 - double(std::min(top_k, experts)) / double(experts);
  const double routed = double(experts) * (1.0 - std::pow(miss, double(tokens)));
  return 2.0 * double(slots) <= double(kMoeTcSmallRows) * routed ? kMoeTcSmallRows : kMoeTcRows;
}

// tc_operands: x, gate_up and down share a 16-bit dtype; aligned: their data pointers are
// 16-byte aligned.
inline MoePath moe_path(int64_t tokens, int64_t hidden, int64_t inter, bool tc_operands,
                        bool aligned) {
  if (tokens <= kMoeDecodeMaxTokens) return MoePath::kDecode;
  if (tc_operands && aligned && hidden % 8 == 0 && inter % 8 == 0) return MoePath::kTensorCore;
  return MoePath::kSimt;
}

// Why the cuBLASLt path cannot run ("" when it can): it needs the tensor-core path's operands
// (its GEMMs and the activation between them are 16-bit, rows whole 16-byte chunks), and it reads
// the expert counts on the host (a copy and a stream sync), which a CUDA graph capture forbids.
inline const char* moe_lt_refusal(int64_t hidden, int64_t inter, bool tc_operands, bool aligned,
                                  bool capturing) {
  if (!tc_operands) return "x, gate_up and down must share a 16-bit dtype";
  if (!aligned || hidden % 8 != 0 || inter % 8 != 0)
    return "rows must be whole 16-byte chunks (hidden and inter multiples of 8, aligned data)";
  if (capturing) return "the stream is capturing a CUDA graph (the path syncs on expert counts)";
  return "";
}

// The automatic path: cuBLASLt once the experts see enough rows on average that its per-expert
// GEMMs outrun the grouped tensor-core kernel (tokens x top_k >= kMoeLtMinRowsPerExpert x
// experts), where it can run; else moe_path's kernels. Measured on an H100, one Qwen3-30B-A3B
// layer (128 experts, top-8): cuBLASLt 3.04 ms against the kernels' 2.58 at 512 rows per expert
// (8K tokens), 4.32 against 4.87 at 1024 (16K), 6.97 against 9.59 at 2048 (32K).
constexpr int64_t kMoeLtMinRowsPerExpert = 1024;
inline MoePath moe_auto_path(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden,
                             int64_t inter, bool tc_operands, bool aligned, bool capturing) {
  const MoePath kernels = moe_path(tokens, hidden, inter, tc_operands, aligned);
  if (kernels == MoePath::kDecode) return kernels;
  const bool enough_rows = tokens * top_k >= kMoeLtMinRowsPerExpert * experts;
  if (enough_rows && moe_lt_refusal(hidden, inter, tc_operands, aligned, capturing)[0] == '\0')
    return MoePath::kCublasLt;
  return kernels;
}

// Rows the cuBLASLt path gives an expert with `count` gathered rows (0 for none): count rounded
// up to a multiple of max(16, 2^floor(log2 count) / 16), the extra rows zero. So at most 15 rows
// or 1/16 of the count are wasted, and whatever the routing, the per-expert GEMMs come in at most
// 16 row counts per power of two, which bounds the shapes linear_cuda's plan cache sees.
inline int64_t moe_lt_rows(int64_t count) {
  if (count <= 0) return 0;
  int64_t step = 16;
  while (step * 32 <= count) step *= 2;  // step = max(16, 2^floor(log2 count) / 16)
  return (count + step - 1) / step * step;
}

// Elements of the cuBLASLt path's scratch for FP8 experts (moe_cublas_cuda.cu): one expert's
// largest matrix dequantized, gate_up's [2 inter, hidden], in x's 16-bit dtype.
inline int64_t moe_fp8_scratch_elems(int64_t hidden, int64_t inter) { return 2 * inter * hidden; }

// Rows per row tile of a grouped-GEMM path (the tensor-core path's large tile; moe_tc_rows picks).
constexpr int moe_tile_rows(MoePath p) {
  return p == MoePath::kTensorCore ? kMoeTcRows : kMoeSimtRows;
}

// The most row tiles the align step can write for `slots` (token, expert) pairs over `experts`
// experts, tiles of `rows`: each expert's run is padded to whole tiles, which adds at most one
// partial tile per non-empty expert, and at most min(experts, slots) experts are non-empty.
inline int64_t moe_max_tiles(int64_t slots, int64_t experts, int rows) {
  return slots / rows + std::min(experts, slots);
}

// Column tiles of the gate/up GEMM (activation columns) and of the down GEMM (hidden columns).
inline int64_t moe_gate_up_col_tiles(MoePath p, int64_t inter) {
  const int64_t cols = p == MoePath::kTensorCore ? kMoeTcWRows / 2 : kMoeSimtCols;
  return (inter + cols - 1) / cols;
}
inline int64_t moe_down_col_tiles(MoePath p, int64_t hidden) {
  const int64_t cols = p == MoePath::kTensorCore ? kMoeTcWRows : kMoeSimtCols;
  return (hidden + cols - 1) / cols;
}

// The expert weight row that row r (0 <= r < kMoeTcWRows) of column tile `col_tile`'s weight
// tile holds, -1 past the end (zero-filled). gate/up (n = inter): rows [0, half) are gate rows
// col_tile * half + r, rows [half, 2 half) the up rows of the same columns (inter + ...). down
// (n = hidden): row col_tile * kMoeTcWRows + r.
LONGCTX_HD_INLINE int64_t moe_tc_w_row(bool gate_up, int64_t col_tile, int r, int64_t n) {
  if (gate_up) {
    constexpr int kHalf = kMoeTcWRows / 2;
    const int64_t col = col_tile * kHalf + r % kHalf;
    if (col >= n) return -1;
    return r < kHalf ? col : n + col;
  }
  const int64_t col = col_tile * kMoeTcWRows + r;
  return col < n ? col : -1;
}

// Output column of a tensor-core tile's accumulator: warp column wn (0-3), n-tile ni (0-3) of 8
// columns, the thread's pair c2 (0-3) and element e (0-1). gate/up: n-tiles 0-1 are gate columns
// and 2-3 the up columns of the same activation columns, so the warp's accumulators ni and ni + 2
// pair up in the epilogue; the weight tile row of n-tile ni is moe_tc_warp_w_row.
LONGCTX_HD_INLINE int moe_tc_warp_w_row(bool gate_up, int wn, int ni) {
  constexpr int kHalf = kMoeTcWRows / 2;
  return gate_up ? (ni / 2) * kHalf + wn * 16 + (ni % 2) * 8 : wn * 32 + ni * 8;
}
LONGCTX_HD_INLINE int64_t moe_tc_out_col(bool gate_up, int64_t col_tile, int wn, int ni, int c2,
                                         int e) {
  const int cols = gate_up ? kMoeTcWRows / 2 : kMoeTcWRows;
  return col_tile * cols + (moe_tc_warp_w_row(gate_up, wn, ni) % cols) + c2 * 2 + e;
}

// Decode GEMV: each warp computes kMoeDecodeRowsPerWarp output rows of one slot (for gate/up a
// row is a gate row and its up row), with 128-thread blocks, so one block covers 16 rows. Small
// blocks spread a batch-1 step evenly: 30B-A3B's 8 slots give 384 gate/up and 1024 down blocks
// for 132 SMs (with 256-thread blocks, 192 gate/up blocks would leave 60 SMs streaming two and
// the rest one).
constexpr int kMoeDecodeRowsPerWarp = 4;
constexpr int kMoeDecodeWarps = 4;
constexpr int kMoeDecodeRowsPerBlock = kMoeDecodeRowsPerWarp * kMoeDecodeWarps;
inline int64_t moe_decode_blocks(int64_t n) {
  return (n + kMoeDecodeRowsPerBlock - 1) / kMoeDecodeRowsPerBlock;
}

// Decode down + combine: a CTA computes kMoeDecodeRowsPerWarp output rows of one token, one warp
// per slot of the token (up to kMoeCombineWarps warps, each taking every kMoeCombineWarps-th
// slot), and sums the slots' weighted rows in slot order. 30B-A3B at batch 1: 512 CTAs of 8 warps;
// Qwen3-Next-80B-A3B (top-10): 10 warps, where 8 would leave two warps streaming two slots each
// (the CTA's time is its slowest warp's).
constexpr int kMoeCombineWarps = 16;
inline int moe_combine_warps(int64_t top_k) {
  return static_cast<int>(std::min<int64_t>(top_k, kMoeCombineWarps));
}
inline int64_t moe_combine_blocks(int64_t hidden) {
  return (hidden + kMoeDecodeRowsPerWarp - 1) / kMoeDecodeRowsPerWarp;
}

}  // namespace longctx::ops
