// `longctx needle` end to end on the committed needle model (models/needle) and samples written
// by tools/needle_model/needle_data.py (tests/data/needle/*_2k.jsonl): per-sample verdicts and
// scores, the summary table, --fail-below, and clear errors for bad sample files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "common/test_data.h"

namespace fs = std::filesystem;
using longctx::testing::cli_path;
using longctx::testing::CliResult;
using longctx::testing::run_cli;
using longctx::testing::slurp;

namespace {

std::string data(const std::string& name) {
  return longctx::testing::test_data_dir() + "/needle/" + name;
}

CliResult needle(const std::string& args) {
  return run_cli("needle --model '" + longctx::testing::test_data_dir() + "/../../models/needle' " +
                 args);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

class NeedleCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cli_path())) << "longctx binary not built at " << cli_path();
    dir_ = fs::temp_directory_path() / ("longctx_needle_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The first line of a committed sample file as JSON.
  nlohmann::json first_sample(const std::string& name) {
    std::ifstream f(data(name));
    std::string line;
    std::getline(f, line);
    return nlohmann::json::parse(line);
  }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

}  // namespace

// The model finds the single needle in all four 2K samples and gets the multi-value samples
// partly right; each verdict and score in --out must follow from its prediction and the sample
// it names (`where`: file:line), and the table must add them up.
TEST_F(NeedleCli, ScoresTheCommittedModel) {
  const std::string out = (dir_ / "res.json").string();
  const auto r = needle("-s '" + data("niah_single_2k.jsonl") + "' -s '" +
                        data("niah_multivalue_2k.jsonl") + "' --out '" + out + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto res = nlohmann::json::parse(slurp(out));
  ASSERT_EQ(res.size(), 6u);
  std::map<std::string, std::pair<int, double>> cells;  // task -> (exact, sum of ruler)
  for (const auto& s : res) {
    const std::string pred = s.at("prediction");
    EXPECT_EQ(s.at("exact").get<bool>(), pred == s.at("answer").get<std::string>()) << s.dump();
    // RULER's string_match_all recomputed from the outputs of the sample the result names.
    const std::string where = s.at("where");
    const size_t colon = where.rfind(':');
    std::ifstream f(where.substr(0, colon));
    std::string line;
    for (int i = std::stoi(where.substr(colon + 1)); i > 0; --i) std::getline(f, line);
    const auto sample = nlohmann::json::parse(line);
    ASSERT_EQ(sample.at("answer"), s.at("answer")) << where;
    double found = 0;
    for (const auto& o : sample.at("outputs"))
      found += lower(pred).find(lower(o.get<std::string>())) != std::string::npos ? 1 : 0;
    EXPECT_DOUBLE_EQ(s.at("ruler").get<double>(), found / sample.at("outputs").size()) << pred;
    auto& cell = cells[s.at("task")];
    cell.first += s.at("exact").get<bool>() ? 1 : 0;
    cell.second += s.at("ruler").get<double>();
  }
  EXPECT_EQ(cells["niah_single"].first, 4) << r.out;
  for (const auto& [task, n] :
       {std::pair<std::string, int>{"niah_single", 4}, {"niah_multivalue", 2}}) {
    char row[128];
    std::snprintf(row, sizeof(row), "%-20s %6d %5d %8.1f %8.1f", task.c_str(), 2048, n,
                  100.0 * cells[task].first / n, 100.0 * cells[task].second / n);
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  }
}

// A sample whose expected answer is not what the model says fails its cell; --fail-below turns
// that into an error naming the cell.
TEST_F(NeedleCli, FailBelowNamesTheCell) {
  auto s = first_sample("niah_single_2k.jsonl");
  s["answer"] = " 1111111.";
  s["outputs"] = {"1111111"};
  const std::string path = write("wrong.jsonl", s.dump() + "\n");
  auto r = needle("-s '" + path + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("niah_single            2048     1      0.0      0.0"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("expected \" 1111111.\" got \" 2152516.\""), std::string::npos) << r.out;
  r = needle("-s '" + path + "' --fail-below 50");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("niah_single L=2048: exact 0/1 is below --fail-below 50%"),
            std::string::npos)
      << r.err;
}

TEST_F(NeedleCli, BadSampleFilesAreClearErrors) {
  const auto expect_error = [&](const std::string& args, const std::string& message) {
    const auto r = needle(args);
    EXPECT_EQ(r.rc, 1) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << "want: " << message << "\ngot: " << r.err;
  };
  const std::string good = first_sample("niah_single_2k.jsonl").dump();
  expect_error("-s '" + (dir_ / "missing.jsonl").string() + "'", "cannot open samples file");
  expect_error("-s '" + write("empty.jsonl", "\n\n") + "'", "empty.jsonl: no samples");
  expect_error("-s '" + write("bad.jsonl", good + "\n{\"task\": \n") + "'",
               "bad.jsonl:2: not JSON");
  expect_error("-s '" + write("array.jsonl", "[1, 2]\n") + "'", "array.jsonl:1: not a JSON object");
  auto s = nlohmann::json::parse(good);
  s.erase("answer");
  expect_error("-s '" + write("noanswer.jsonl", s.dump()) + "'",
               "noanswer.jsonl:1: sample has no \"answer\" field");
  s = nlohmann::json::parse(good);
  s["outputs"] = "2152516";
  expect_error("-s '" + write("type.jsonl", s.dump()) + "'",
               "type.jsonl:1: field \"outputs\" has the wrong type (string)");
  s["outputs"] = nlohmann::json::array();
  expect_error("-s '" + write("noout.jsonl", s.dump()) + "'",
               "noout.jsonl:1: \"outputs\" is empty");
  // 2,016 prompt tokens do not fit a 1,024-token context: named before anything runs.
  expect_error("-s '" + data("niah_single_2k.jsonl") + "' --max-model-len 1024",
               "niah_single_2k.jsonl:1: 2016 prompt tokens + 64 to generate exceed the context "
               "(1024 tokens)");
}
