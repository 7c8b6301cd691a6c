// What the CUDA-graph tests share (test_cuda_graphs.cpp, test_quest_reuse_graphs.cpp): a KV pool
// and paged backend per rig, sequences and their batches, the dummy models, quest's graph-test
// options and its offload backends.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/backends/offload_backend.h"
#include "attention/backends/paged_backend.h"
#include "common/test_data.h"
#include "kv/paged_kv_pool.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::testing {

inline constexpr int64_t kMaxSeqs = 32;
inline constexpr uint16_t kFill = 0x7fc1;  // a NaN pattern no kernel writes

// One KV pool + paged backend for a model, as GpuRunner's constructor builds them, its pool
// filled with kFill (16-bit pools) and one scratch block taken first (so the rigs' block ids
// agree); optionally a sparse policy and an FP8 pool.
struct Rig {
  std::unique_ptr<PagedKVPool> pool;
  std::unique_ptr<AttentionBackend> attention;
  int32_t scratch = -1;

  Rig(const Model& model, int64_t num_blocks, int64_t block_size, const SparseOptions& sparse = {},
      bool fp8 = false, const kernels::KernelTuning& tuning = {}) {
    const ModelConfig& c = model.config();
    PagedKVPoolConfig kv{c.num_hidden_layers, c.num_key_value_heads,    c.head_dim,    block_size,
                         num_blocks,          model.activation_dtype(), model.device()};
    if (fp8) {
      kv.dtype = DType::kFP8E4M3;
      kv.fp8_source_dtype = model.activation_dtype();
    }
    pool = std::make_unique<PagedKVPool>(kv);
    PagedBackendLimits limits;
    limits.max_tokens = 32768;  // the prefill of every prompt at once
    limits.max_seqs = kMaxSeqs;
    limits.max_blocks = num_blocks + kMaxSeqs;
    attention = make_paged_attention_backend(*pool, c.num_attention_heads, model.attention_scale(),
                                             limits, sparse, tuning);
    scratch = pool->allocate(1)[0];
    if (fp8) return;
    std::vector<uint16_t> fill(pool->k(0).numel(), kFill);
    Tensor host = Tensor::from_blob(fill.data(), pool->k(0).shape(), pool->k(0).dtype());
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      Tensor k = pool->k(l), v = pool->v(l);  // handles of the pool's memory
      k.copy_from(host);
      v.copy_from(host);
    }
  }
};

struct Seq {
  std::vector<int32_t> tokens;  // all so far
  std::vector<int32_t> blocks;
  int64_t cached = 0;  // tokens whose K/V are in the pool
};

// The batch of `seqs[idx]` running their tokens [cached, size), allocating blocks from `pool`.
inline ForwardBatch make_batch(std::vector<Seq>& seqs, const std::vector<size_t>& idx,
                               PagedKVPool& pool, bool all_logits_last = true) {
  ForwardBatch b;
  b.block_table_indptr.push_back(0);
  const int64_t bs = pool.block_size();
  for (size_t i : idx) {
    Seq& s = seqs[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size()) - s.cached;
    const int64_t need = (s.cached + n + bs - 1) / bs;
    if (need > static_cast<int64_t>(s.blocks.size())) {
      auto more = pool.allocate(need - static_cast<int64_t>(s.blocks.size()));
      s.blocks.insert(s.blocks.end(), more.begin(), more.end());
    }
    b.add_sequence(100 + i, s.tokens.data() + s.cached, n, s.cached, all_logits_last);
    b.block_tables.insert(b.block_tables.end(), s.blocks.begin(), s.blocks.begin() + need);
    b.block_table_indptr.push_back(static_cast<int32_t>(b.block_tables.size()));
    for (int64_t j = s.cached; j < s.cached + n; ++j)
      b.slot_mapping.push_back(int64_t(s.blocks[j / bs]) * bs + j % bs);
  }
  return b;
}

// Sequences of random prompts of the given lengths (ids below `vocab`, drawn from `rng`, which the
// caller goes on drawing from). With `block_size` > 0 each also gets fixed blocks, numbered from
// 0 across the sequences, for its prompt and `steps` more tokens (the offload rigs' host blocks).
inline std::vector<Seq> random_seqs(const std::vector<int64_t>& lens, int32_t vocab,
                                    std::mt19937& rng, int64_t block_size = 0, int steps = 0) {
  std::vector<Seq> seqs(lens.size());
  int32_t next_block = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int64_t j = 0; j < lens[i]; ++j) seqs[i].tokens.push_back(int32_t(rng() % vocab));
    if (block_size > 0)
      for (int64_t b = 0; b < (lens[i] + steps + block_size - 1) / block_size; ++b)
        seqs[i].blocks.push_back(next_block++);
  }
  return seqs;
}

// The blocks `seqs` hold, counted as random_seqs numbers them.
inline int64_t blocks_held(const std::vector<Seq>& seqs) {
  int64_t n = 0;
  for (const Seq& s : seqs) n += static_cast<int64_t>(s.blocks.size());
  return n;
}

inline void advance(std::vector<Seq>& seqs, const std::vector<size_t>& idx) {
  for (size_t i : idx) seqs[i].cached = static_cast<int64_t>(seqs[i].tokens.size());
}

inline Tensor to_host(const Tensor& t) { return t.contiguous().to(Device::cpu()); }

inline bool rows_bit_equal(const Tensor& a, const Tensor& b, int64_t rows) {
  return std::memcmp(a.data_ptr(), b.data_ptr(), rows * a.size(1) * sizeof(float)) == 0;
}

inline double rows_max_diff(const Tensor& a, const Tensor& b, int64_t rows, double* max_abs) {
  double d = 0;
  *max_abs = 0;
  for (int64_t i = 0; i < rows * a.size(1); ++i) {
    const float x = a.data<float>()[i], y = b.data<float>()[i];
    EXPECT_TRUE(std::isfinite(x) && std::isfinite(y)) << "element " << i;
    d = std::max<double>(d, std::fabs(x - y));
    *max_abs = std::max<double>(*max_abs, std::fabs(y));
  }
  return d;
}

inline std::shared_ptr<Model> load_model(const std::string& name) {
  ModelBuildOptions o;
  o.device = Device::cuda(0);
  std::shared_ptr<const Checkpoint> ck;
  if (name == "qwen3-dummy") {
    ModelConfig c = dummy_preset_config("qwen3-0.6b");
    c.num_hidden_layers = 4;
    ck = std::make_shared<const Checkpoint>(make_dummy_checkpoint(c, 3));
  } else if (name == "needle") {
    ck = std::make_shared<const Checkpoint>(load_checkpoint(longctx::testing::needle_v1_dir()));
  } else {
    ck = std::make_shared<const Checkpoint>(load_checkpoint(test_data_dir() + "/fixtures/" + name));
  }
  return create_model(ck, o);
}

inline int64_t argmax_row(const Tensor& logits, int64_t row) {
  const float* x = logits.data<float>() + row * logits.size(1);
  return std::max_element(x, x + logits.size(1)) - x;
}

// Quest of the graph tests: pages of 16, a 256-token budget (sink 16, window 32), so that prompts
// of 250-1000 tokens select.
inline SparseOptions graph_test_quest() {
  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.page_tokens = 16;
  quest.budget_tokens = 256;
  quest.sink_tokens = 16;
  quest.window_tokens = 32;
  return quest;
}

inline std::unique_ptr<OffloadAttentionBackend> quest_offload(const Model& model,
                                                              const SparseOptions& quest,
                                                              int64_t host_blocks, bool fp8) {
  const ModelConfig& c = model.config();
  OffloadDeviceConfig d;
  d.geometry = {c.num_hidden_layers, 128, host_blocks, /*gpu blocks=*/8, /*slots=*/2,
                /*slot blocks=*/4};
  d.num_qo_heads = c.num_attention_heads;
  d.num_kv_heads = c.num_key_value_heads;
  d.head_dim = c.head_dim;
  d.dtype = model.activation_dtype();
  if (fp8) d.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  d.sm_scale = model.attention_scale();
  d.device = model.device();
  d.max_tokens = 512;
  d.max_seqs = kMaxSeqs;
  d.sparse = quest;
  d.max_model_len = host_blocks * 128;
  auto be = std::make_unique<OffloadAttentionBackend>(d.geometry, make_cuda_offload_device(d));
  be->set_layer_block_bytes(d.layer_block_bytes());
  return be;
}

// The batch of `seqs[idx]` running their tokens [cached, size) over their fixed host blocks.
inline ForwardBatch host_batch(const std::vector<Seq>& seqs, const std::vector<size_t>& idx,
                               int64_t bs) {
  ForwardBatch b;
  b.block_table_indptr.push_back(0);
  for (size_t i : idx) {
    const Seq& s = seqs[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size()) - s.cached;
    const int64_t need = (s.cached + n + bs - 1) / bs;
    b.add_sequence(100 + i, s.tokens.data() + s.cached, n, s.cached, true);
    b.block_tables.insert(b.block_tables.end(), s.blocks.begin(), s.blocks.begin() + need);
    b.block_table_indptr.push_back(static_cast<int32_t>(b.block_tables.size()));
    for (int64_t j = s.cached; j < s.cached + n; ++j)
      b.slot_mapping.push_back(int64_t(s.blocks[j / bs]) * bs + j % bs);
  }
  return b;
}

// Prefills `seqs` one sequence at a time in chunks of `chunk` tokens through `be` over their
// fixed host blocks (an offload rig's GPU cache holds one chunk's blocks, not a whole prompt's).
inline void prefill_host_chunks(Model& model, AttentionBackend& be, std::vector<Seq>& seqs,
                                int64_t bs, int64_t chunk = 512) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<int32_t> all = seqs[i].tokens;
    const int64_t len = static_cast<int64_t>(all.size());
    seqs[i].tokens.clear();
    for (int64_t done = 0; done < len;) {
      const int64_t n = std::min<int64_t>(chunk, len - done);
      seqs[i].tokens.insert(seqs[i].tokens.end(), all.begin() + done, all.begin() + done + n);
      model.forward(host_batch(seqs, {i}, bs), be);
      seqs[i].cached = done += n;
    }
  }
}

}  // namespace longctx::testing
