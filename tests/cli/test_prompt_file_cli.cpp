// Prompts that do not fit on a command line: `generate --prompt-file PATH` and `--prompt-file -`
// (standard input) carry a needle prompt to the right answer and a 1M-character prompt whole to
// the engine; empty and unreadable prompts are errors, not a run from BOS alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli_runner.h"

namespace fs = std::filesystem;

namespace {

using longctx::testing::run_cli;

class PromptFileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(longctx::testing::cli_path())) << longctx::testing::cli_path();
    dir_ = fs::temp_directory_path() / ("longctx_prompt_file_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ifstream in(std::string(LONGCTX_SOURCE_DIR) + "/tests/data/needle/niah_single_2k.jsonl");
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    const auto sample = nlohmann::json::parse(line);
    prompt_ = sample["input"].get<std::string>() + sample["answer_prefix"].get<std::string>();
    answer_ = sample["answer"].get<std::string>();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  static std::string model() { return std::string(LONGCTX_SOURCE_DIR) + "/models/needle"; }
  static std::string greedy(const std::string& args) {
    return "generate --device cpu --model '" + model() + "' --temperature 0 --max-tokens 12 " +
           args;
  }

  fs::path dir_;
  std::string prompt_;  // a 2K-token needle prompt, answer prefix included
  std::string answer_;  // what the model answers (models/needle/README.md)
};

TEST_F(PromptFileCli, FileAndStandardInputGiveTheAnswer) {
  const std::string path = write("needle.txt", prompt_);
  const auto from_file = run_cli(greedy("--prompt-file '" + path + "'"));
  ASSERT_EQ(from_file.rc, 0) << from_file.err;
  EXPECT_EQ(from_file.out, answer_ + "\n");
  const auto from_stdin = run_cli(greedy("--prompt-file - < '" + path + "'"));
  ASSERT_EQ(from_stdin.rc, 0) << from_stdin.err;
  EXPECT_EQ(from_stdin.out, from_file.out);
  EXPECT_NE(from_stdin.err.find("2016 prompt"), std::string::npos) << from_stdin.err;
}

TEST_F(PromptFileCli, MillionCharacterPromptArrivesWhole) {
  // Past ARG_MAX (2 MiB of arguments and environment, 128 KiB per argument on Linux): only a
  // file or a pipe can carry it. The needle model's context (131072) is shorter than its tokens,
  // so the engine names the count, which must be the same through both paths.
  std::string big;
  while (big.size() < 1'000'000) big += prompt_;
  big.resize(1'000'000);
  const std::string path = write("big.txt", big);
  const std::regex count(R"(the prompt has (\d+) tokens, longer than)");
  std::smatch m_file;
  std::smatch m_stdin;
  const auto from_file = run_cli(greedy("--prompt-file '" + path + "'"));
  const auto from_stdin = run_cli(greedy("-f - < '" + path + "'"));
  EXPECT_EQ(from_file.rc, 1);
  EXPECT_EQ(from_stdin.rc, 1);
  ASSERT_TRUE(std::regex_search(from_file.err, m_file, count)) << from_file.err;
  ASSERT_TRUE(std::regex_search(from_stdin.err, m_stdin, count)) << from_stdin.err;
  EXPECT_EQ(m_file[1], m_stdin[1]);
  EXPECT_GT(std::stoll(m_file[1]), 200'000);  // ~3.5 characters a token: all of it was read
}

TEST_F(PromptFileCli, EmptyAndMissingPromptsAreErrors) {
  const auto empty_arg = run_cli(greedy("--prompt ''"));
  EXPECT_EQ(empty_arg.rc, 1);
  EXPECT_NE(empty_arg.err.find("--prompt: the prompt is empty"), std::string::npos)
      << empty_arg.err;
  EXPECT_EQ(empty_arg.out, "");
  const std::string empty = write("empty.txt", "");
  const auto empty_file = run_cli(greedy("--prompt-file '" + empty + "'"));
  EXPECT_EQ(empty_file.rc, 1);
  EXPECT_NE(empty_file.err.find("the prompt is empty"), std::string::npos) << empty_file.err;
  const auto empty_stdin = run_cli(greedy("--prompt-file - < /dev/null"));
  EXPECT_EQ(empty_stdin.rc, 1);
  EXPECT_NE(empty_stdin.err.find("--prompt-file -: the prompt is empty"), std::string::npos)
      << empty_stdin.err;
  const auto missing = run_cli(greedy("--prompt-file '" + (dir_ / "nope.txt").string() + "'"));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("cannot open"), std::string::npos) << missing.err;
  const auto twice = run_cli(greedy("-f - -f - < /dev/null"));
  EXPECT_EQ(twice.rc, 1);
  EXPECT_NE(twice.err.find("standard input can be read once"), std::string::npos) << twice.err;
}

TEST_F(PromptFileCli, ChatTemplateReplacesTheModels) {
  // The prompt is what the template renders: its token count is that of the rendered text.
  const std::string tmpl = "<doc>{{ messages[0]['content'] }}</doc>{{ 'ANSWER:' }}";
  const std::string path = write("template.jinja", tmpl);
  const auto rendered =
      run_cli("tokenize --model '" + model() + "' --text '<doc>hello</doc>ANSWER:'");
  ASSERT_EQ(rendered.rc, 0) << rendered.err;
  const auto ids = nlohmann::json::parse(rendered.out);
  const std::string expected = std::to_string(ids.size()) + " prompt + 1 generated";
  for (const std::string& value : {path, tmpl}) {  // a file, or the template in one line
    const auto r =
        run_cli("generate --device cpu --model '" + model() +
                "' --chat --prompt hello --max-tokens 1 --chat-template \"" + value + "\"");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << expected << " in " << r.err;
  }
  const auto missing = run_cli("generate --device cpu --model '" + model() +
                               "' --chat --prompt hello --chat-template nope.jinja");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("--chat-template 'nope.jinja': no such file, and not a template"),
            std::string::npos)
      << missing.err;
}

}  // namespace
