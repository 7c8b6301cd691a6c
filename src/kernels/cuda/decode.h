// CUDA batch decode over a paged KV cache, split-KV (flash-decoding): plan() cuts each request's
// KV into chunks so that even ONE request at 32K+ keys spreads over every SM; each CTA handles one
// (chunk, kv head) and all q heads of that kv group at once (so each K/V byte is read once, up to
// 8 q heads per CTA), and the partial (o, lse) states of a split request are merged in fp32 by the
// last of its CTAs (fused: one launch per call; many splits in two levels, the last CTA of each
// group of splits first: decode_merge_group). Requests that fit in one chunk write o directly.
//
// The kernel (decode.cu) streams K/V tiles through a 4-stage cp.async ring in shared memory and
// computes with mma.sync (tensor cores: CUDA-core math would make it compute-bound). q is read in
// place from rows q_token_stride apart (a view of the fused QKV output needs no copy).
// On sm_90 with pages a multiple of the tile (32 tokens at head_dim 128, 64 at 64) one thread
// brings each tile by the TMA instead (decode_tma_kernel; at head_dim 128 in 3 stages of 64
// tokens where the pages hold them); elsewhere every thread copies its part by cp.async.
// DecodeTuning (longctx/kernels/kernel_tuning.h) overrides the plan's wave model (slots,
// overhead), the loader (the ring, or TMA tiles of 32 tokens) and how the stages are filled
// (docs/benchmarks.md has the variants measured).
// Verify steps (several queries per request, DecodeQueries; DecodeParams' causal-tail rule):
// a request's q_len queries fold into the GQA group, so a kv head's rows are its q heads times
// the plan's most queries per request (max_q_len) and its CTAs take them 8 at a time (the
// mma.sync m16 tile's live rows); every loader and the FP8 kernel serve them unchanged, each row
// masking the keys past its own end. Partial states and the fused merge scale with the rows. A
// plan of one query per request is today's plan: the same grid, work list and launches.
// An FP8 cache (plan's kv_format kFp8E4M3; DecodeParams' k_scale / v_scale) is read by a
// cp.async ring of codes and page scales; by default (DecodeFp8Kernel::kRegisters) the codes are
// converted in registers into the tensor-core fragments and the page scales multiply the scores
// and the softmax weights (exact: powers of two), else each tile is dequantized into a 16-bit
// tile in shared memory that the 16-bit compute reads. Accumulation is fp32 either way.
//
//   size_t ws = decode_workspace_bytes(max_batch, num_qo_heads, num_kv_heads, head_dim, num_sms);
//   DecodePlan plan = decode_plan(kv_indptr_host, kv_last_page_len_host, batch, page_size,
//                                 num_qo_heads, num_kv_heads, head_dim, d_ws, ws, stream);
//   for (layer ...) decode_run(params, plan, stream);   // no host sync, graph-safe
//
// The work list carries each request's kv_indptr entry, so the kernel's first page lookup does
// not wait for a load of kv_indptr: run()'s params.kv_indptr must hold the values plan() was
// given (it is not read on the device).
//
// The kernel reads its work item and the pages of its first keys before it waits for the kernel
// before it (programmatic dependent launch: the L2 prefetch of those keys overlaps that kernel),
// so kv_indices must hold its values before that kernel starts (host copies, as plan()'s work
// list); the K / V pages may be written by the kernel right before decode_run.
//
// run() reads only device memory written by plan() (work list + partial buffers in the caller's
// workspace; the merge counters it increments are back at 0 when it ends), so it can be captured
// in a CUDA graph. Every workspace address depends on the batch size and max_q_len alone
// (decode_plan rewrites the work list in place), so a graph captured for one plan replays any later
// plan of the same batch size and max_q_len once its decode kernel nodes get the new plan's grid
// (decode_grid_ctas; the nodes are the ones is_decode_kernel() names). One run at a time per
// workspace.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/decode_params.h"
#include "kernels/decode_schedule.h"
#include "longctx/kernels/kernel_tuning.h"

namespace longctx::kernels::cuda {

struct DecodePlan {
  int batch_size = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int chunk_tokens = 0;  // keys per split
  int window = 0;        // DecodeParams::window the work list was made for
  int max_q_len = 1;     // the most queries of a request (DecodeQueries)
  bool causal = true;    // DecodeQueries::causal
  int loader = 0;        // K/V tiles: 0 cp.async by every thread, 1 TMA, 2 TMA of doubled tiles
  KvCacheFormat kv_format = KvCacheFormat::kDtype;           // the caches decode_run will read
  DecodeFp8Kernel fp8_kernel = DecodeFp8Kernel::kRegisters;  // FP8 caches' kernel (not kAuto)
  bool cp_async_stages = false;  // loader >= 1: the stages are filled by every thread's cp.async
                                 // instead of TMA boxes (the faster over long splits)
  int num_work_items = 0;        // items of the grid (CTAs: items x kv heads x tiles)
  int num_partials = 0;          // partial states (0: no request was split)
  const int32_t* work_items = nullptr;  // device [num_work_items, 8]: request, kv begin, kv end,
                                        // partial slot (-1: write o/lse directly), the
                                        // request's kv_indptr entry, first partial slot,
                                        // partial count, 0
  float* partial_o = nullptr;           // device [num_partials, max_q_len, num_qo_heads, head_dim]
  float* partial_lse = nullptr;         // device [num_partials, max_q_len, num_qo_heads]
  int32_t* counters = nullptr;  // device [batch_size, num_kv_heads * head tiles] finished splits
                                // (the fused merge's; zeroed by plan(), left at 0 by each run)
  int32_t* group_counters = nullptr;  // device [max_partials, num_kv_heads * head tiles]: the
                                      // two-level merge's finished splits per group (at the
                                      // group's first slot; zeroed by plan(), left at 0)
  int max_partials = 0;               // partial slots the workspace holds (group_counters' rows)
  // The fused merge's group size (decode_merge_group's `pinned`): 0 its rule per request, N > 0
  // groups of N partial states (N >= a request's splits: one level). plan() leaves 0; a bench
  // may pin it before decode_run (any value merges correctly: the workspace holds a counter per
  // partial slot).
  int merge_group = 0;
  // Keys at the start of each CTA's range whose K / V rows it prefetches into L2 before it waits
  // for the kernel before it (kDecodePrefetchTokens; 0: none). A hint: any value reads the same.
  int prefetch_tokens = 0;
};

// The plan's prefetch_tokens: 4 of the TMA kernel's 64-token stages (two of them in its
// prologue), 128 KB of K + V a CTA at head_dim 128.
constexpr int kDecodePrefetchTokens = 256;

// CUDA-graph replay (engine/cuda_graphs.h): the last num_padding requests only fill a graph's
// batch size; each gets one work item over all its keys (meant for a key or two) and they do not
// change the chunk the real requests get, so those are split exactly as in a plan of the real
// requests alone.
struct DecodeGraphMode {
  int num_padding = 0;
};

// Workspace plan() may use for any batch of at most max_batch requests of at most max_q_len
// queries each (1 to kDecodeMaxQLen). num_sms = 0: the current device's SM count.
size_t decode_workspace_bytes(int max_batch, int num_qo_heads, int num_kv_heads, int head_dim,
                              int num_sms = 0, int max_q_len = 1);

// Host inputs: kv_indptr_host [batch_size + 1], kv_last_page_len_host [batch_size], and
// queries.qo_indptr [batch_size + 1] for verify steps (run()'s params must then have a non-null
// qo_indptr, not read on the device, and the same causal rule); window: the
// sliding window of DecodeParams (each request's items start at its first visible key, so the
// keys before it are not read but for the 64-aligned tile that holds it). Picks the
// chunk size from the request lengths, the kv head count, the SM count and the kernel's resident
// CTAs per SM (a wave model: as few even waves as possible) and `tuning` (the loader, the
// stages' fill, the wave model's overrides); copies the work list into the
// workspace and zeroes the merge counters on `stream` (async; the host arrays may be reused when
// this returns).
// Throws Error(kInvalidArgument) on a malformed page table or a too small workspace,
// Error(kUnsupported) for head_dim other than 64/128 or a non-integral GQA ratio.
DecodePlan decode_plan(const int32_t* kv_indptr_host, const int32_t* kv_last_page_len_host,
                       int batch_size, int page_size, int num_qo_heads, int num_kv_heads,
                       int head_dim, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       int num_sms = 0, int min_chunk_tokens = 256,
                       const DecodeGraphMode& graph = {}, const DecodeTuning& tuning = {},
                       int window = 0, KvCacheFormat kv_format = KvCacheFormat::kDtype,
                       const DecodeQueries& queries = {});

// CTAs of decode_run's (one-dimensional) grid for `plan`.
int64_t decode_grid_ctas(const DecodePlan& plan);
// True when `func` (a kernel node's function) is one of decode_run's kernels.
bool is_decode_kernel(const void* func);

// Launches the kernel (one launch; split requests are merged inside it). params' pointers are
// device pointers; shapes and kv_format must match the plan; dtype bf16 or f16.
void decode_run(const DecodeParams& params, const DecodePlan& plan, cudaStream_t stream);

#ifdef LONGCTX_TIMELINE_PROBE
// Timeline probe builds (kernels/cuda/timeline_probe.cuh): clear the marks; print, for the
// decode_run launches since, where the first `ctas` CTAs of the grid spent their time.
void decode_timeline_reset();
void decode_timeline_print(int64_t ctas);
#endif

}  // namespace longctx::kernels::cuda
