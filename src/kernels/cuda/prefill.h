// CUDA batch prefill over a paged KV cache, dense or block-sparse (see PagedPrefillParams in
// kernels/attention_params.h). Two kernels behind one interface: on sm_90 (head_dim 64 / 128 /
// 256) a Hopper kernel (prefill_sm90.cu: wgmma, warp-specialized cp.async page gathers, TMA boxes
// where pages hold 64-token runs or kv_contiguous promises consecutive pages), elsewhere
// FlashAttention-2 style mma.sync m16n8k16 with cp.async double-buffered K/V tiles (prefill.cu).
// FP8 K/V (kv_format kFp8E4M3, head_dim 64 / 128) take the same kernel as 16-bit K/V, each with a
// converting loader.
// PrefillTuning::kernel (longctx/kernels/kernel_tuning.h) picks one (sm90 only where available).
//
// Usage: plan once per batch shape (host; may synchronize), then run once per layer (no host
// sync, no allocation, no host reads: safe inside a CUDA graph as long as the plan and the
// workspace outlive it):
//
//   size_t ws = paged_prefill_workspace_bytes(batch, total_q, num_qo_heads / num_kv_heads);
//   PrefillPlan plan = paged_prefill_plan(qo_indptr_host, kv_len_host, batch, num_qo_heads,
//                                         num_kv_heads, head_dim, mask_mode, d_ws, ws, stream,
//                                         tuning);
//   for (layer ...) paged_prefill_run(params, plan, stream);
//
// GQA: the q heads of one kv group are packed into the query tile (tile row r of request b is
// token r / group, q head kv_head * group + r % group), so K/V tiles are loaded once per group
// and short query segments (q_len 1..16) still fill a tile.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_params.h"
#include "longctx/kernels/kernel_tuning.h"

namespace longctx::kernels::cuda {

// Rows (packed (token, q head) pairs) per work item: 128, or 192 where the Hopper kernel runs
// head_dim 64 (paged_prefill_tile_rows); keys per K/V tile of the mma.sync kernel.
inline constexpr int kPrefillTileRows = 128;
inline constexpr int kPrefillMaxTileRows = 192;
inline constexpr int kPrefillTileKeys = 64;

// What run() needs from plan(). Plain values + a device pointer into the caller's workspace.
// The work list format is part of the interface: item i = (request b, row tile t) covers packed
// rows [t * tile_rows, (t + 1) * tile_rows) of request b; callers may build their own list (the
// block-causal wrapper does, with paged_prefill_tile_rows()), and an item of a request with
// q_len 0 is a no-op (used to pad a CUDA graph's fixed grid).
struct PrefillPlan {
  int num_work_items = 0;               // the launch has num_work_items x num_kv_heads CTAs
  const int32_t* work_items = nullptr;  // device, [num_work_items, 2]: (request, row tile)
  int tile_rows = kPrefillTileRows;     // rows per work item; run() takes a kernel of this tile
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  MaskMode mask_mode = MaskMode::kNone;
  // The Hopper kernel's unit order (prefill_unit in kernels/prefill_schedule.h): kv heads per
  // block, a divisor of num_kv_heads; 0: num_kv_heads (every head of an item side by side).
  int unit_heads = 0;
  // Stream-K split for the Hopper kernel (kernels/prefill_schedule.h), set by plan() when the
  // workspace holds it and the model says whole units would leave SMs idle; the work list above
  // stays complete, so a kernel that ignores the split (prefill.cu) is still right.
  int split_ctas = 0;                     // 0: no split; else the persistent CTAs it was made for
  int split_dp_rounds = 0;                // whole snake rounds before the ranges (PrefillSplit)
  const int32_t* split_ranges = nullptr;  // device [split_ctas, 6] (PrefillCtaRange)
  int num_merge_groups = 0;
  const int32_t* merge_groups = nullptr;  // device [num_merge_groups, 3] (PrefillMergeGroup)
  float* partial_o = nullptr;             // device [slots, tile_rows, head_dim]
  float* partial_lse = nullptr;           // device [slots, tile_rows]
  // The choices plan() made the plan under; run() takes its kernel, variant, TMA and tiling from
  // here (a caller building its own plan keeps the defaults, as paged_prefill_tile_rows()'s).
  PrefillTuning tuning;
};

// Upper bound of the workspace plan() writes, for any batch with these totals.
size_t paged_prefill_workspace_bytes(int batch_size, int64_t total_q, int group_size);

// Extra workspace that lets plan() split units over the current device's SMs (stream-K; num_sms
// = 0: the current device's count). Add it to paged_prefill_workspace_bytes() to opt in: about
// 17 MB at head_dim 128 on 132 SMs (partial states of 2 pieces per SM).
size_t paged_prefill_split_workspace_bytes(int head_dim, int num_sms = 0);

// Builds the per-CTA work list (request, row tile), heaviest tiles first (by key tiles visited),
// and copies it into the caller-owned device workspace on `stream` (the copy is enqueued; the
// host vector is staged before return). Where the workspace has room for it
// (paged_prefill_split_workspace_bytes) and the Hopper kernel will run, also the stream-K split
// (tuning.split: kNever turns it off, kAlways takes it wherever it exists). Host inputs:
//   qo_indptr_host [batch_size + 1], kv_len_host [batch_size] (each kv_len <= 4M keys).
// Throws Error(kInvalidArgument) on inconsistent shapes, Error(kUnsupported) for head_dim other
// than 64/128/256 or a non-integral GQA ratio.
PrefillPlan paged_prefill_plan(const int32_t* qo_indptr_host, const int32_t* kv_len_host,
                               int batch_size, int num_qo_heads, int num_kv_heads, int head_dim,
                               MaskMode mask_mode, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream, const PrefillTuning& tuning = {});

// True when the kernel handles these params (head_dim 64/128/256, bf16/f16, integral GQA ratio,
// page_size 1..256, sm_scale > 0). run() throws Error(kUnsupported) otherwise.
bool paged_prefill_supported(const PagedPrefillParams& params);

// Whether run() takes the Hopper kernel at this head_dim here (sm_90 device, a binary carrying
// it, tuning.kernel); only then does plan() split.
bool paged_prefill_sm90_path(int head_dim, const PrefillTuning& tuning = {});

// Rows per work item that plan() uses here at this head_dim: 192 where the Hopper kernel runs
// head_dim 64 (three consumer warpgroups), else 128. tuning.head_dim64_rows = 128 keeps 128 there
// (measurement). A caller building its own work list must use it and set PrefillPlan::tile_rows
// (and PrefillPlan::tuning, when not the default).
int paged_prefill_tile_rows(int head_dim, const PrefillTuning& tuning = {});

// Launches the kernel. params' pointers are device pointers; params' shapes must match the plan.
void paged_prefill_run(const PagedPrefillParams& params, const PrefillPlan& plan,
                       cudaStream_t stream);

}  // namespace longctx::kernels::cuda
