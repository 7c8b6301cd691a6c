// Qwen3-MoE and Qwen2-MoE (shared expert) on the CPU reference, from tiny random checkpoints
// written here: either expert spelling and sharded files load the same model, malformed expert
// tensors are errors naming the tensor, a batch of sequences equals each alone, the config's
// dense/sparse layer rule, and the tensor-parallel expert slicing (plan and simulated ranks).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "attention/backends/cpu_backend.h"
#include "common/moe_checkpoint.h"
#include "longctx/core/communicator.h"
#include "longctx/core/error.h"
#include "longctx/engine/reference_forward.h"
#include "models/model_test_util.h"
#include "models/tensor_parallel.h"

namespace longctx::testing {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path p =
      fs::path(::testing::TempDir()) / ("longctx_moe_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class MoeModel : public ::testing::TestWithParam<bool> {  // param: the shared-expert variant
 protected:
  void SetUp() override {
    config_ = tiny_moe_config_json(GetParam());
    weights_ = tiny_moe_weights(parse_model_config(config_, "tiny-moe"), 45);
    dir_ = temp_dir(GetParam() ? "qwen2" : "qwen3");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<Model> load(const fs::path& d) {
    return create_model(std::make_shared<Checkpoint>(load_checkpoint(d.string())), {});
  }
  nlohmann::json config_;
  std::map<std::string, Tensor> weights_;
  fs::path dir_;
};

TEST_P(MoeModel, EitherExpertSpellingAndShardedFilesLoadTheSameModel) {
  write_checkpoint_dir(dir_ / "fused", config_, weights_, 1);
  write_checkpoint_dir(dir_ / "per_expert", config_, per_expert_weights(weights_), 3);
  auto fused = load(dir_ / "fused");
  auto per_expert = load(dir_ / "per_expert");
  EXPECT_EQ(fused->config().is_moe_layer(1), GetParam());  // Qwen3's layer 1 is dense
  EXPECT_TRUE(fused->config().is_moe_layer(0));
  const auto ids = make_ids(41, 3, 320);
  Tensor a = full_forward(*fused, ids), b = full_forward(*per_expert, ids);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(max_abs_diff(a.data<float>(), b.data<float>(), a.numel()), 0.0);
  // The experts matter: the same weights with the router of layer 0 changed give other logits.
  auto w = weights_;
  Tensor r = w.at("model.layers.0.mlp.gate.weight").contiguous();
  for (int64_t i = 0; i < r.numel(); ++i) r.data<float>()[i] = -r.data<float>()[i];
  w["model.layers.0.mlp.gate.weight"] = r;
  write_checkpoint_dir(dir_ / "other", config_, w, 1);
  Tensor c = full_forward(*load(dir_ / "other"), ids);
  EXPECT_GT(max_abs_diff(a.data<float>(), c.data<float>(), a.numel()), 1e-3);
}

TEST_P(MoeModel, MalformedExpertTensorsAreNamed) {
  auto per = per_expert_weights(weights_);
  per["model.layers.2.mlp.experts.5.up_proj.weight"] = Tensor::zeros({24, 47}, DType::kF32);
  write_checkpoint_dir(dir_ / "bad_shape", config_, per, 2);
  std::string e = error_of([&] { load(dir_ / "bad_shape"); });
  EXPECT_NE(e.find("model.layers.2.mlp.experts.5.up_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[24, 47]"), std::string::npos) << e;

  per = per_expert_weights(weights_);
  per.erase("model.layers.0.mlp.experts.7.down_proj.weight");
  write_checkpoint_dir(dir_ / "missing", config_, per, 1);
  e = error_of([&] { load(dir_ / "missing"); });
  EXPECT_NE(e.find("model.layers.0.mlp.experts.7.down_proj.weight"), std::string::npos) << e;

  auto fused = weights_;
  fused["model.layers.0.mlp.experts.gate_up_proj"] = Tensor::zeros({8, 24, 48}, DType::kF32);
  write_checkpoint_dir(dir_ / "bad_fused", config_, fused, 1);
  e = error_of([&] { load(dir_ / "bad_fused"); });
  EXPECT_NE(e.find("model.layers.0.mlp.experts.gate_up_proj"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 48, 48]"), std::string::npos) << e;  // what the config implies
}

TEST_P(MoeModel, BatchEqualsEachSequenceAlone) {
  write_checkpoint_dir(dir_, config_, weights_, 1);
  auto model = load(dir_);
  const int64_t vocab = model->config().vocab_size;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{0, 37}, {20, 1}, {64, 30}, {0, 1}};
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::unique_ptr<KVCache>> caches, alone;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto [cached, n] = shapes[s];
    ids.push_back(make_ids(cached + n, s, vocab));
    caches.push_back(std::make_unique<KVCache>(model->config(), cached + n));
    alone.push_back(std::make_unique<KVCache>(model->config(), cached + n));
    if (cached > 0) {
      std::span<const int32_t> prefix(ids[s].data(), cached);
      reference_forward(*model, prefix, iota_positions(0, cached), *caches[s]);
      reference_forward(*model, prefix, iota_positions(0, cached), *alone[s]);
    }
  }
  ForwardBatch batch;
  std::vector<KVCache*> ptrs;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto [cached, n] = shapes[s];
    batch.add_sequence(s, ids[s].data() + cached, n, cached, /*want_logits=*/true);
    ptrs.push_back(caches[s].get());
  }
  CpuAttentionBackend attention(ptrs, model->attention_scale());
  Tensor together = model->forward(batch, attention);
  attention.commit();
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto [cached, n] = shapes[s];
    std::span<const int32_t> news(ids[s].data() + cached, n);
    Tensor a = reference_forward(*model, news, iota_positions(cached, n), *alone[s], true);
    // Routing is per token, so the rows are the same sums in the same order: bit-equal.
    EXPECT_EQ(max_abs_diff(a.data<float>(), together.data<float>() + s * vocab, vocab), 0.0)
        << "sequence " << s;
  }
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return max_abs_diff(a.data<float>(), b.data<float>(), a.numel());
}

TEST_P(MoeModel, SimulatedTensorParallelRanksEqualTheUnshardedModel) {
  // Ranks slice the per-expert tensors (2 ranks) and the fused ones (4 ranks).
  write_checkpoint_dir(dir_ / "per_expert", config_, per_expert_weights(weights_), 2);
  write_checkpoint_dir(dir_ / "fused", config_, weights_, 1);
  const auto ids = make_ids(33, 1, 320);
  Tensor want;
  for (int size : {2, 4}) {
    auto ck = std::make_shared<const Checkpoint>(
        load_checkpoint((dir_ / (size == 2 ? "per_expert" : "fused")).string()));
    if (!want.defined()) want = full_forward(*create_model(ck, {}), ids);
    auto comms = make_thread_communicators(size);
    std::vector<Tensor> got(size);
    std::vector<std::string> errors(size);
    std::vector<std::thread> ranks;
    for (int r = 0; r < size; ++r)
      ranks.emplace_back([&, r] {
        try {
          ModelBuildOptions o;
          o.communicator = comms[r];
          auto m = create_model(ck, o);
          EXPECT_EQ(m->config().moe.moe_intermediate_size, 24 / size);
          got[r] = full_forward(*m, ids);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < size; ++r) ASSERT_EQ(errors[r], "") << size << " ranks, rank " << r;
    // fp32; slicing reorders the down-projection sums only.
    EXPECT_LE(max_diff(want, got[0]), 1e-4) << size << " ranks";
    for (int r = 1; r < size; ++r) EXPECT_EQ(max_diff(got[0], got[r]), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, MoeModel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Qwen2Moe" : "Qwen3Moe"; });

TEST(MoeConfig, SparseLayersFollowStepAndMlpOnlyLayers) {
  nlohmann::json j = tiny_moe_config_json(false);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const ModelConfig c = parse_model_config(j, "cfg");
  std::vector<bool> sparse;
  for (int64_t i = 0; i < 6; ++i) sparse.push_back(c.is_moe_layer(i));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_TRUE(c.qk_norm);
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(error_of([&] { parse_model_config(j, "cfg"); }).find("num_experts_per_tok"),
            std::string::npos);
  j["num_experts_per_tok"] = 2;
  j["mlp_only_layers"] = {6};
  EXPECT_NE(error_of([&] { parse_model_config(j, "cfg"); }).find("mlp_only_layers"),
            std::string::npos);
  // transformers' newest Qwen3MoeConfig may write Mixtral's name for the expert count, and its
  // class defaults (here norm_topk_prob false) hold for fields a file leaves out.
  j["mlp_only_layers"] = {1};
  j.erase("num_experts");
  j.erase("norm_topk_prob");
  j["num_local_experts"] = 16;
  const ModelConfig local = parse_model_config(j, "cfg");
  EXPECT_EQ(local.moe.num_experts, 16);
  EXPECT_FALSE(local.moe.norm_topk_prob);
  nlohmann::json q2 = tiny_moe_config_json(true);
  const ModelConfig c2 = parse_model_config(q2, "cfg");
  EXPECT_TRUE(c2.attention_bias);
  EXPECT_FALSE(c2.o_proj_bias);
  EXPECT_FALSE(c2.moe.norm_topk_prob);
  EXPECT_EQ(c2.moe.shared_expert_intermediate_size, 40);
}

TEST(MoeTensorParallel, ExpertSlicesCoverEveryColumnOnceAtRealShapes) {
  for (const char* preset : {"qwen3-30b-a3b", "qwen3-235b-a22b"}) {
    const ModelConfig c = dummy_preset_config(preset);
    ASSERT_EQ(c.moe.num_experts, 128) << preset;
    for (int size : {1, 2, 4, 8}) {
      int64_t col = 0;
      for (int r = 0; r < size; ++r) {
        const models::TpShard s = models::tp_shard(c, r, size);
        EXPECT_EQ(s.moe_inter0, col);
        col += s.moe_inter;
        const ModelConfig local = models::tp_local_config(c, s);
        EXPECT_EQ(local.moe.num_experts, c.moe.num_experts);  // every rank routes to all
        EXPECT_EQ(local.moe.moe_intermediate_size, s.moe_inter);
      }
      EXPECT_EQ(col, c.moe.moe_intermediate_size) << preset << " " << size;
    }
  }
  ModelConfig odd = dummy_preset_config("qwen3-30b-a3b");
  odd.moe.moe_intermediate_size = 770;
  EXPECT_NE(error_of([&] { models::tp_shard(odd, 0, 4); }).find("moe_intermediate_size 770"),
            std::string::npos);
}

}  // namespace
}  // namespace longctx::testing
