// The CLI's shape: --version, flags under headings in --help, each subcommand listing only the
// flags it reads, and the device a run picked said on stderr.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "cli_runner.h"

namespace {

using longctx::testing::run_cli;

size_t position(const std::string& text, const std::string& heading) {
  const size_t at = text.find("\n" + heading + ":\n");
  EXPECT_NE(at, std::string::npos) << "no heading '" << heading << "' in\n" << text;
  return at;
}

TEST(HelpCli, VersionNamesTheRelease) {
  const auto r = run_cli("--version");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("longctx 0.", 0), 0U) << r.out;
  // The build's flavour: "CPU only" or "CUDA <architectures>".
  EXPECT_TRUE(r.out.find("(CPU only)") != std::string::npos ||
              r.out.find("(CUDA ") != std::string::npos)
      << r.out;
}

TEST(HelpCli, GenerateGroupsItsFlagsUnderHeadings) {
  const auto r = run_cli("generate --help");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<std::string> headings = {
      "Options", "Model", "Engine", "KV offload", "Sparse attention", "Kernel tuning", "Sampling"};
  size_t last = 0;
  for (const std::string& h : headings) {
    const size_t at = position(r.out, h);
    EXPECT_GE(at, last) << h << " out of order";
    last = at;
  }
  // A flag sits under its own heading: --temperature after "Sampling:", --kv-offload between
  // "KV offload:" and "Sparse attention:".
  EXPECT_GT(r.out.find("--temperature"), position(r.out, "Sampling"));
  const size_t offload = r.out.find("--kv-offload");
  EXPECT_GT(offload, position(r.out, "KV offload"));
  EXPECT_LT(offload, position(r.out, "Sparse attention"));
  EXPECT_NE(r.out.find("--prompt-file"), std::string::npos);
}

TEST(HelpCli, ServeHasAServerHeading) {
  const auto r = run_cli("serve --help");
  ASSERT_EQ(r.rc, 0) << r.err;
  const size_t server = position(r.out, "Server");
  EXPECT_GT(r.out.find("--allowed-origins"), server);
  EXPECT_GT(r.out.find("--port"), server);
  EXPECT_LT(r.out.find("--max-model-len"), server);  // under Engine, before
}

TEST(HelpCli, InfoListsOnlyTheFlagsItReads) {
  const auto r = run_cli("info --help");
  ASSERT_EQ(r.rc, 0) << r.err;
  position(r.out, "Model");
  position(r.out, "Engine");
  for (const char* absent : {"Sampling:", "Sparse attention:", "Kernel tuning:", "--temperature",
                             "--sparse-policy", "--max-tokens"})
    EXPECT_EQ(r.out.find(absent), std::string::npos) << absent << " in info --help";
  const auto used = run_cli("info --model x --temperature 0");
  EXPECT_NE(used.rc, 0);
  EXPECT_NE(used.err.find("--temperature"), std::string::npos) << used.err;
}

TEST(HelpCli, TheChosenDeviceIsSaid) {
  const auto r = run_cli(std::string("generate --model '") + LONGCTX_SOURCE_DIR +
                         "/models/needle' --prompt hello --max-tokens 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  // A CPU-only machine (CI) or a GPU machine running the CPU suites.
  const std::regex said(
      R"(models/needle on (cpu \(--device auto: no CUDA device\), float32 reference|)"
      R"(cuda:\d+ \(--device auto\), bfloat16))");
  EXPECT_TRUE(std::regex_search(r.err, said)) << r.err;
}

}  // namespace
