// Quest's page reuse across decode steps on the CPU (docs/sparse.md, "Page reuse across decode
// steps"), the reference of the GPU's kept slots (attention/backends/quest_cuda.h): per sequence
// and layer the previous decode step's selected pages of each KV head, each with the engine block
// id it was read from and its K / V rows as the gather wrote them (f32; FP8 dequantized). A
// decode row gathers its selected pages into a compact buffer (kernels::cpu::quest_gather): a page
// the sequence kept last step, settled then (its rows could not change any more) and still at the
// same block id, is copied from the kept rows instead of read where it lives (with offload: the
// host pool); then the step's pages are kept (kernels::cpu::quest_keep). The same bytes land in
// the compact buffer either way, so outputs are those without reuse, bit for bit.
// State is keyed by sequence id and dropped when the sequence's step is not a one-token decode
// gathered through here (a prefill chunk, a verify step, a row attended densely), when it leaves
// the batch, or when it is not among the step's first max_seqs sequences.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "attention/sparse/sparse_policy.h"
#include "kernels/quest_params.h"
#include "longctx/attention/forward_batch.h"

namespace longctx::sparse {

class PageReuse {
 public:
  // max_seqs: how many of a step's sequences (the first ones) keep their pages.
  PageReuse(const KvShape& shape, const kernels::QuestBudget& budget, int64_t max_seqs);

  // Once per step, before its first layer.
  void begin_step(const ForwardBatch& batch);

  // Sequence s of that step decodes `layer` over `sel` (not all()). memory: the gather's
  // memories, block_loc (this sequence's blocks, indptr {0, blocks}), kv_format and dtype (f32)
  // set; block_ids: the sequence's engine block ids. Returns its compact K and V: page i of KV
  // head h's list at rows [i * page_tokens, (i + 1) * page_tokens), each row [Hkv, d].
  struct Compact {
    const float* k = nullptr;
    const float* v = nullptr;
  };
  Compact gather(int64_t layer, int64_t s, const DecodeSelection& sel, const int32_t* block_ids,
                 kernels::QuestGatherParams memory);

  // (page, KV head) pairs the gathers copied from kept rows, and read from memory 1.
  int64_t reused_pages() const { return static_cast<int64_t>(reused_); }
  int64_t memory1_pages() const { return static_cast<int64_t>(memory1_); }

 private:
  struct Kept {
    int64_t step = -1;                   // the last step that gathered it
    std::vector<uint8_t> layer_kept;     // [layers]: the layer's lists below are from that step
    std::vector<int32_t> pages, blocks;  // [layers][Hkv][max_selected] (QuestKeepParams)
    std::vector<float> k, v;             // [layers][max_selected * page_tokens][Hkv][d]
  };

  KvShape s_;
  kernels::QuestBudget budget_;
  int64_t max_seqs_ = 0, max_selected_ = 0, rows_ = 0;  // rows_: floats of a layer's kept K
  int64_t step_ = 0;
  const ForwardBatch* batch_ = nullptr;
  std::vector<uint8_t> keeps_;                // [S] of the step: sequence s keeps its pages
  std::unordered_map<uint64_t, Kept> kept_;   // by sequence id
  std::vector<float> compact_k_, compact_v_;  // [max_selected * page_tokens][Hkv][d]
  std::vector<int32_t> selected_;             // [Hkv][max_selected]
  unsigned long long reused_ = 0, memory1_ = 0;
};

}  // namespace longctx::sparse
