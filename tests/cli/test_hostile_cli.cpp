// Hostile command lines and files against the built CLI (issue 15): each ends in a clear error
// (exit status 1 and a message naming the problem), never a crash or a silent acceptance.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "common/test_data.h"

namespace fs = std::filesystem;

namespace {

using longctx::testing::cli_path;
using longctx::testing::run_cli;

std::string fixture(const std::string& name) {
  return longctx::testing::test_data_dir() + "/fixtures/" + name;
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

class HostileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << "longctx binary not built at " << cli_path();
    dir_ = fs::temp_directory_path() /
           ("longctx_hostile_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(HostileCli, UnknownLogLevelIsAnError) {
  auto r = run_cli("generate --model '" + fixture("tiny-llama3") +
                   "' --ids 1,2 --max-tokens 1 --log-level verbose");
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(r.err, "unknown log level 'verbose'");
  r = run_cli("generate --model '" + fixture("tiny-llama3") +
              "' --ids 1,2 --max-tokens 1 --log-level error");
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(HostileCli, SeedsOutsideSigned64BitsAreErrorsNotWrapped) {
  const std::string base =
      "generate --model '" + fixture("tiny-llama3") + "' --ids 1,2 --max-tokens 2 --temperature 1 ";
  for (const std::string& flag : {"--seed", "--engine-seed"}) {
    for (const std::string& bad : {"18446744073709551616", "18446744073709551615",
                                   "9223372036854775808", "-9223372036854775809", "abc", "1.5"}) {
      auto r = run_cli(base + flag + "=" + bad);
      EXPECT_EQ(r.rc, 1) << flag << "=" << bad;
      EXPECT_CONTAINS(r.err, flag);
      EXPECT_CONTAINS(r.err, bad);
    }
    // The range's ends and a negative seed (vLLM's range) are seeds.
    for (const std::string& ok : {"-1", "-9223372036854775808", "9223372036854775807", "0"}) {
      auto r = run_cli(base + flag + "=" + ok);
      EXPECT_EQ(r.rc, 0) << flag << "=" << ok << ": " << r.err;
    }
  }
  // Same seed, same tokens; -1 is its own seed.
  auto a = run_cli(base + "--seed=-1");
  auto b = run_cli(base + "--seed=-1");
  EXPECT_EQ(a.out, b.out);
}

TEST_F(HostileCli, HugeMaxTokensIsCappedByTheContext) {
  // prompt + max_tokens used to overflow into "KVCache: negative capacity".
  auto r = run_cli("generate --model '" + fixture("tiny-llama3") +
                   "' --ids 1,2,3 --max-model-len 8 --max-tokens 9223372036854775807");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("negative capacity"), std::string::npos) << r.err;
}

TEST_F(HostileCli, NeedleHugeMaxTokensIsNamedNotWrapped) {
  // n + max_tokens used to overflow and pass the context check.
  auto r = run_cli("needle --model '" + longctx::testing::test_data_dir() +
                   "/../../models/needle' -s '" + longctx::testing::test_data_dir() +
                   "/needle/niah_single_2k.jsonl' --max-tokens 9223372036854775807");
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(r.err, "2016 prompt tokens + 9223372036854775807 to generate exceed the context");
}

TEST_F(HostileCli, ForwardPastMaxPositionEmbeddings) {
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(fixture("tiny-llama3") + "/" + f, dir_ / f);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  config["max_position_embeddings"] = 4;
  config["rope_scaling"] = nullptr;  // its original_max_position_embeddings may exceed 4
  config.erase("rope_parameters");
  std::ofstream(dir_ / "config.json") << config.dump();
  auto r = run_cli("forward --model '" + dir_.string() + "' --ids 1,2,3,4,5 --out '" +
                   (dir_ / "l.npy").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(r.err, "max_position_embeddings");
  r = run_cli("forward --model '" + dir_.string() + "' --ids 1,2,3,4 --out '" +
              (dir_ / "l.npy").string() + "'");
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(HostileCli, DeepIdsFileIsAnError) {
  {
    std::ofstream f(dir_ / "ids.json");
    f << std::string(300000, '[') << "1" << std::string(300000, ']');
  }
  auto r = run_cli("forward --model '" + fixture("tiny-llama3") + "' --ids-file '" +
                   (dir_ / "ids.json").string() + "' --out '" + (dir_ / "l.npy").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(r.err, "JSON nested deeper than");
  {
    std::ofstream f(dir_ / "ids.json");
    f << "[1, [" << std::string(100, '[') << std::string(100, ']') << "]]";
  }
  r = run_cli("forward --model '" + fixture("tiny-llama3") + "' --ids-file '" +
              (dir_ / "ids.json").string() + "' --out '" + (dir_ / "l.npy").string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(r.err, "is not a token id");
  EXPECT_LT(r.err.size(), 300u) << r.err;
}

}  // namespace
