// `longctx ruler` end to end on the committed needle model (models/needle) and samples from
// RULER's own generator (tests/data/ruler): the first two 4096-token niah_single_1 and
// niah_single_2 samples must score as the model's transformers run scores them
// (tests/data/ruler/expected_hf.json, written by tools/needle_model/ruler_hf.py), the table and
// --output must agree with them, and bad input is a clear error. The run takes ~80 s of CPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>

#include "cli_runner.h"
#include "common/test_data.h"

namespace fs = std::filesystem;
using longctx::testing::cli_path;
using longctx::testing::CliResult;
using longctx::testing::run_cli;
using longctx::testing::slurp;

namespace {

std::string ruler_data() { return longctx::testing::test_data_dir() + "/ruler"; }

CliResult ruler(const std::string& args) {
  return run_cli("ruler --device cpu --model '" + longctx::testing::test_data_dir() +
                 "/../../models/needle' " + args);
}

class RulerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << "longctx binary not built at " << cli_path();
    dir_ = fs::temp_directory_path() / ("longctx_ruler_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

using Key = std::tuple<int64_t, std::string, int64_t>;  // length, task, index

}  // namespace

TEST_F(RulerCli, ScoresAsTransformersOnNiahSingle) {
  const auto expected_doc = nlohmann::json::parse(slurp(ruler_data() + "/expected_hf.json"));
  std::printf("expected scores from: %s\n", expected_doc.at("source").dump().c_str());
  std::map<Key, nlohmann::json> expected;
  for (const auto& s : expected_doc.at("samples"))
    expected[{s.at("length"), s.at("task"), s.at("index")}] = s;

  const std::string out = (dir_ / "preds.jsonl").string();
  const auto r = ruler("--data '" + ruler_data() +
                       "' --tasks niah_single_1,niah_single_2 --lengths 4096 --limit 2 "
                       "--output '" +
                       out + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::ifstream f(out);
  std::string line;
  std::map<std::string, double> sums;  // task -> sum of scores
  int n = 0;
  while (std::getline(f, line)) {
    const auto s = nlohmann::json::parse(line);
    ++n;
    const Key key{s.at("length"), s.at("task"), s.at("index")};
    auto it = expected.find(key);
    ASSERT_NE(it, expected.end()) << "no transformers result for " << line;
    const auto& hf = it->second;
    EXPECT_DOUBLE_EQ(s.at("score").get<double>(), hf.at("score").get<double>())
        << "longctx: " << s.at("prediction") << "\ntransformers: " << hf.at("prediction");
    EXPECT_EQ(s.at("outputs"), hf.at("outputs"));
    if (s.at("prediction") != hf.at("prediction")) {
      std::printf("note: same score, other text: longctx %s, transformers %s\n",
                  s.at("prediction").dump().c_str(), hf.at("prediction").dump().c_str());
    }
    sums[s.at("task")] += s.at("score").get<double>();
  }
  EXPECT_EQ(n, 4);  // --limit 2 of 3 samples, two tasks
  ASSERT_EQ(sums.size(), 2u);
  for (const auto& [task, sum] : sums) {
    char row[96];
    std::snprintf(row, sizeof(row), "%-13s %8.2f %8.2f\n", task.c_str(), 50.0 * sum, 50.0 * sum);
    EXPECT_NE(r.out.find(row), std::string::npos) << row << r.out;
  }
  EXPECT_EQ(r.out.rfind("task              4096      avg\n", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("ruler: [1/2] 4096 niah_single_1: 2 samples"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ruler: [2/2] 4096 niah_single_2: 2 samples"), std::string::npos) << r.err;
}

TEST_F(RulerCli, BadInputIsAClearError) {
  const auto expect_error = [&](const std::string& args, const std::string& message) {
    const auto r = ruler(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << "want: " << message << "\ngot: " << r.err;
  };
  const std::string missing = (dir_ / "missing").string();
  expect_error("--data '" + missing + "'", "RULER data folder " + missing + " does not exist");
  expect_error("--data '" + ruler_data() + "' --tasks niah_single_1,needle",
               "unknown RULER task 'needle' (known: niah_single_1,");
  expect_error("--data '" + ruler_data() + "' --lengths 4096,8192",
               "no folder for length 8192 (lengths there: 4096)");
  expect_error("--data '" + ruler_data() + "' --max-tokens niah=5", "unknown RULER task 'niah'");

  expect_error("--data '" + ruler_data() + "' --output '" + missing + "/preds.jsonl'",
               "cannot write " + missing + "/preds.jsonl");

  // A malformed line names its file and line, before the model loads.
  const fs::path bad = dir_ / "data" / "4096" / "niah_single_1" / "validation.jsonl";
  fs::create_directories(bad.parent_path());
  std::ifstream good(ruler_data() + "/4096/niah_single_1/validation.jsonl");
  std::string first;
  std::getline(good, first);
  std::ofstream(bad) << first << "\n{\"index\": 3, \"input\": \n";
  expect_error("--data '" + (dir_ / "data").string() + "'", bad.string() + ":2: not JSON");

  // 4,126 prompt tokens do not fit a 2,048-token context: named before anything runs.
  expect_error("--data '" + ruler_data() + "' --tasks niah_single_1 --max-model-len 2048",
               "4096/niah_single_1/validation.jsonl:1: 4126 prompt tokens + 128 to generate "
               "exceed the context (2048 tokens); 3 of 3 samples do not fit");
}
