// Greedy generation through the LLM API on the tiny fixture checkpoints reproduces the tokens
// transformers generated (reference.json greedy_new_tokens), up to the first step where the top
// two logits are too close (margin < 1e-3) for the order to be meaningful.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "longctx/llm.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

constexpr double kMinMargin = 1e-3;

class LLMFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(LLMFixtures, GreedyMatchesTransformers) {
  const std::string dir = testing::test_data_dir() + "/fixtures/" + GetParam();
  std::ifstream in(dir + "/reference.json");
  ASSERT_TRUE(in) << dir;
  const auto ref = nlohmann::json::parse(in);
  // The fixtures' rope convention (see ModelBuildOptions::rope_inv_freq_dtype).
  LLM llm(EngineConfig{.model = dir, .model_options = {.rope_inv_freq_dtype = DType::kBF16}});
  ASSERT_NE(llm.model_config(), nullptr);
  EXPECT_EQ(llm.model_config()->eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(llm.max_model_len(), 32768);
  int checked_cases = 0;
  for (const auto& c : ref["cases"]) {
    if (!c.contains("greedy_new_tokens")) continue;
    const auto ids = c["input_ids"].get<std::vector<int32_t>>();
    const auto expected = c["greedy_new_tokens"].get<std::vector<int32_t>>();
    const auto margins = c["greedy_margins"].get<std::vector<double>>();
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = static_cast<int64_t>(expected.size());
    sp.ignore_eos = true;  // the reference ran without EOS stopping
    const RequestOutput out = llm.generate({ids}, sp, false).at(0);
    ASSERT_EQ(out.token_ids.size(), expected.size());
    EXPECT_EQ(out.finish_reason, FinishReason::kLength);
    size_t compared = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      if (margins[i] < kMinMargin) break;  // from here on the tokens may legitimately differ
      ASSERT_EQ(out.token_ids[i], expected[i])
          << GetParam() << " prompt_len " << ids.size() << " step " << i;
      ++compared;
    }
    EXPECT_GE(compared, 8u) << "too few comparable steps to mean anything";
    ++checked_cases;
  }
  EXPECT_EQ(checked_cases, 2);
}

INSTANTIATE_TEST_SUITE_P(Tiny, LLMFixtures,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-qwen3"));

TEST(LLMFixtureErrors, PromptLongerThanMaxModelLenNamesBothLengths) {
  const std::string dir = testing::test_data_dir() + "/fixtures/tiny-qwen3";
  LLM llm(EngineConfig{.model = dir, .max_model_len = 16});
  SamplingParams sp;
  sp.temperature = 0;
  try {
    llm.generate({std::vector<int32_t>(17, 5)}, sp, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("17 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("16 tokens"), std::string::npos) << e.what();
  }
  // A prompt that fits stops cleanly at the context end.
  sp.max_tokens = 100;
  sp.ignore_eos = true;
  auto out = llm.generate({std::vector<int32_t>(10, 5)}, sp, false).at(0);
  EXPECT_EQ(out.token_ids.size(), 6u);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  // max_model_len beyond the model's limit is refused.
  EXPECT_THROW(LLM(EngineConfig{.model = dir, .max_model_len = 40000}), Error);
}

}  // namespace
}  // namespace longctx
