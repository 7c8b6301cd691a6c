// CPU references of Quest's decode kernels (kernels/quest_params.h): what the CUDA kernels
// (kernels/cuda/quest.h) are tested against. fp32 arithmetic on bf16 / f16 / f32 storage, and
// on FP8 E4M3 caches (codes x their block's scale).
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/quest_params.h"

namespace longctx::kernels::cpu {

// Throws Error(kInvalidArgument) naming the field: a page size that does not divide the block,
// non-positive shapes, a budget that is not above sink + window.
void check_quest_budget(const QuestBudget& budget, int block_size);

void quest_meta_update(const QuestMetaParams& params);

// The score of logical page `page` of sequence b for KV head h (per_head) or for every head
// (head-averaged), in fp32 (exposed for the tests' tolerance checks).
float quest_page_score(const QuestSelectParams& params, int b, int h, int page);

// Fills params.selected (scores is not used).
void quest_select(const QuestSelectParams& params);

void quest_gather(const QuestGatherParams& params);
void quest_keep(const QuestKeepParams& params);

// Host planning shared by the GPU path and the CPU offload simulation. The pages a step's new
// tokens touch, as QuestMetaParams::pages entries (4 ints each): token t is at engine slot
// meta_slots[t] (its metadata's block; < 0: padding) and cache slot cache_slots[t] (where its
// keys were stored), each block * block_size + offset. block_prefix (an FP8 cache, where a row
// that raises its block's scale re-encodes the block's earlier rows): also every page of a
// touched block before the touched one, whole.
std::vector<int32_t> quest_touched_pages(std::span<const int64_t> meta_slots,
                                         std::span<const int64_t> cache_slots, int block_size,
                                         int page_tokens, bool block_prefix = false);
// Keys of a sequence's compact buffer: its selected pages, the last one partial.
int quest_compact_len(int kv_len, const QuestBudget& budget);

// CUDA graphs (attention/backends/quest_cuda.h): a graph-shaped decode step's touched pages
// padded to the fixed count of batch * touched_per_token entries with fillers (rows 0, which
// quest_meta_update and the kernels skip), so the metadata launch follows the batch size alone.
// Throws Error(kInternal) when the step touched more.
std::vector<int32_t> quest_fixed_pages(std::vector<int32_t> pages, int64_t batch,
                                       int64_t touched_per_token);

// Word offsets of a decode step's arrays in one int32 index buffer, the same for every step of a
// run (a graph captured over one decode step reads the next's there): in this order, each
// 16-byte aligned, sized for max_seqs sequences, max_entries block-table entries and max_touched
// metadata entries (4 words each).
struct QuestDecodeLayout {
  int64_t lens = 0, indptr = 0;                           // [S], [S + 1]
  int64_t dec_indptr = 0, dec_indices = 0, dec_last = 0;  // the compact decode's [S + 1], [S], [S]
  int64_t qo = 0;                                         // [S + 1]
  int64_t pages = 0, tables = 0, loc = 0;                 // [touched][4], [entries], [entries]
  int64_t reuse_read = 0, reuse_write = 0;                // [S], [S]: page reuse's slots
  int64_t total = 0;                                      // words in all
  int64_t max_seqs = 0, max_entries = 0, max_touched = 0;
};
QuestDecodeLayout quest_decode_layout(int64_t max_seqs, int64_t max_entries, int64_t max_touched);

// Page reuse across decode steps on the GPU (docs/sparse.md): which of `slots` kept slots each
// sequence of a decode step reads (QuestGatherParams::reuse_read) and writes
// (QuestKeepParams::reuse_write). The step's first `slots` real sequences keep pages: one that
// kept pages in the previous step (a decode step) reads and writes its slot, another writes a
// slot no continuing sequence holds and reads none; the rest (padding included) -1, -1. A step
// that is not a decode step drops every sequence's pages.
class QuestReuseSlots {
 public:
  explicit QuestReuseSlots(int64_t slots);
  // A step of num_seqs sequences, the last num_padding of them padding; seq_ids [num_seqs], or
  // empty (a batch without ids: none keeps pages); read, write: resized to num_seqs.
  void decode_step(std::span<const uint64_t> seq_ids, int64_t num_seqs, int64_t num_padding,
                   std::vector<int32_t>& read, std::vector<int32_t>& write);
  void other_step() { slot_of_.clear(); }

 private:
  int64_t slots_ = 0;
  std::unordered_map<uint64_t, int32_t> slot_of_;  // the previous decode step's
};

}  // namespace longctx::kernels::cpu
