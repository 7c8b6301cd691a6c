// Tensor parallelism on the CPU reference: the shard plan of every weight (which heads, MLP
// columns and vocabulary rows each rank reads) over real shapes and rank counts, and sharded
// forwards (ranks as threads, thread communicators) that equal the unsharded model on the
// transformers fixtures (Llama-3 with GQA, Qwen2 with q/k/v biases, Qwen3 with q/k norms and tied
// embeddings), for prefill and a decode step after it, with KV heads split (2 ranks) and
// replicated (4 ranks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "longctx/core/communicator.h"
#include "longctx/core/error.h"
#include "longctx/engine/reference_forward.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "models/model_test_util.h"
#include "models/tensor_parallel.h"

namespace longctx::testing {
namespace {

using models::tp_shard;
using models::TpShard;

TEST(TensorParallel, ShardPlansCoverEveryHeadColumnAndRowOnce) {
  std::vector<ModelConfig> configs;
  for (const char* p : {"llama-3.1-8b", "qwen3-8b", "qwen3-0.6b", "qwen2-7b", "tiny-llama"})
    configs.push_back(dummy_preset_config(p));
  ModelConfig odd = dummy_preset_config("tiny-llama");
  odd.vocab_size = 1001;  // rows do not split evenly: the last rank holds fewer
  configs.push_back(odd);
  int plans = 0;
  for (const ModelConfig& c : configs) {
    for (int size : {1, 2, 4, 8}) {
      const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
      if (hq % size || (hkv % size && size % hkv) || c.intermediate_size % size) {
        EXPECT_THROW(tp_shard(c, 0, size), Error) << hq << " heads, " << size << " ranks";
        continue;
      }
      std::vector<int> q_owner(hq, 0), kv_readers(hkv, 0);
      int64_t inter = 0, vocab = 0;
      for (int r = 0; r < size; ++r) {
        const TpShard s = tp_shard(c, r, size);
        for (int64_t h = s.q_head0; h < s.q_head0 + s.num_q_heads; ++h) {
          ++q_owner[h];
          const int64_t kv = h / (hq / hkv);  // the KV head this q head reads in the model
          EXPECT_TRUE(kv >= s.kv_head0 && kv < s.kv_head0 + s.num_kv_heads)
              << "rank " << r << " q head " << h;
          // Within the rank, q head h reads local KV head (h - q_head0) / local group.
          EXPECT_EQ(s.kv_head0 + (h - s.q_head0) / (s.num_q_heads / s.num_kv_heads), kv);
        }
        for (int64_t k = s.kv_head0; k < s.kv_head0 + s.num_kv_heads; ++k) ++kv_readers[k];
        EXPECT_EQ(s.inter0, inter);
        inter += s.inter;
        EXPECT_EQ(s.vocab0, vocab);
        vocab += s.vocab;
        const ModelConfig local = models::tp_local_config(c, s);
        EXPECT_EQ(local.num_attention_heads % local.num_key_value_heads, 0);
        EXPECT_EQ(local.vocab_size, c.vocab_size);
        EXPECT_EQ(local.head_dim, c.head_dim);
      }
      for (int n : q_owner) EXPECT_EQ(n, 1);
      for (int n : kv_readers) EXPECT_EQ(n, hkv >= size ? 1 : size / hkv);
      EXPECT_EQ(inter, c.intermediate_size);
      EXPECT_EQ(vocab, c.vocab_size);
      ++plans;
    }
  }
  EXPECT_GT(plans, 15);
  EXPECT_THROW(tp_shard(configs[0], 2, 2), Error);
}

std::vector<int32_t> prompt(int64_t n) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % 1000);
  return ids;
}

struct Logits {
  Tensor prefill, decode;  // [n, vocab], [1, vocab]
};

// Prefill of `ids`, then one decode step of token 5, through the cache of `model`.
Logits run(Model& model, const std::vector<int32_t>& ids) {
  std::vector<int64_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
  auto cache = std::make_unique<KVCache>(model.config(), static_cast<int64_t>(ids.size()) + 1);
  Logits l;
  l.prefill = reference_forward(model, ids, pos, *cache);
  const int32_t next = 5;
  const int64_t p = static_cast<int64_t>(ids.size());
  l.decode = reference_forward(model, std::span<const int32_t>(&next, 1),
                               std::span<const int64_t>(&p, 1), *cache);
  return l;
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

TEST(TensorParallel, SimulatedRanksEqualTheUnshardedModel) {
  const auto ids = prompt(61);
  for (const std::string name : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    auto ck = std::make_shared<const Checkpoint>(load_checkpoint(fixture_dir(name)));
    ModelBuildOptions o;
    o.rope_inv_freq_dtype = ck->config.dtype;
    auto whole = create_model(ck, o);
    const Logits want = run(*whole, ids);
    for (int size : {1, 2, 4}) {
      auto comms = make_thread_communicators(size);
      std::vector<Logits> got(size);
      std::vector<std::string> errors(size);
      std::vector<std::thread> ranks;
      for (int r = 0; r < size; ++r) {
        ranks.emplace_back([&, r] {
          try {
            ModelBuildOptions ro = o;
            ro.communicator = comms[r];
            auto m = create_model(ck, ro);
            EXPECT_EQ(m->config().num_attention_heads, ck->config.num_attention_heads / size);
            got[r] = run(*m, ids);
          } catch (const std::exception& e) {
            errors[r] = e.what();
          }
        });
      }
      for (auto& t : ranks) t.join();
      for (int r = 0; r < size; ++r) ASSERT_EQ(errors[r], "") << name << " rank " << r;
      const double dp = max_diff(want.prefill, got[0].prefill);
      const double dd = max_diff(want.decode, got[0].decode);
      std::printf("%s, %d ranks: |dlogit| max %.2e prefill, %.2e decode\n", name.c_str(), size, dp,
                  dd);
      // fp32 throughout; sharding only reorders the sums of o_proj / down_proj / embedding (one
      // rank: the same sums, so the same bits).
      EXPECT_LE(dp, size == 1 ? 0.0 : 1e-4) << name << " " << size;
      EXPECT_LE(dd, size == 1 ? 0.0 : 1e-4) << name << " " << size;
      for (int r = 1; r < size; ++r) {  // every rank holds the same logits, bit for bit
        EXPECT_EQ(std::memcmp(got[r].prefill.data_ptr(), got[0].prefill.data_ptr(),
                              got[0].prefill.numel() * sizeof(float)),
                  0);
        EXPECT_EQ(std::memcmp(got[r].decode.data_ptr(), got[0].decode.data_ptr(),
                              got[0].decode.numel() * sizeof(float)),
                  0);
      }
    }
  }
}

TEST(TensorParallel, ShapesThatDoNotSplitAreClearErrors) {
  auto ck = std::make_shared<const Checkpoint>(load_checkpoint(fixture_dir("tiny-qwen3")));
  ModelBuildOptions o;
  o.communicator = make_thread_communicators(8)[3];  // 4 heads over 8 ranks
  try {
    create_model(ck, o);
    FAIL() << "4 heads over 8 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("4 attention heads do not split evenly"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace longctx::testing
