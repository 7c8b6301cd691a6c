// CUDA kernels of Quest's decode path (kernels/quest_params.h; CPU references in
// kernels/cpu/quest_cpu.h):
//   quest_meta_run    one CTA per (page, KV head): the page's key min / max (exact: the extreme
//                     elements themselves; FP8: the codes' min / max times the block's scale,
//                     exact in bf16), after the step's keys were stored;
//   quest_select_run  each candidate page's bound (head_dim 32 / 64 / 128 / 256: a half-warp per
//                     page, 16-byte loads of the min and max, several pages' loads in flight per
//                     half-warp before any is scored; other head_dims: a warp per page), then
//                     one CTA per (KV head, sequence) finds the num_free-th largest key (the
//                     scores' ordered bits) by histograms of 2,048 bins over the keys' range
//                     (shared atomics; the range narrows to the threshold's bin until one warp
//                     can rank what is left) and compacts in one ordered pass (ties: the earlier
//                     page), so the lists come out ascending with no sort; both launches are
//                     programmatic dependent launches (pdl.cuh: each waits first thing, so only
//                     their launch latency overlaps the kernel before);
//   quest_gather_run  one CTA per (selected page, KV head, sequence): the page's K and V rows
//                     into the compact buffers, 16-byte loads where the rows allow; a source in
//                     pinned host memory is read in place (mapped, zero-copy), which the SMs keep
//                     at ~92% of the link's rate even for 4 KB pages (docs/sparse.md). FP8:
//                     the codes (16-byte loads of 16 where the rows allow) and their blocks'
//                     scales, written dequantized in the compact buffers' 16-bit dtype. With
//                     page reuse, a page its sequence's kept slot holds unchanged (a binary
//                     search of the slot's list, the block id compared) is copied from there;
//   quest_keep_run    one CTA per (selected page, KV head, sequence) of a sequence that keeps
//                     its pages: the slot's list entry and a settled page's rows from the compact
//                     buffers (device to device).
// All read device memory only (no host sync): safe inside a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include "kernels/quest_params.h"

namespace longctx::kernels::cuda {

void quest_meta_run(const QuestMetaParams& params, cudaStream_t stream);
// Throws Error(kUnsupported) for head_dim > 256 or more q heads x head_dim than shared memory
// holds (the queries of a CTA are staged there).
void quest_select_run(const QuestSelectParams& params, cudaStream_t stream);
// quest_select_run's two launches apart: the candidate pages' scores (into params.scores), and
// the lists from those scores.
void quest_score_run(const QuestSelectParams& params, cudaStream_t stream);
void quest_select_lists_run(const QuestSelectParams& params, cudaStream_t stream);
void quest_gather_run(const QuestGatherParams& params, cudaStream_t stream);
void quest_keep_run(const QuestKeepParams& params, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
