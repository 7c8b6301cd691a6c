// Sliding-window models on the GPU engine (head_dim 64: the planned split-KV decode and paged
// prefill kernels with a window, over block tables trimmed to the window; head_dim 256, Gemma 3's:
// the mma.sync prefill and the generic decode) against the CPU engine on the same random
// checkpoint (written here, f32 on disk):
//   - Mistral (one sliding group, window 40) and Gemma 3 (two sliding layers of window 40 to one
//     global layer: two KV groups sharing the paged pool), the latter at head_dim 64 and 256;
//   - prompts shorter and far longer than the window, prefilled in chunks of 64 tokens (chunks
//     whose windows start mid-block, blocks of 16 dropped behind the window), then 24 greedy
//     tokens: the GPU's equal the CPU's except at steps whose CPU top-2 margin is a near tie;
//   - CUDA graphs (a decode graph per batch size, each KV group's decode grid updated on
//     replay) give the eager engine's tokens, batched.
//   - KV offload (Gemma 3): the global layer's KV through the host pool, a GPU cache of a few
//     blocks and the ring, the sliding layers' windows resident in the window pool, gives the
//     resident engine's tokens; with Quest on the global layer (a budget above every context:
//     it keeps every page, so dense's tokens) too. Mistral (every layer sliding) is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/engine_properties.h"
#include "common/greedy_compare.h"
#include "common/moe_checkpoint.h"
#include "engine/engine_core.h"
#include "engine/llm_internal.h"
#include "gpu_models/gpu_executor.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/llm.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

namespace fs = std::filesystem;

constexpr double kTieMargin = 0.05;

// 0: Mistral; 1: Gemma 3, head_dim 64; 2: Gemma 3, head_dim 256.
nlohmann::json sliding_config(int family) {
  const bool gemma = family > 0;
  const int head_dim = family == 2 ? 256 : 64;
  nlohmann::json j = {{"vocab_size", 320},
                      {"hidden_size", 256},
                      {"intermediate_size", 128},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", head_dim},
                      {"max_position_embeddings", 4096},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"sliding_window", 40},
                      {"dtype", "float32"},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2}};
  if (gemma) {
    j["architectures"] = {"Gemma3ForCausalLM"};
    j["model_type"] = "gemma3_text";
    j["num_hidden_layers"] = 3;
    j["layer_types"] = {"sliding_attention", "sliding_attention", "full_attention"};
    j["query_pre_attn_scalar"] = head_dim;
    j["rope_local_base_freq"] = 10000.0;
    j["tie_word_embeddings"] = true;
  } else {
    j["architectures"] = {"MistralForCausalLM"};
    j["model_type"] = "mistral";
    j["num_hidden_layers"] = 2;
    j["tie_word_embeddings"] = false;
  }
  return j;
}

class GpuSliding : public ::testing::TestWithParam<int> {  // sliding_config's family
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("longctx_gpu_sliding_" + std::to_string(GetParam()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    const nlohmann::json config = sliding_config(GetParam());
    write_checkpoint_dir(dir_, config,
                         tiny_moe_weights(parse_model_config(config, "tiny-sliding"), 53), 1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  EngineConfig config(const std::string& device, bool eager) const {
    EngineConfig c;
    c.model = dir_.string();
    c.device = device;
    c.max_model_len = 1024;
    c.block_size = 16;
    c.max_num_batched_tokens = 64;  // long prompts prefill in chunks
    c.max_num_seqs = 8;
    c.num_gpu_blocks = 512;
    c.enforce_eager = eager;
    if (device == "cuda") c.model_options.activation_dtype = DType::kF16;
    return c;
  }

  std::vector<Prompt> prompts() const {
    std::vector<Prompt> p;
    for (int64_t n : {3, 41, 100, 300, 700}) p.push_back(Prompt(make_ids(n, n, 320)));
    return p;
  }

  fs::path dir_;
};

SamplingParams greedy() { return greedy_with_logprobs(24); }

TEST_P(GpuSliding, GpuEngineGivesTheCpuEnginesTokens) {
  const auto cpu = LLM(config("cpu", true)).generate(prompts(), greedy(), false);
  const auto gpu = LLM(config("cuda", true)).generate(prompts(), greedy(), false);
  expect_same_tokens_up_to_ties(cpu, gpu, kTieMargin, "gpu vs cpu");
}

TEST_P(GpuSliding, GraphDecodeEqualsEagerBatched) {
  const auto eager = LLM(config("cuda", true)).generate(prompts(), greedy(), false);
  const auto graphs = LLM(config("cuda", false)).generate(prompts(), greedy(), false);
  expect_same_tokens_up_to_ties(eager, graphs, kTieMargin, "graphs vs eager");
}

// The global layer offloaded with a GPU cache of a step's blocks and a few more (the long prompts
// stream through a ring of 2 slots of 3 blocks), the windows resident.
EngineConfig offload_config(EngineConfig c) {
  c.kv_offload = true;
  c.num_gpu_blocks = 64 / 16 + 2 * 8 + 4;
  c.host_kv_budget = 64ll << 20;
  c.offload_slots = 2;
  c.offload_slot_tokens = 48;
  return c;
}

// Every layer sliding (Mistral): nothing to offload, refused by name.
void expect_offload_refused(const EngineConfig& c) {
  try {
    LLM llm(c);
    ADD_FAILURE() << "an all-sliding model was offloaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("nothing to offload"), std::string::npos) << e.what();
  }
}

// The engine as config() has it, for common/engine_properties.h's body (tests/engine runs it on
// the CPU simulation: test_offload_groups.cpp), and the same with offload_config()'s geometry in
// a host pool of 512 blocks.
EngineSpec resident_spec(const fs::path& dir) {
  EngineSpec s;
  s.checkpoint = std::make_shared<const Checkpoint>(load_checkpoint(dir.string()));
  s.max_model_len = 1024;
  s.block_size = 16;
  s.num_blocks = 512;
  s.max_num_batched_tokens = 64;
  s.max_num_seqs = 8;
  return s;
}

EngineSpec offloaded_spec(EngineSpec s) {
  s.offload_gpu_blocks = 64 / 16 + 2 * 8 + 4;
  s.offload_slots = 2;
  s.offload_slot_blocks = 3;
  return s;
}

std::vector<std::vector<int32_t>> prompt_ids() {
  std::vector<std::vector<int32_t>> p;
  for (int64_t n : {3, 41, 100, 300, 700}) p.push_back(make_ids(n, n, 320));
  return p;
}

TEST_P(GpuSliding, OffloadedEqualsResident) {
  if (GetParam() == 0) return expect_offload_refused(offload_config(config("cuda", true)));
  std::shared_ptr<GpuRunner> runner;
  const EngineSpec resident = resident_spec(dir_);
  check_offloaded_engine_equals_resident(
      GpuExecutorFactory{
          .enforce_eager = true, .activation_dtype = DType::kF16, .last_runner = &runner},
      resident, offloaded_spec(resident), prompt_ids(), 24, {kTieMargin, 0});
  // The global layer streamed from the host (checked by the body); the windows were resident.
  ASSERT_NE(runner, nullptr);
  EXPECT_GT(runner->memory_plan().num_window_blocks, 0);
  EXPECT_NE(runner->memory_plan().str().find("sliding windows resident"), std::string::npos)
      << runner->memory_plan().str();
}

// Quest selects over the global layer only (the windows are read whole).
TEST_P(GpuSliding, OffloadedQuestWithAWholeBudgetEqualsResident) {
  EngineConfig c = offload_config(config("cuda", true));
  c.sparse.policy = SparsePolicyKind::kQuest;
  c.sparse.budget_tokens = 4096;
  if (GetParam() == 0) {  // every layer sliding: refused as above
    EXPECT_THROW(LLM llm(c), Error);
    return;
  }
  const EngineSpec resident = resident_spec(dir_);
  EngineSpec quest = offloaded_spec(resident);
  quest.sparse = c.sparse;
  check_offloaded_engine_equals_resident(
      GpuExecutorFactory{.enforce_eager = true, .activation_dtype = DType::kF16}, resident, quest,
      prompt_ids(), 24, {kTieMargin, 0});
}

INSTANTIATE_TEST_SUITE_P(Families, GpuSliding, ::testing::Values(0, 1, 2), [](const auto& info) {
  return info.param == 0 ? "Mistral" : info.param == 1 ? "Gemma3" : "Gemma3HeadDim256";
});

}  // namespace
}  // namespace longctx::testing
