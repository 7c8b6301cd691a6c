// A tiny random Qwen3-MoE / Qwen2-MoE checkpoint (written here) through the LLM API: greedy
// continuations of several prompts generated together equal each prompt generated alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/moe_checkpoint.h"
#include "longctx/llm.h"

namespace longctx {
namespace {

namespace fs = std::filesystem;

class MoeEngine : public ::testing::TestWithParam<bool> {};  // param: the shared-expert variant

TEST_P(MoeEngine, BatchedGreedyEqualsAlone) {
  const fs::path dir =
      fs::path(::testing::TempDir()) /
      ("longctx_moe_engine_" + std::to_string(GetParam()) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const nlohmann::json config = testing::tiny_moe_config_json(GetParam());
  testing::write_checkpoint_dir(dir, config,
                                testing::per_expert_weights(testing::tiny_moe_weights(
                                    parse_model_config(config, "tiny-moe"), 46)),
                                2);
  {
    LLM llm(EngineConfig{.model = dir.string()});
    std::vector<Prompt> prompts;
    for (int64_t n : {1, 9, 40, 130}) {
      std::vector<int32_t> p(n);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 53 + n * 7 + 3) % 320);
      prompts.push_back(Prompt(p));
    }
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 12;
    sp.ignore_eos = true;
    const auto together = llm.generate(prompts, sp, false);
    ASSERT_EQ(together.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto alone = llm.generate(std::vector<Prompt>{prompts[i]}, sp, false).at(0);
      EXPECT_EQ(together[i].token_ids, alone.token_ids) << "prompt " << i;
      EXPECT_EQ(alone.token_ids.size(), 12u);
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Variants, MoeEngine, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Qwen2Moe" : "Qwen3Moe"; });

}  // namespace
}  // namespace longctx
