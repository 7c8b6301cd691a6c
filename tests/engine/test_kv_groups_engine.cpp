// A CPU model of two KV groups (full + sliding window) through the engine: continuous batching
// with chunked prefill, prefix caching and preemption forced by a small pool, checked against
// its dense reference (the one-sequence forward over a contiguous cache with the window mask,
// every token computed): greedy tokens equal and logits within 1e-4; the sliding group holds
// fewer blocks than the full one. The same for tiny-qwen3-next (linear-attention states in slots).
// And the memory plan of a sliding and a linear-attention model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/engine/reference_forward.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

using LA = LayerAttention;
constexpr int64_t kWindow = 20;
constexpr int64_t kBlockSize = 8;

// tiny-llama3's shapes, 4 layers: sliding, full, sliding, full (window 20), random weights.
std::shared_ptr<Model> two_group_model(bool sliding = true) {
  ModelConfig c = load_model_config(testing::test_data_dir() + "/fixtures/tiny-llama3/config.json");
  c.architecture = "MistralForCausalLM";
  c.num_hidden_layers = 4;
  c.dtype = DType::kF32;
  c.layer_types = sliding ? std::vector<LA>{LA::kSliding, LA::kFull, LA::kSliding, LA::kFull}
                          : std::vector<LA>(4, LA::kFull);
  c.sliding_window = sliding ? kWindow : 0;
  auto ck = std::make_shared<const Checkpoint>(make_dummy_checkpoint(c, 11));
  return create_model(ck);
}

// Logits [n - 1, vocab] of the dense reference at positions 0 .. n - 2 of `tokens`.
Tensor reference_logits(Model& model, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()) - 1;
  auto cache = std::make_unique<KVCache>(model.config(), n);
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = i;
  return reference_forward(model, std::span<const int32_t>(tokens.data(), n), pos, *cache, false);
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// A tiny Gemma 3 (transformers' config fields; Gemma3TextConfig's defaults under them): six
// layers in its pattern (five sliding, window 20, then one global), each kind with its rope,
// (1 + w) norms before and after attention and MLP, GeGLU, scaled embeddings, random weights.
std::shared_ptr<Model> tiny_gemma3() {
  const nlohmann::json j = {{"architectures", {"Gemma3ForCausalLM"}},
                            {"vocab_size", 512},
                            {"hidden_size", 64},
                            {"intermediate_size", 128},
                            {"num_hidden_layers", 6},
                            {"num_attention_heads", 2},
                            {"num_key_value_heads", 1},
                            {"head_dim", 32},
                            {"query_pre_attn_scalar", 24},
                            {"sliding_window", kWindow},
                            {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
                            {"dtype", "float32"}};
  const ModelConfig c = parse_model_config(j, "tiny gemma3");
  auto ck = std::make_shared<const Checkpoint>(make_dummy_checkpoint(c, 12));
  return create_model(ck);
}

// The engine (chunked prefill, batching, prefix hits, copy-on-write, preemption) against the
// model's dense reference, row by row.
// A state model (linear attention) takes its prefix hits from state snapshots at block boundaries
// (tests/engine/test_state_prefix_cache.cpp) and its logits may move by `tol` (the chunked delta
// rule's rounding, see tests/models/test_fixture_models.cpp).
// `num_blocks` small enough for preemptions (a state model's blocks hold only its full layers).
void check_engine_matches_reference(const std::shared_ptr<Model>& model, float tol = 1e-4f,
                                    int64_t num_blocks = 36) {
  const KvGroups groups = KvGroups::from_config(model->config(), DType::kF32);
  ASSERT_GE(groups.size(), 2);
  const auto num_groups = static_cast<size_t>(groups.size());
  CpuExecutorOptions eo;
  eo.block_size = kBlockSize;
  eo.num_blocks = num_blocks;  // two or three sequences at a time: preemption
  auto rec = std::make_unique<testing::RecordingExecutor>(make_cpu_executor(model, eo));
  testing::RecordingExecutor* recorder = rec.get();
  EngineCore core(std::move(rec), nullptr, testing::core_options(24, 4));
  const int64_t vocab = model->config().vocab_size;

  // Prompts sharing a 40-token prefix (prefix hits), one repeated whole (a copy-on-write), and
  // lengths past the window and the chunk.
  std::mt19937 rng(3);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  };
  const std::vector<int32_t> prefix = random_tokens(40);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t tail : {9, 23, 0, 31}) {
    auto p = prefix;
    auto t = random_tokens(tail);
    p.insert(p.end(), t.begin(), t.end());
    prompts.push_back(p);
  }
  prompts.push_back(prompts[0]);
  prompts.push_back(random_tokens(57));
  prompts.push_back(random_tokens(5));
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i)
    ids.push_back(core.add_request(i, prompts[i], testing::greedy(14), 0));

  std::vector<int64_t> most(num_groups, 0);
  while (core.has_unfinished()) {
    core.step();
    core.check_consistency();
    const EngineStats st = core.stats();
    ASSERT_EQ(st.kv_group_blocks_used.size(), num_groups);
    for (size_t g = 0; g < num_groups; ++g) most[g] = std::max(most[g], st.kv_group_blocks_used[g]);
  }
  const EngineStats st = core.stats();
  const bool state = groups[1].kind == KvGroupKind::kState;
  EXPECT_GT(st.num_preemptions, 0);
  EXPECT_GT(st.prefix_cache_hits, 0);
  if (state) EXPECT_GT(st.state_snapshot_restores, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.kv_group_blocks_used[1], 0);  // every block (or state slot) freed
  // Group 0 is the full group, the others sliding ones (they keep only their window) or the
  // state group (one slot per running sequence).
  for (size_t g = 1; g < num_groups; ++g) {
    if (!state) EXPECT_EQ(groups[g].kind, KvGroupKind::kSlidingWindow);
    EXPECT_LT(most[g], most[0]) << g;
  }
  if (state) EXPECT_LE(most[1], 4);

  std::vector<RequestOutput> outs = core.take_finished();
  ASSERT_EQ(outs.size(), prompts.size());
  int64_t rows_checked = 0;
  for (const RequestOutput& o : outs) {
    ASSERT_EQ(o.token_ids.size(), 14u);
    std::vector<int32_t> all = o.prompt_token_ids;
    all.insert(all.end(), o.token_ids.begin(), o.token_ids.end());
    const Tensor ref = reference_logits(*model, all);
    const int64_t p0 = static_cast<int64_t>(o.prompt_token_ids.size()) - 1;
    for (int64_t p = p0; p + 1 < static_cast<int64_t>(all.size()); ++p) {
      const float* r = ref.data<float>() + p * vocab;
      EXPECT_EQ(argmax(r, vocab), all[p + 1]) << "request " << o.index << " position " << p;
      auto it = recorder->rows.find({ids[o.index], p});
      ASSERT_NE(it, recorder->rows.end()) << "request " << o.index << " position " << p;
      for (const std::vector<float>& row : it->second) {  // each time it ran (preemptions)
        float diff = 0;
        for (int64_t v = 0; v < vocab; ++v) diff = std::max(diff, std::abs(row[v] - r[v]));
        EXPECT_LT(diff, tol) << "request " << o.index << " position " << p;
        ++rows_checked;
      }
    }
  }
  EXPECT_GE(rows_checked, static_cast<int64_t>(prompts.size()) * 14);
}

TEST(KvGroupsEngine, TwoGroupModelMatchesItsDenseReference) {
  std::shared_ptr<Model> model = two_group_model();
  check_engine_matches_reference(model);
  const int64_t vocab = model->config().vocab_size;
  std::vector<int32_t> all(70);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>((i * 37 + 5) % 1000);

  // The window matters: all-full attention gives other logits past it.
  std::shared_ptr<Model> full = two_group_model(false);
  const Tensor a = reference_logits(*model, all), b = reference_logits(*full, all);
  float diff = 0;
  for (int64_t i = (kWindow + 5) * vocab; i < a.numel(); ++i)
    diff = std::max(diff, std::abs(a.data<float>()[i] - b.data<float>()[i]));
  EXPECT_GT(diff, 1e-3f);
}

TEST(KvGroupsEngine, Gemma3MatchesItsDenseReference) {
  // Six KV groups of one layer each (the global layer, five local ones): blocks of one layer.
  check_engine_matches_reference(tiny_gemma3(), 1e-4f, 50);
}

// tiny-qwen3-next (three linear-attention layers, one full): each sequence's Gated DeltaNet
// states in a state slot, continued across its prefill chunks and decode steps, batched with
// sequences at other positions, freed and restarted on preemption (from zero, or from a prefix
// hit's snapshot).
TEST(KvGroupsEngine, Qwen3NextMatchesItsReference) {
  auto ck = std::make_shared<const Checkpoint>(
      load_checkpoint(testing::test_data_dir() + "/fixtures/tiny-qwen3-next"));
  std::shared_ptr<Model> model = create_model(ck);
  ASSERT_EQ(KvGroups::from_config(model->config(), DType::kF32)[1].kind, KvGroupKind::kState);
  check_engine_matches_reference(model, 2e-3f, 20);
}

// tiny-qwen3.5 (Qwen3_5ForCausalLM: tiny-qwen3-next's layers, the projections stored apart, a
// dense MLP on every layer) and tiny-qwen3.5-vl (the same text model in the multimodal wrapper),
// the same way through the engine.
TEST(KvGroupsEngine, Qwen3_5MatchesItsReference) {
  for (const char* name : {"tiny-qwen3.5", "tiny-qwen3.5-vl"}) {
    SCOPED_TRACE(name);
    auto ck = std::make_shared<const Checkpoint>(
        load_checkpoint(testing::test_data_dir() + "/fixtures/" + name));
    std::shared_ptr<Model> model = create_model(ck);
    ASSERT_EQ(KvGroups::from_config(model->config(), DType::kF32)[1].kind, KvGroupKind::kState);
    check_engine_matches_reference(model, 2e-3f, 20);
  }
}

TEST(KvGroupsEngine, MemoryPlanCountsEachGroup) {
  ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  const GpuMemoryPlan full = plan_gpu_memory(c, o, 120ll << 30);
  ASSERT_EQ(full.kv_groups.size(), 1u);
  EXPECT_EQ(full.kv_state_bytes, 0);
  // Gemma 3's 5 local : 1 global on 32 layers (5 global): the 27 local layers are cut into
  // groups of 5 (5, 5, 5, 5, 5, 2), so a block holds 5 layers, as many as the global group's.
  c.layer_types.assign(32, LA::kSliding);
  for (int64_t l = 5; l < 32; l += 6) c.layer_types[l] = LA::kFull;
  c.sliding_window = 1024;
  const GpuMemoryPlan gemma = plan_gpu_memory(c, o, 120ll << 30);
  ASSERT_EQ(gemma.kv_groups.size(), 7u);
  EXPECT_EQ(gemma.kv_block_bytes, full.kv_block_bytes / 32 * 5);
  EXPECT_NE(gemma.kv_groups[1].find("sliding_window (window 1024), 5 layers (0-4)"),
            std::string::npos)
      << gemma.kv_groups[1];
  EXPECT_NE(gemma.kv_groups[6].find("2 layers (30-31)"), std::string::npos) << gemma.kv_groups[6];
  // Qwen3-Next's 3 linear : 1 full: states of max_num_seqs sequences and the prefix cache's
  // snapshots of them come off the budget, in fp32 (as the kernels keep them) whatever the KV
  // cache's dtype.
  c.layer_types.assign(32, LA::kLinear);
  for (int64_t l = 3; l < 32; l += 4) c.layer_types[l] = LA::kFull;
  c.sliding_window = 0;
  c.linear = {16, 32, 128, 128, 4};
  const int64_t state = 24 * ((32 * 128 * 128) + 3 * (2 * 16 * 128 + 32 * 128)) * 4;
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    const KvGroups g = KvGroups::from_config(c, kv);
    EXPECT_EQ(g.state_bytes_per_seq(), state);
    EXPECT_EQ(g[1].dtype, DType::kF32);
  }
  const GpuMemoryPlan next = plan_gpu_memory(c, o, 120ll << 30);
  // (With decode graphs, the default, one more: their padding sequences' scratch slot.)
  ASSERT_FALSE(o.enforce_eager);
  EXPECT_EQ(next.kv_state_bytes, (o.max_num_seqs + 1) * state);
  GpuRunnerOptions eager = o;
  eager.enforce_eager = true;
  EXPECT_EQ(plan_gpu_memory(c, eager, 120ll << 30).kv_state_bytes, o.max_num_seqs * state);
  EXPECT_EQ(next.num_state_snapshots, kDefaultStateSnapshots);
  EXPECT_EQ(next.kv_snapshot_bytes, kDefaultStateSnapshots * state);
  EXPECT_EQ(next.kv_block_bytes, full.kv_block_bytes / 32 * 8);
  EXPECT_NE(next.str().find("state snapshots"), std::string::npos) << next.str();
  // The KV pool gets what states and snapshots leave: without snapshots it has their bytes in
  // blocks more (up to the rounding of a block; the plan's other terms do not depend on them).
  GpuRunnerOptions fewer = o;
  fewer.max_state_snapshots = 0;
  const GpuMemoryPlan none = plan_gpu_memory(c, fewer, 120ll << 30);
  EXPECT_EQ(none.kv_snapshot_bytes, 0);
  EXPECT_EQ(none.kv_state_bytes, next.kv_state_bytes);
  const int64_t more = none.num_kv_blocks - next.num_kv_blocks;
  EXPECT_GE(more, next.kv_snapshot_bytes / next.kv_block_bytes);
  EXPECT_LE(more, next.kv_snapshot_bytes / next.kv_block_bytes + 1);
  // A dense model's plan has neither.
  EXPECT_EQ(full.kv_snapshot_bytes, 0);
  EXPECT_EQ(full.num_state_snapshots, 0);
}

}  // namespace
}  // namespace longctx
