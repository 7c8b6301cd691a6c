// Progress of long work: on a terminal a streamed prompt's prefill is drawn chunk by chunk (the
// engine reports each step) and erased before the answer's text; piped, a batch writes one
// summary line and no redraws.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli_runner.h"

namespace fs = std::filesystem;

namespace {

std::string model() { return std::string(LONGCTX_SOURCE_DIR) + "/models/needle"; }

// A 2016-token needle prompt (its answer prefix included) and the answer, from the test samples.
std::pair<std::string, std::string> needle_prompt() {
  std::ifstream in(std::string(LONGCTX_SOURCE_DIR) + "/tests/data/needle/niah_single_2k.jsonl");
  std::string line;
  std::getline(in, line);
  const auto sample = nlohmann::json::parse(line);
  return {sample["input"].get<std::string>() + sample["answer_prefix"].get<std::string>(),
          sample["answer"].get<std::string>()};
}

TEST(ProgressCli, StreamedPrefillIsDrawnPerChunkOnATerminal) {
  const fs::path dir = fs::temp_directory_path() / ("longctx_progress_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto [prompt, answer] = needle_prompt();
  std::ofstream(dir / "prompt.txt") << prompt;
  // util-linux `script` runs the command on a pseudo-terminal and copies what it draws.
  const std::string inner = "'" + longctx::testing::cli_path() +
                            "' generate --device cpu --model '" + model() + "' --prompt-file '" +
                            (dir / "prompt.txt").string() +
                            "' --temperature 0 --max-tokens 12 --max-num-batched-tokens 512";
  const std::string cmd = "script -qfec \"" + inner + "\" /dev/null > '" + (dir / "tty").string() +
                          "' 2>&1 < /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << longctx::testing::slurp(dir / "tty");
  const std::string tty = longctx::testing::slurp(dir / "tty");
  fs::remove_all(dir);
  // 2016 tokens in chunks of 512: the line shows tokens done strictly between 0 and 2016.
  const std::regex drawn(R"(\rPrefill: +(\d+)% (\d+)/2016 tokens \[\d\d:\d\d\] \d+ tok/s\x1b\[K)");
  int partial = 0;
  for (auto it = std::sregex_iterator(tty.begin(), tty.end(), drawn); it != std::sregex_iterator();
       ++it) {
    const int64_t done = std::stoll((*it)[2]);
    partial += done > 0 && done < 2016 ? 1 : 0;
  }
  EXPECT_GE(partial, 1) << tty;
  // Erased (carriage return, erase to end of line) right before the answer's text.
  EXPECT_NE(tty.find("\r\x1b[K" + answer), std::string::npos) << tty;
}

TEST(ProgressCli, PipedBatchWritesOneSummaryLine) {
  const auto r = longctx::testing::run_cli("generate --device cpu --model '" + model() +
                                           "' -p hello -p world --max-tokens 3 --ignore-eos");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::regex summary(
      R"(Generated 2/2 requests in [0-9.]+ s: \d+ prompt tokens \(prefill \d+ tok/s\), 6 generated )"
      R"(tokens \(decode \d+ tok/s\)\n)");
  EXPECT_TRUE(std::regex_search(r.err, summary)) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a redraw in a pipe:\n" << r.err;
}

}  // namespace
