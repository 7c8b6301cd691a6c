// `longctx forward` end to end: the built binary reproduces a fixture's transformers logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "common/test_data.h"
#include "longctx/core/npy.h"

namespace fs = std::filesystem;
using namespace longctx;

namespace {

using longctx::testing::cli_path;
using longctx::testing::slurp;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("longctx_cli_test_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

// Runs `longctx <args>` with output to a log; returns the exit status.
int run_cli(const std::string& args, const fs::path& log) {
  const std::string cmd = "'" + cli_path() + "' " + args + " > '" + log.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

nlohmann::json reference_case(const std::string& model, int64_t len) {
  std::ifstream f(longctx::testing::test_data_dir() + "/fixtures/" + model + "/reference.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& c : j.at("cases"))
    if (c.at("prompt_len").get<int64_t>() == len) return c;
  return {};
}

double max_abs_diff_rows(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row) {
  const int64_t v = a.size(1);
  double m = 0;
  for (int64_t i = 0; i < v; ++i) {
    double d = std::abs(double(a.data<float>()[a_row * v + i]) - b.data<float>()[b_row * v + i]);
    if (!(d <= m)) m = d;
  }
  return m;
}

class ForwardCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << "longctx binary not built at " << cli_path();
    dir_ = temp_dir();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(ForwardCli, IdsOnCommandLineReproduceFixtureLogits) {
  const std::string model = longctx::testing::test_data_dir() + "/fixtures/tiny-qwen3";
  nlohmann::json c = reference_case("tiny-qwen3", 7);
  std::string ids;
  for (const auto& v : c.at("input_ids")) ids += (ids.empty() ? "" : ",") + v.dump();
  const fs::path out = dir_ / "logits.npy";
  ASSERT_EQ(run_cli("forward --rope-inv-freq-dtype checkpoint --model '" + model + "' --ids " +
                        ids + " --out '" + out.string() + "'",
                    dir_ / "log"),
            0)
      << slurp(dir_ / "log");
  Tensor ours = read_npy(out.string());
  Tensor ref = read_npy(model + "/" + c.at("logits_file").get<std::string>());
  ASSERT_EQ(ours.dtype(), DType::kF32);
  ASSERT_EQ(ours.shape(), ref.shape());
  for (int64_t r = 0; r < 7; ++r) EXPECT_LE(max_abs_diff_rows(ours, r, ref, r), 1e-3) << r;
}

TEST_F(ForwardCli, JsonIdsFileAndLastPosition) {
  const std::string model = longctx::testing::test_data_dir() + "/fixtures/tiny-llama3";
  nlohmann::json c = reference_case("tiny-llama3", 64);
  const fs::path ids_file = dir_ / "ids.json";
  std::ofstream(ids_file) << c.at("input_ids").dump();
  const fs::path out = dir_ / "last.npy";
  ASSERT_EQ(
      run_cli("forward --rope-inv-freq-dtype checkpoint --model '" + model + "' --ids-file '" +
                  ids_file.string() + "' --positions last --out '" + out.string() + "'",
              dir_ / "log"),
      0)
      << slurp(dir_ / "log");
  Tensor ours = read_npy(out.string());
  Tensor ref = read_npy(model + "/" + c.at("logits_file").get<std::string>());
  ASSERT_EQ(ours.shape(), (Shape{1, ref.size(1)}));
  EXPECT_LE(max_abs_diff_rows(ours, 0, ref, 63), 1e-3);
}

TEST_F(ForwardCli, WhitespaceIdsFileMatchesCommandLineIds) {
  const std::string model = longctx::testing::test_data_dir() + "/fixtures/tiny-qwen2";
  std::ofstream(dir_ / "ids.txt") << "965 336\n552,582  951\n";
  ASSERT_EQ(
      run_cli("forward --rope-inv-freq-dtype checkpoint --model '" + model + "' --ids-file '" +
                  (dir_ / "ids.txt").string() + "' --out '" + (dir_ / "a.npy").string() + "'",
              dir_ / "log"),
      0)
      << slurp(dir_ / "log");
  ASSERT_EQ(run_cli("forward --rope-inv-freq-dtype checkpoint --model '" + model +
                        "' --ids 965,336,552,582,951 --out '" + (dir_ / "b.npy").string() + "'",
                    dir_ / "log"),
            0)
      << slurp(dir_ / "log");
  Tensor a = read_npy((dir_ / "a.npy").string()), b = read_npy((dir_ / "b.npy").string());
  ASSERT_EQ(a.shape(), (Shape{5, 1024}));
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(max_abs_diff_rows(a, r, b, r), 0.0);
}

TEST_F(ForwardCli, BadIdsFailWithAMessage) {
  const std::string model = longctx::testing::test_data_dir() + "/fixtures/tiny-qwen2";
  EXPECT_NE(run_cli("forward --rope-inv-freq-dtype checkpoint --model '" + model +
                        "' --ids 1,x,3 --out '" + (dir_ / "x.npy").string() + "'",
                    dir_ / "log"),
            0);
  EXPECT_NE(slurp(dir_ / "log").find("'x' is not a token id"), std::string::npos)
      << slurp(dir_ / "log");
  EXPECT_NE(run_cli("forward --rope-inv-freq-dtype checkpoint --model '" + model +
                        "' --ids 1,99999 --out '" + (dir_ / "x.npy").string() + "'",
                    dir_ / "log"),
            0);
  EXPECT_NE(slurp(dir_ / "log").find("outside the vocabulary"), std::string::npos)
      << slurp(dir_ / "log");
  EXPECT_FALSE(fs::exists(dir_ / "x.npy"));
}

TEST_F(ForwardCli, DummyPresetRunsAndIsDeterministic) {
  const std::string args = "forward --load-format dummy --preset tiny-llama --ids 1,2,3,4,5 ";
  ASSERT_EQ(run_cli(args + "--out '" + (dir_ / "a.npy").string() + "'", dir_ / "log"), 0)
      << slurp(dir_ / "log");
  ASSERT_EQ(
      run_cli(args + "--positions last --out '" + (dir_ / "b.npy").string() + "'", dir_ / "log"), 0)
      << slurp(dir_ / "log");
  Tensor a = read_npy((dir_ / "a.npy").string()), b = read_npy((dir_ / "b.npy").string());
  ASSERT_EQ(a.rank(), 2);
  ASSERT_EQ(a.size(0), 5);
  ASSERT_EQ(b.shape(), (Shape{1, a.size(1)}));
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_TRUE(std::isfinite(a.data<float>()[i])) << i;
  // Same seed, same weights: the last row of the full run is the last-position run.
  EXPECT_EQ(max_abs_diff_rows(a, 4, b, 0), 0.0);
}
