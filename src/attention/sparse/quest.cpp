// Quest (decode): per block and KV head the elementwise min and max of its keys, kept as rows are
// written; a decode query scores each block by the upper bound of q.k over the block's keys and
// reads the top blocks within the token budget, plus the sink and the recent window.
// Per KV head (the default), a block's score for a KV head is the largest bound among the q heads
// that read that KV head, and each KV head gets its own list; head-averaged (per_head = false),
// the score is the mean bound over all q heads and every KV head reads the same list.
#include <algorithm>
#include <cstring>

#include "attention/sparse/policies.h"
#include "longctx/core/error.h"

namespace longctx::sparse {

namespace {

class QuestPolicy final : public SparsePolicy {
 public:
  QuestPolicy(const SparseOptions& o, const KvShape& s) : o_(o), s_(s) {
    const int64_t n = s.num_layers * s.num_blocks * s.num_kv_heads * 2 * s.head_dim;
    // Uninitialized: a block's metadata is written with its first row (offset 0), so the pages of
    // blocks never used are never touched.
    meta_.reset(new float[static_cast<size_t>(n)]);
  }

  std::string_view name() const override { return "quest"; }
  bool selects(Phase phase) const override { return phase == Phase::kDecode; }

  void on_keys_written(int64_t layer, const float* k, int64_t k_stride, const int64_t* slots,
                       int64_t n) override {
    const int64_t d = s_.head_dim;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t block = slots[t] / s_.block_size, offset = slots[t] % s_.block_size;
      for (int64_t h = 0; h < s_.num_kv_heads; ++h) {
        const float* row = k + t * k_stride + h * d;
        float* mn = meta(layer, block, h);
        float* mx = mn + d;
        if (offset == 0) {
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
    const size_t bytes = static_cast<size_t>(s_.num_kv_heads * 2 * s_.head_dim) * sizeof(float);
    for (int64_t l = 0; l < s_.num_layers; ++l)
      std::memcpy(meta(l, dst, 0), meta(l, src, 0), bytes);
  }

  DecodeSelection select_decode(int64_t layer, const float* q, const SeqKeys& keys) override {
    const int64_t bs = s_.block_size, kv_len = keys.kv_len;
    const int64_t nb = (kv_len + bs - 1) / bs;
    const int64_t budget_blocks = std::max<int64_t>(1, o_.budget_tokens / bs);
    if (o_.budget_tokens >= kv_len || budget_blocks >= nb) return {};  // everything fits: exact
    std::vector<uint8_t> forced(nb, 0);
    for (int64_t j = 0; j < std::min(nb, (o_.sink_tokens + bs - 1) / bs); ++j) forced[j] = 1;
    for (int64_t j = std::max<int64_t>(0, (kv_len - o_.window_tokens) / bs); j < nb; ++j)
      forced[j] = 1;
    const int64_t num_forced = std::count(forced.begin(), forced.end(), 1);
    const int64_t free_blocks = std::max<int64_t>(0, budget_blocks - num_forced);

    const int64_t hkv = s_.num_kv_heads, group = s_.num_qo_heads / hkv, d = s_.head_dim;
    std::vector<float> score(nb);
    auto bound = [&](int64_t j, int64_t qh) {
      const float* mn = meta(layer, keys.blocks[j], qh / group);
      return quest_upper_bound(q + qh * d, mn, mn + d, d);
    };
    DecodeSelection sel;
    sel.per_kv_head.resize(hkv);
    for (int64_t h = 0; h < (o_.per_head ? hkv : 1); ++h) {
      for (int64_t j = 0; j < nb; ++j) {
        if (forced[j]) continue;
        if (o_.per_head) {
          float best = bound(j, h * group);
          for (int64_t g = 1; g < group; ++g) best = std::max(best, bound(j, h * group + g));
          score[j] = best;
        } else {
          float sum = 0.f;
          for (int64_t qh = 0; qh < s_.num_qo_heads; ++qh) sum += bound(j, qh);
          score[j] = sum / static_cast<float>(s_.num_qo_heads);
        }
      }
      sel.per_kv_head[h] = pick(forced, score, free_blocks);
    }
    if (!o_.per_head)
      for (int64_t h = 1; h < hkv; ++h) sel.per_kv_head[h] = sel.per_kv_head[0];
    return sel;
  }

 private:
  float* meta(int64_t layer, int64_t block, int64_t kv_head) const {
    return meta_.get() +
           ((layer * s_.num_blocks + block) * s_.num_kv_heads + kv_head) * 2 * s_.head_dim;
  }

  // The forced blocks and the `free_blocks` best others (ties: the earlier block), ascending.
  static std::vector<int32_t> pick(const std::vector<uint8_t>& forced,
                                   const std::vector<float>& score, int64_t free_blocks) {
    const int64_t nb = static_cast<int64_t>(forced.size());
    std::vector<int32_t> cand;
    for (int64_t j = 0; j < nb; ++j)
      if (!forced[j]) cand.push_back(static_cast<int32_t>(j));
    const int64_t k = std::min<int64_t>(free_blocks, static_cast<int64_t>(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [&](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    cand.resize(k);
    for (int64_t j = 0; j < nb; ++j)
      if (forced[j]) cand.push_back(static_cast<int32_t>(j));
    std::sort(cand.begin(), cand.end());
    return cand;
  }

  SparseOptions o_;
  KvShape s_;
  std::unique_ptr<float[]> meta_;  // [layers][blocks][Hkv][min d, max d]
};

}  // namespace

std::unique_ptr<SparsePolicy> make_quest_policy(const SparseOptions& options,
                                                const KvShape& shape) {
  return std::make_unique<QuestPolicy>(options, shape);
}

}  // namespace longctx::sparse
