// StreamingLLM (Xiao et al. 2024): the attention sinks (the first sink_tokens keys) and the recent
// window (the last window_tokens keys); nothing is scored, so the selection follows from the
// lengths alone.
//   decode   per KV head (all alike) the pages of page_tokens keys that hold a sink key or a
//            window key: pages [0, ceil(sink / page)) and [floor((kv_len - window) / page), end);
//            with --sparse-page 1 exactly the paper's keys. Every page when sink + window covers
//            the context (exact attention).
//   prefill  over query and key blocks of 128: query block i (positions [lo, hi]) keeps the key
//            blocks holding a sink key and those overlapping [lo - window + 1, hi] (its recent
//            window and the diagonal; causal within them). Dense when that is every causal block.
// CUDA twin, no device work of its own: the decode pages come from the page-list path of quest
// (QuestCuda without metadata or scores: its select kernel writes the forced pages, then the
// gather and the split-KV decode), the prefill masks are made on the host in plan() and uploaded
// with the step's index arrays. With KV offload the decode reads host pages in place and the
// prefill stages host keys like xattention, so offloaded output equals resident output.
#include <algorithm>

#include "attention/sparse/policies.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/quest_cpu.h"
#include "longctx/core/error.h"
#ifdef LONGCTX_WITH_CUDA
#include "attention/backends/quest_cuda.h"
#include "attention/backends/staged_words.h"
#endif

namespace longctx::sparse {

namespace {

constexpr int64_t kBlock = kernels::kSparseBlock;

// Nothing past the forced pages: a budget of sink + window pages has no free page left
// (quest_count's forced pages always number at least ceil(sink / p) + ceil(window / p)).
kernels::QuestBudget streaming_budget(const SparseOptions& o) {
  SparseOptions b = o;
  b.budget_tokens = o.sink_tokens + o.window_tokens;
  return quest_budget(b);
}

// The prefill mask of a chunk of n queries ending at kv_len, [q_blocks][k_blocks] (one head);
// empty when it keeps every causal block.
std::vector<uint8_t> streaming_mask(int64_t n, int64_t kv_len, int64_t sink, int64_t window) {
  const int64_t qb = (n + kBlock - 1) / kBlock, kb = (kv_len + kBlock - 1) / kBlock;
  const int64_t p0 = kv_len - n;
  std::vector<uint8_t> m(static_cast<size_t>(qb * kb), 0);
  bool dense = true;
  for (int64_t i = 0; i < qb; ++i) {
    const int64_t lo = p0 + i * kBlock, hi = p0 + std::min(n, (i + 1) * kBlock) - 1;
    for (int64_t j = 0; j * kBlock <= hi; ++j) {
      const bool keep = j * kBlock < sink || (j + 1) * kBlock - 1 >= lo - window + 1;
      m[i * kb + j] = keep;
      dense = dense && keep;
    }
  }
  if (dense) m.clear();
  return m;
}

class StreamingPolicy final : public SparsePolicy {
 public:
  StreamingPolicy(const SparseOptions& o, const KvShape& s)
      : o_(o), s_(s), budget_(streaming_budget(o)) {
    LONGCTX_CHECK(s.block_size % budget_.page_tokens == 0, ErrorCode::kInvalidArgument,
                  "streaming: --sparse-page {} must divide the KV block size {}",
                  budget_.page_tokens, s.block_size);
  }

  SparsePolicyKind kind() const override { return SparsePolicyKind::kStreaming; }

  DecodeSelection select_decode(int64_t, const float*, const SeqKeys& keys) override {
    const kernels::QuestCount c = kernels::quest_count(static_cast<int>(keys.kv_len), budget_);
    if (c.all) return {};
    std::vector<int32_t> pages;
    for (int32_t j = 0; j < c.num_pages; ++j)
      if (j < c.sink_pages || j >= c.window_first) pages.push_back(j);
    DecodeSelection sel;
    sel.page_tokens = budget_.page_tokens;
    sel.per_kv_head.assign(static_cast<size_t>(s_.num_kv_heads), pages);
    return sel;
  }

  PrefillMask select_prefill(int64_t, const float*, int64_t, int64_t n,
                             const SeqKeys& keys) override {
    const std::vector<uint8_t> one =
        streaming_mask(n, keys.kv_len, o_.sink_tokens, o_.window_tokens);
    if (one.empty()) return {};
    PrefillMask m;
    m.q_blocks = (n + kBlock - 1) / kBlock;
    m.k_blocks = (keys.kv_len + kBlock - 1) / kBlock;
    for (int64_t h = 0; h < s_.num_qo_heads; ++h)
      m.mask.insert(m.mask.end(), one.begin(), one.end());
    return m;
  }

 private:
  SparseOptions o_;
  KvShape s_;
  kernels::QuestBudget budget_;
};

void check(const SparseOptions& o) {
  LONGCTX_CHECK(o.sink_tokens >= 0 && o.window_tokens >= 1, ErrorCode::kInvalidArgument,
                "--sparse-sink {} must be >= 0 and --sparse-window {} >= 1", o.sink_tokens,
                o.window_tokens);
  LONGCTX_CHECK(o.page_tokens >= 1, ErrorCode::kInvalidArgument, "--sparse-page {} must be >= 1",
                o.page_tokens);
}

std::unique_ptr<SparsePolicy> make_cpu(const SparseOptions& o, const KvShape& s) {
  return std::make_unique<StreamingPolicy>(o, s);
}

SparseGpuBytes gpu_bytes(const SparseOptions& o, const SparseGpuShape& s) {
  const kernels::QuestBudget b = streaming_budget(o);
  LONGCTX_CHECK(s.block_size % b.page_tokens == 0, ErrorCode::kInvalidArgument,
                "streaming: --sparse-page {} must divide the KV block size {}", b.page_tokens,
                s.block_size);
  // No metadata; the page lists and compact buffers of quest's path (its scores counted too).
  const int64_t fixed =
      kernels::quest_gpu_bytes(b, s.num_layers, s.block_size, s.num_kv_heads, s.head_dim,
                               s.elem_size, s.max_seqs, s.max_model_len)
          .fixed;
  return {0, fixed};
}

#ifdef LONGCTX_WITH_CUDA
class StreamingCuda final : public SparsePolicyCuda {
 public:
  explicit StreamingCuda(const SparseCudaConfig& c)
      : c_(c),
        pages_(quest_cuda_config(c, streaming_budget(c.options), /*scored=*/false)),
        words_(c.device) {}

  bool plan(const ForwardBatch& batch, std::span<const int64_t> cache_slots,
            std::span<const int32_t> block_loc, cudaStream_t stream) override {
    if (!block_loc.empty()) return pages_.plan(batch, cache_slots, block_loc, stream);
    bool prefill = false;
    for (int64_t b = 0; b < batch.num_seqs(); ++b) prefill = prefill || batch.q_len(b) > 1;
    if (!prefill) return false;
    // [Hq][q_blocks][k_blocks] per sequence, as the block-sparse prefill reads it: the offload
    // path's value gather reads per-q-head rows too.
    std::vector<uint8_t> mask;
    std::vector<int64_t> indptr(1, 0);
    for (int64_t b = 0; b < batch.num_seqs(); ++b) {
      const int64_t n = batch.q_len(b), kv = batch.kv_lens[b];
      std::vector<uint8_t> one =
          streaming_mask(n, kv, c_.options.sink_tokens, c_.options.window_tokens);
      if (one.empty())
        one.assign(static_cast<size_t>(((n + kBlock - 1) / kBlock) * ((kv + kBlock - 1) / kBlock)),
                   1);  // causal within the kept blocks: dense
      for (int64_t h = 0; h < c_.num_qo_heads; ++h) mask.insert(mask.end(), one.begin(), one.end());
      indptr.push_back(static_cast<int64_t>(mask.size()));
    }
    words_.begin();
    mask_at_ = words_.put_bytes(mask.data(), mask.size());
    indptr_at_ = words_.put_bytes(indptr.data(), indptr.size() * sizeof(int64_t));
    words_.upload(stream);
    return true;
  }

  void attend_decode(int64_t layer, const void* q, void* o, float* o_f32,
                     const PageMemory (&mem)[2], cudaStream_t stream) override {
    pages_.attend_decode(layer, q, o, o_f32, mem, stream);
  }

  void select_prefill(kernels::PagedPrefillParams& p, cudaStream_t) override {
    p.block_mask = reinterpret_cast<const uint8_t*>(words_.device_at(mask_at_));
    p.block_mask_indptr = reinterpret_cast<const int64_t*>(words_.device_at(indptr_at_));
    p.block_mask_heads = p.num_qo_heads;
  }

  int64_t decode_grid() const override { return pages_.decode_grid(); }
  int64_t memory1_bytes_read() const override { return pages_.memory1_bytes_read(); }

 private:
  SparseCudaConfig c_;
  QuestCuda pages_;    // the decode's page lists, gather and compact decode
  StagedWords words_;  // the step's prefill masks and their indptr
  int64_t mask_at_ = 0, indptr_at_ = 0;
};

std::unique_ptr<SparsePolicyCuda> make_cuda(const SparseCudaConfig& c) {
  return std::make_unique<StreamingCuda>(c);
}
#endif

}  // namespace

extern const PolicyDef kStreamingPolicy{
    .kind = SparsePolicyKind::kStreaming,
    .name = "streaming",
    .prefill = true,
    .decode = true,
    .decode_graphs = false,   // decode steps run the page-list path, eagerly
    .offload_staging = true,  // prefill over host keys as xattention's, the same mask
    .check = check,
    .make_cpu = make_cpu,
#ifdef LONGCTX_WITH_CUDA
    .make_cuda = make_cuda,
#endif
    .gpu_bytes = gpu_bytes,
};

}  // namespace longctx::sparse
