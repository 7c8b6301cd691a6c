// Quest (decode; Tang et al. 2024): per page of page_tokens keys and KV head the elementwise min
// and max of its keys, kept as rows are written; a decode query scores each page by the upper
// bound of q.k over the page's keys and reads the top pages within the token budget, plus the
// sink and the recent window. Per KV head (the default), a page's score is the largest bound
// among the q heads of that KV head and each KV head gets its own list; head-averaged
// (per_head = false), the mean bound over all q heads picks one list for every head.
// CPU: the selection is the kernels' reference (kernels::cpu::quest_select), the one the CUDA
// kernels are tested against, so the CPU engine reads the pages the GPU reads. CUDA twin:
// QuestCuda (attention/backends/quest_cuda.h: metadata, score and select kernels, the gather of
// the selected pages, the split-KV decode over them).
#include <algorithm>
#include <cstring>

#include "attention/sparse/page_reuse.h"
#include "attention/sparse/policies.h"
#include "kernels/cpu/quest_cpu.h"
#include "longctx/core/error.h"
#ifdef LONGCTX_WITH_CUDA
#include "attention/backends/quest_cuda.h"
#endif

namespace longctx::sparse {

int64_t quest_reuse_seqs(const SparseOptions& o, int64_t max_seqs) {
  return o.quest_reuse ? std::min(o.quest_reuse_seqs, max_seqs) : 0;
}

kernels::QuestBudget quest_budget(const SparseOptions& o) {
  auto clamp = [](int64_t v) { return static_cast<int>(std::clamp<int64_t>(v, 0, 1 << 30)); };
  return {clamp(o.page_tokens), clamp(o.budget_tokens), clamp(o.sink_tokens),
          clamp(o.window_tokens)};
}

namespace {

class QuestPolicy final : public SparsePolicy {
 public:
  QuestPolicy(const SparseOptions& o, const KvShape& s) : o_(o), s_(s), budget_(quest_budget(o)) {
    kernels::cpu::check_quest_budget(budget_, static_cast<int>(s.block_size));
    pages_per_block_ = s.block_size / budget_.page_tokens;
    const int64_t n =
        s.num_layers * s.num_blocks * pages_per_block_ * s.num_kv_heads * 2 * s.head_dim;
    // Uninitialized: a page's metadata is written with its first row, so the pages of blocks
    // never used are never touched.
    meta_.reset(new float[static_cast<size_t>(n)]);
    if (o.quest_reuse) reuse_ = std::make_unique<PageReuse>(s, budget_, o.quest_reuse_seqs);
  }

  PageReuse* page_reuse() override { return reuse_.get(); }

  SparsePolicyKind kind() const override { return SparsePolicyKind::kQuest; }

  void on_keys_written(int64_t layer, const float* k, int64_t k_stride, const int64_t* slots,
                       int64_t n) override {
    // Rows of a page come in order, its first one first: a running min / max is the min / max
    // of the rows written so far (what the GPU recomputes from the cache per touched page).
    const int64_t d = s_.head_dim, pt = budget_.page_tokens;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t block = slots[t] / s_.block_size, offset = slots[t] % s_.block_size;
      for (int64_t h = 0; h < s_.num_kv_heads; ++h) {
        const float* row = k + t * k_stride + h * d;
        float* mn = meta(layer, block, offset / pt, h);
        float* mx = mn + d;
        if (offset % pt == 0) {
          std::memcpy(mn, row, d * sizeof(float));
          std::memcpy(mx, row, d * sizeof(float));
          continue;
        }
        for (int64_t i = 0; i < d; ++i) {
          mn[i] = std::min(mn[i], row[i]);
          mx[i] = std::max(mx[i], row[i]);
        }
      }
    }
  }

  void on_block_copied(int32_t src, int32_t dst) override {
    const size_t floats = static_cast<size_t>(pages_per_block_ * s_.num_kv_heads * 2 * s_.head_dim);
    for (int64_t l = 0; l < s_.num_layers; ++l)
      std::memcpy(meta(l, dst, 0, 0), meta(l, src, 0, 0), floats * sizeof(float));
  }

  DecodeSelection select_decode(int64_t layer, const float* q, const SeqKeys& keys) override {
    const int kv_len = static_cast<int>(keys.kv_len);
    const kernels::QuestCount c = kernels::quest_count(kv_len, budget_);
    if (c.all) return {};  // everything fits: exact attention
    const int hkv = static_cast<int>(s_.num_kv_heads);
    const int32_t indptr[2] = {0,
                               static_cast<int32_t>((kv_len + s_.block_size - 1) / s_.block_size)};
    std::vector<int32_t> selected(static_cast<size_t>(hkv) * c.num_selected);
    kernels::QuestSelectParams p;
    p.q = q;
    p.meta = meta(layer, 0, 0, 0);
    p.block_indptr = indptr;
    p.block_tables = keys.blocks;
    p.kv_lens = &kv_len;
    p.selected = selected.data();
    p.batch = 1;
    p.num_qo_heads = static_cast<int>(s_.num_qo_heads);
    p.num_kv_heads = hkv;
    p.head_dim = static_cast<int>(s_.head_dim);
    p.pages_per_block = static_cast<int>(pages_per_block_);
    p.max_pages = c.num_pages;
    p.max_selected = c.num_selected;
    p.budget = budget_;
    p.per_head = o_.per_head;
    p.dtype = DType::kF32;
    kernels::cpu::quest_select(p);
    DecodeSelection sel;
    sel.page_tokens = budget_.page_tokens;
    sel.per_kv_head.resize(hkv);
    for (int h = 0; h < hkv; ++h)
      sel.per_kv_head[h].assign(selected.begin() + int64_t(h) * c.num_selected,
                                selected.begin() + int64_t(h + 1) * c.num_selected);
    return sel;
  }

 private:
  // [layers][blocks][pages_per_block][Hkv][min d, max d]: QuestMetaParams::meta per layer.
  float* meta(int64_t layer, int64_t block, int64_t page, int64_t kv_head) const {
    return meta_.get() +
           (((layer * s_.num_blocks + block) * pages_per_block_ + page) * s_.num_kv_heads +
            kv_head) *
               2 * s_.head_dim;
  }

  SparseOptions o_;
  KvShape s_;
  kernels::QuestBudget budget_;
  int64_t pages_per_block_ = 1;
  std::unique_ptr<float[]> meta_;  // see meta()
  std::unique_ptr<PageReuse> reuse_;
};

void check_quest(const SparseOptions& o) {
  LONGCTX_CHECK(o.sink_tokens >= 0 && o.window_tokens >= 1, ErrorCode::kInvalidArgument,
                "--sparse-sink {} must be >= 0 and --sparse-window {} >= 1", o.sink_tokens,
                o.window_tokens);
  LONGCTX_CHECK(o.page_tokens >= 1, ErrorCode::kInvalidArgument, "--sparse-page {} must be >= 1",
                o.page_tokens);
  LONGCTX_CHECK(o.quest_reuse_seqs >= 1, ErrorCode::kInvalidArgument,
                "--quest-reuse-seqs {} must be at least 1", o.quest_reuse_seqs);
  LONGCTX_CHECK(o.budget_tokens > o.sink_tokens + o.window_tokens, ErrorCode::kInvalidArgument,
                "--sparse-budget {} must be more than --sparse-sink {} + --sparse-window {} "
                "(those are always read)",
                o.budget_tokens, o.sink_tokens, o.window_tokens);
}

std::unique_ptr<SparsePolicy> make_cpu(const SparseOptions& o, const KvShape& s) {
  return std::make_unique<QuestPolicy>(o, s);
}

SparseGpuBytes gpu_bytes(const SparseOptions& o, const SparseGpuShape& s) {
  const kernels::QuestBudget b = quest_budget(o);
  kernels::cpu::check_quest_budget(b, static_cast<int>(s.block_size));
  const kernels::QuestBytes q = kernels::quest_gpu_bytes(
      b, s.num_layers, s.block_size, s.num_kv_heads, s.head_dim, s.elem_size, s.max_seqs,
      s.max_model_len, quest_reuse_seqs(o, s.max_seqs));
  return {q.per_block, q.fixed};
}

#ifdef LONGCTX_WITH_CUDA
std::unique_ptr<SparsePolicyCuda> make_cuda(const SparseCudaConfig& c) {
  return std::make_unique<QuestCuda>(quest_cuda_config(c, quest_budget(c.options),
                                                       /*scored=*/true));
}
#endif

}  // namespace

extern const PolicyDef kQuestPolicy{
    .kind = SparsePolicyKind::kQuest,
    .name = "quest",
    .decode = true,
    // Decode steps replay in CUDA graphs: the selection runs on the device, its arrays sit at
    // fixed addresses and only the compact decode's grid follows the step (quest_cuda.h).
    .decode_graphs = true,
    .reads_fp8 = true,
    .check = check_quest,
    .make_cpu = make_cpu,
#ifdef LONGCTX_WITH_CUDA
    .make_cuda = make_cuda,
#endif
    .gpu_bytes = gpu_bytes,
};

}  // namespace longctx::sparse
