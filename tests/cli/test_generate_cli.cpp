// `longctx generate` end to end: greedy tokens of a fixture model on stdout, the summary on
// stderr, stop strings cut from the streamed text, and clear errors for bad prompts.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_runner.h"
#include "common/test_data.h"

namespace fs = std::filesystem;

namespace {

using longctx::testing::cli_path;
using longctx::testing::CliResult;

// Every model here is a tiny fixture: run it with the fixtures' rope convention (see
// ModelBuildOptions::rope_inv_freq_dtype).
CliResult generate(const std::string& args) {
  return longctx::testing::run_cli("generate --rope-inv-freq-dtype checkpoint " + args);
}

std::string fixture(const std::string& name) {
  return longctx::testing::test_data_dir() + "/fixtures/" + name;
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << "no " << cli_path() << " (build the longctx target)";
  }
};

TEST_F(GenerateCli, GreedyIdsMatchTransformers) {
  std::ifstream f(fixture("tiny-qwen2") + "/reference.json");
  const auto ref = nlohmann::json::parse(f);
  for (const auto& c : ref["cases"]) {
    if (c["prompt_len"] != 7) continue;
    std::string ids, expected;
    for (const auto& t : c["input_ids"]) ids += (ids.empty() ? "" : ",") + t.dump();
    for (const auto& t : c["greedy_new_tokens"])
      expected += (expected.empty() ? "" : " ") + t.dump();
    // Every margin of this case is above 1e-3, so all 24 tokens must match.
    const auto r = generate("--model '" + fixture("tiny-qwen2") + "' --ids " + ids +
                            " --temperature 0 --max-tokens 24 --ignore-eos");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, expected + "\n");
    EXPECT_NE(r.err.find("7 prompt + 24 generated tokens, finish: length"), std::string::npos)
        << r.err;
    return;
  }
  FAIL() << "no 7-token case";
}

TEST_F(GenerateCli, StopStringIsCutFromTheStream) {
  const std::string tok = longctx::testing::fetched_data_dir() + "/tokenizers/qwen3";
  ASSERT_TRUE(fs::exists(tok + "/tokenizer.json"))
      << "no " << tok << " (run tools/fetch_test_data.sh)";
  const std::string base = "--load-format dummy --preset tiny-llama --tokenizer '" + tok +
                           "' --ids 40,41,42 --max-tokens 40 --seed 1";
  const auto full = generate(base);
  ASSERT_EQ(full.rc, 0) << full.err;
  // Pick two ASCII letters from the middle of the output as the stop string.
  size_t at = std::string::npos;
  for (size_t i = full.out.size() / 3; i + 1 < full.out.size(); ++i) {
    if (std::isalpha(static_cast<unsigned char>(full.out[i])) &&
        std::isalpha(static_cast<unsigned char>(full.out[i + 1]))) {
      at = i;
      break;
    }
  }
  ASSERT_NE(at, std::string::npos) << "no ASCII pair in: " << full.out;
  const std::string stop = full.out.substr(at, 2);
  const auto cut = generate(base + " --stop '" + stop + "'");
  ASSERT_EQ(cut.rc, 0) << cut.err;
  EXPECT_EQ(cut.out, full.out.substr(0, full.out.find(stop)) + "\n");
  EXPECT_NE(cut.err.find("finish: stop (stop string"), std::string::npos) << cut.err;
}

TEST_F(GenerateCli, BadPromptsAreClearErrors) {
  const std::string model = "--model '" + fixture("tiny-llama3") + "'";
  auto r = generate(model + " --ids 1,2,3,4,5 --max-model-len 4");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("5 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("4 tokens"), std::string::npos) << r.err;
  r = generate(model + " --ids 1,x");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("'x' is not a token id"), std::string::npos) << r.err;
  r = generate(model + " --prompt hello");  // the fixture has no tokenizer
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("needs a tokenizer"), std::string::npos) << r.err;
  r = generate(model + " --ids 1 --top-p 0");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("top_p"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
