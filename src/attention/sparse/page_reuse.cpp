#include "attention/sparse/page_reuse.h"

#include <algorithm>

#include "kernels/cpu/quest_cpu.h"
#include "longctx/core/error.h"

namespace longctx::sparse {

PageReuse::PageReuse(const KvShape& shape, const kernels::QuestBudget& budget, int64_t max_seqs)
    : s_(shape), budget_(budget), max_seqs_(max_seqs) {
  LONGCTX_CHECK(max_seqs >= 1, ErrorCode::kInvalidArgument,
                "--quest-reuse-seqs {} must be at least 1", max_seqs);
  max_selected_ = kernels::quest_max_selected(budget);
  rows_ = max_selected_ * budget.page_tokens * s_.num_kv_heads * s_.head_dim;
  compact_k_.resize(static_cast<size_t>(rows_));
  compact_v_.resize(static_cast<size_t>(rows_));
  selected_.resize(static_cast<size_t>(s_.num_kv_heads * max_selected_));
}

void PageReuse::begin_step(const ForwardBatch& batch) {
  ++step_;
  batch_ = &batch;
  const int64_t real = batch.num_seqs() - batch.num_padding_seqs;
  keeps_.assign(static_cast<size_t>(batch.num_seqs()), 0);
  std::unordered_map<uint64_t, Kept> carried;
  // (A batch without sequence ids keeps nothing.)
  const int64_t keeping = static_cast<int64_t>(batch.seq_ids.size()) == batch.num_seqs()
                              ? std::min(real, max_seqs_)
                              : 0;
  for (int64_t s = 0; s < keeping; ++s) {
    if (batch.q_len(s) != 1) continue;
    keeps_[s] = 1;
    auto it = kept_.find(batch.seq_ids[s]);
    // Only what the sequence's previous step (this object's last one) gathered carries over.
    if (it != kept_.end() && it->second.step == step_ - 1)
      carried.emplace(it->first, std::move(it->second));
  }
  kept_ = std::move(carried);
}

PageReuse::Compact PageReuse::gather(int64_t layer, int64_t s, const DecodeSelection& sel,
                                     const int32_t* block_ids, kernels::QuestGatherParams g) {
  LONGCTX_CHECK(batch_ != nullptr && s < batch_->num_seqs() && !sel.all() &&
                    sel.page_tokens == budget_.page_tokens,
                ErrorCode::kInternal, "quest reuse: a gather outside a planned decode row");
  const int64_t hkv = s_.num_kv_heads;
  const int32_t kv_len = batch_->kv_lens[s];
  const kernels::QuestCount c = kernels::quest_count(kv_len, budget_);
  for (int64_t h = 0; h < hkv; ++h) {
    LONGCTX_CHECK(static_cast<int64_t>(sel.per_kv_head[h].size()) == c.num_selected,
                  ErrorCode::kInternal, "quest reuse: {} pages selected, {} expected",
                  sel.per_kv_head[h].size(), c.num_selected);
    std::copy(sel.per_kv_head[h].begin(), sel.per_kv_head[h].end(),
              selected_.begin() + h * max_selected_);
  }
  const int32_t nblocks = static_cast<int32_t>((kv_len + s_.block_size - 1) / s_.block_size);
  const int32_t indptr[2] = {0, nblocks};
  Kept* kept = nullptr;
  if (keeps_[s]) {
    Kept& k = kept_[batch_->seq_ids[s]];
    if (k.layer_kept.empty()) {
      k.layer_kept.assign(static_cast<size_t>(s_.num_layers), 0);
      k.pages.resize(static_cast<size_t>(s_.num_layers * hkv * max_selected_));
      k.blocks.resize(k.pages.size());
      k.k.resize(static_cast<size_t>(s_.num_layers * rows_));
      k.v.resize(k.k.size());
    }
    if (k.step != step_) {  // the first layer of this step: the others' lists are last step's
      if (k.step != step_ - 1) std::fill(k.layer_kept.begin(), k.layer_kept.end(), 0);
      k.step = step_;
    }
    kept = &k;
  }
  const int32_t slot = 0, none = -1;
  const int64_t list = layer * hkv * max_selected_;
  g.block_indptr = indptr;
  g.block_ids = block_ids;
  g.kv_lens = &kv_len;
  g.selected = selected_.data();
  g.out_k = compact_k_.data();
  g.out_v = compact_v_.data();
  g.memory1_pages = &memory1_;
  g.batch = 1;
  g.num_kv_heads = static_cast<int>(hkv);
  g.head_dim = static_cast<int>(s_.head_dim);
  g.pages_per_block = static_cast<int>(s_.block_size / budget_.page_tokens);
  g.max_selected = static_cast<int>(max_selected_);
  g.budget = budget_;
  g.dtype = DType::kF32;
  if (kept != nullptr && kept->layer_kept[layer]) {
    g.reuse_read = &slot;
    g.kept_pages = kept->pages.data() + list;
    g.kept_blocks = kept->blocks.data() + list;
    g.kept_k = kept->k.data() + layer * rows_;
    g.kept_v = kept->v.data() + layer * rows_;
    g.reused_pages = &reused_;
  } else {
    g.reuse_read = &none;
  }
  kernels::cpu::quest_gather(g);
  if (kept != nullptr) {
    kernels::QuestKeepParams p;
    p.compact_k = compact_k_.data();
    p.compact_v = compact_v_.data();
    p.kept_k = kept->k.data() + layer * rows_;
    p.kept_v = kept->v.data() + layer * rows_;
    p.kept_pages = kept->pages.data() + list;
    p.kept_blocks = kept->blocks.data() + list;
    p.reuse_write = &slot;
    p.selected = selected_.data();
    p.block_indptr = indptr;
    p.block_ids = block_ids;
    p.kv_lens = &kv_len;
    p.batch = 1;
    p.num_kv_heads = g.num_kv_heads;
    p.head_dim = g.head_dim;
    p.pages_per_block = g.pages_per_block;
    p.max_selected = g.max_selected;
    p.budget = budget_;
    p.dtype = DType::kF32;
    p.whole_blocks = g.kv_format == kernels::KvCacheFormat::kFp8E4M3;
    kernels::cpu::quest_keep(p);
    kept->layer_kept[layer] = 1;
  }
  return {compact_k_.data(), compact_v_.data()};
}

}  // namespace longctx::sparse
