// RULER's task table, metrics and postprocessing on hand cases, and the reader of its layout
// (DIR/<length>/<task>/validation.jsonl) on the committed samples from RULER's generator
// (tests/data/ruler) and on hand-made folders with mistakes in them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "eval/ruler.h"
#include "longctx/core/error.h"

namespace fs = std::filesystem;
using longctx::Error;
using longctx::ErrorCode;
using namespace longctx::eval;

namespace {

using Refs = std::vector<std::string>;

// Runs `f`, expecting Error(code) whose message contains `part`.
template <typename F>
void expect_error(F&& f, ErrorCode code, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "want: " << part << "\ngot: " << e.what();
  }
}

std::string ruler_data() { return longctx::testing::test_data_dir() + "/ruler"; }

}  // namespace

TEST(RulerMetrics, StringMatchAllCountsTheFractionFound) {
  // Two of four values of a multi-value needle: half the sample.
  const Refs refs = {"1234567", "7654321", "1111111", "2222222"};
  EXPECT_DOUBLE_EQ(string_match_all("7654321, 1234567 and 3333333.", refs), 0.5);
  EXPECT_DOUBLE_EQ(string_match_all("1234567 7654321 1111111 2222222", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("12345", refs), 0.0);
  // A reference found inside a longer string counts (RULER's `r in pred`).
  EXPECT_DOUBLE_EQ(string_match_all("x12345678", {"1234567"}), 1.0);
}

TEST(RulerMetrics, CaseDoesNotMatter) {
  EXPECT_DOUBLE_EQ(string_match_all(" JFITJ, tvgca, OzJqU", {"jfitj", "TVGCA", "ozjqu"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("448AAA9E-66B2-4C5B-90C1-87FCCE177B4E",
                                    {"448aaa9e-66b2-4c5b-90c1-87fcce177b4e"}),
                   1.0);
  // Python's str.lower() folds more than ASCII.
  EXPECT_DOUBLE_EQ(string_match_part("L'ÉCOLE ΑΘΗΝΑ", {"école", "αθηνα"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("L'ÉCOLE ΑΘΗΝΑ", {"école", "αθηνα"}), 1.0);
}

TEST(RulerMetrics, StringMatchPartNeedsAnyOneReference) {
  const Refs refs = {"Paris", "the city of Paris, France"};
  EXPECT_DOUBLE_EQ(string_match_part("It is PARIS.", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_all("It is PARIS.", refs), 0.5);
  EXPECT_DOUBLE_EQ(string_match_part("Lyon", refs), 0.0);
}

TEST(RulerMetrics, EmptyPredictionScoresZeroAndEmptyReferencesAreAnError) {
  EXPECT_DOUBLE_EQ(string_match_all("", {"1234567"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("", {"1234567", "x"}), 0.0);
  EXPECT_DOUBLE_EQ(ruler_score(ruler_task("niah_single_1"), " \n\t ", {"1234567"}), 0.0);
  expect_error([] { string_match_all("1234567", {}); }, ErrorCode::kInvalidArgument,
               "at least one reference");
  expect_error([] { string_match_part("1234567", {}); }, ErrorCode::kInvalidArgument,
               "at least one reference");
}

TEST(RulerMetrics, PostprocessAsRulerEvaluate) {
  // strip(), every U+0000..U+001F -> "\n", strip() again; Unicode whitespace is stripped too.
  EXPECT_EQ(ruler_postprocess("  \n 123\x01"
                              "456\t7 \r\n"),
            "123\n456\n7");
  EXPECT_EQ(ruler_postprocess("\xc2\xa0 42 \xe3\x80\x80"), "42");  // U+00A0, U+3000
  EXPECT_EQ(ruler_postprocess("\x1f"
                              "a\x1e"),
            "a");
  EXPECT_EQ(ruler_postprocess(""), "");
  // The score sees the postprocessed text: a tab inside becomes a newline.
  EXPECT_DOUBLE_EQ(ruler_score(ruler_task("vt"), "AB\tCD", {"AB\nCD"}), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(ruler_task("vt"), "AB\tCD", {"AB\tCD"}), 0.0);
  // The task's metric decides: qa is string_match_part, niah string_match_all.
  EXPECT_DOUBLE_EQ(ruler_score(ruler_task("qa_1"), " paris ", {"Paris", "Lyon"}), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(ruler_task("niah_multivalue"), " paris ", {"Paris", "Lyon"}), 0.5);
}

TEST(RulerTasks, TableFollowsRulersConfig) {
  EXPECT_EQ(ruler_tasks().size(), 13u);
  EXPECT_EQ(ruler_tasks().front().name, "niah_single_1");
  for (const char* niah : {"niah_single_1", "niah_single_3", "niah_multikey_2", "niah_multivalue",
                           "niah_multiquery"}) {
    EXPECT_EQ(ruler_task(niah).family, "niah") << niah;
    EXPECT_EQ(ruler_task(niah).max_tokens, 128) << niah;
    EXPECT_EQ(ruler_task(niah).metric, RulerMetric::kStringMatchAll) << niah;
  }
  EXPECT_EQ(ruler_task("vt").max_tokens, 30);
  EXPECT_EQ(ruler_task("cwe").max_tokens, 120);
  EXPECT_EQ(ruler_task("fwe").max_tokens, 50);
  EXPECT_EQ(ruler_task("qa_2").max_tokens, 32);
  EXPECT_EQ(ruler_task("qa_1").metric, RulerMetric::kStringMatchPart);
  EXPECT_STREQ(ruler_metric_name(ruler_task("qa_2").metric), "string_match_part");
  EXPECT_STREQ(ruler_metric_name(ruler_task("cwe").metric), "string_match_all");
  expect_error([] { ruler_task("niah_single_4"); }, ErrorCode::kInvalidArgument,
               "unknown RULER task 'niah_single_4' (known: niah_single_1, niah_single_2");
}

TEST(RulerReader, ReadsTheCommittedSamples) {
  const auto cells = find_ruler_cells(ruler_data());
  ASSERT_EQ(cells.size(), 11u);  // every task RULER's generator made here but qa_1 / qa_2
  for (size_t i = 0; i < cells.size(); ++i) {
    EXPECT_EQ(cells[i].length, 4096);
    EXPECT_EQ(cells[i].task->name, ruler_tasks()[i].name);  // RULER's order
    EXPECT_EQ(cells[i].path,
              ruler_data() + "/4096/" + std::string(cells[i].task->name) + "/validation.jsonl");
    for (const RulerSample& s : read_ruler_jsonl(cells[i].path)) {
      EXPECT_FALSE(s.input.empty()) << s.where;
      EXPECT_FALSE(s.answer_prefix.empty()) << s.where;
      EXPECT_GT(s.length, 0) << s.where;
      for (const auto& o : s.outputs) EXPECT_FALSE(o.empty()) << s.where;
    }
  }
  const auto s = read_ruler_jsonl(cells[0].path);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].where, cells[0].path + ":1");
  EXPECT_EQ(s[0].index, 1179);
  EXPECT_EQ(s[0].length, 4073);
  EXPECT_EQ(s[0].outputs, Refs{"5437923"});
  EXPECT_EQ(s[0].answer_prefix,
            " The special magic number for jittery-hospital mentioned in the provided text is");
  EXPECT_EQ(s[0].prompt(), s[0].input + s[0].answer_prefix);
  EXPECT_TRUE(s[0].input.ends_with(
      "\nWhat is the special magic number for jittery-hospital mentioned in the provided text?"));
  EXPECT_EQ(read_ruler_jsonl(cells[0].path, 2).size(), 2u);
  const auto vt = read_ruler_jsonl(ruler_data() + "/4096/vt/validation.jsonl");
  EXPECT_EQ(vt[0].outputs, (Refs{"HFUPI", "LRNUY", "TRHRQ", "CYGIU", "DBZPT"}));
}

class RulerLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("longctx_ruler_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Writes DIR/<rel> with `text`, making folders.
  std::string write(const std::string& rel, const std::string& text) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  static std::string sample(int index) {
    return "{\"index\": " + std::to_string(index) +
           ", \"input\": \"Q?\", \"outputs\": [\"42\"], \"answer_prefix\": \" A:\", "
           "\"length\": 9}\n";
  }
  std::string dir() const { return dir_.string(); }
  fs::path dir_;
};

TEST_F(RulerLayout, CellsByLengthThenTaskWithFilters) {
  write("8192/vt/validation.jsonl", sample(0));
  write("4096/vt/validation.jsonl", sample(0));
  write("4096/niah_single_2/validation.jsonl", sample(1) + "\n" + sample(2));
  write("4096/README.md", "files next to the task folders are ignored");
  write("notes.txt", "and next to the length folders");
  auto cells = find_ruler_cells(dir());
  ASSERT_EQ(cells.size(), 3u);
  EXPECT_EQ(cells[0].length, 4096);
  EXPECT_EQ(cells[0].task->name, "niah_single_2");
  EXPECT_EQ(cells[1].length, 4096);
  EXPECT_EQ(cells[1].task->name, "vt");
  EXPECT_EQ(cells[2].length, 8192);
  cells = find_ruler_cells(dir(), {"vt"});
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_EQ(cells[1].length, 8192);
  cells = find_ruler_cells(dir(), {}, {8192});
  ASSERT_EQ(cells.size(), 1u);
  EXPECT_EQ(cells[0].task->name, "vt");
  const auto s = read_ruler_jsonl(dir() + "/4096/niah_single_2/validation.jsonl");
  ASSERT_EQ(s.size(), 2u);  // the blank line is skipped
  EXPECT_EQ(s[1].where, dir() + "/4096/niah_single_2/validation.jsonl:3");
  EXPECT_EQ(s[1].index, 2);
  EXPECT_EQ(s[1].prompt(), "Q? A:");
}

TEST_F(RulerLayout, LayoutMistakesAreClearErrors) {
  expect_error([&] { find_ruler_cells(dir() + "/missing"); }, ErrorCode::kNotFound,
               "RULER data folder " + dir() + "/missing does not exist");
  expect_error([&] { find_ruler_cells(dir()); }, ErrorCode::kNotFound,
               dir() + ": no <length>/<task>/validation.jsonl found");
  write("4096/vt/validation.jsonl", sample(0));
  expect_error(
      [&] {
        find_ruler_cells(dir(), {"vt", "bogus"});
      },
      ErrorCode::kInvalidArgument, "unknown RULER task 'bogus'");
  expect_error(
      [&] {
        find_ruler_cells(dir(), {}, {4096, 8192});
      },
      ErrorCode::kNotFound, ": no folder for length 8192 (lengths there: 4096)");
  expect_error([&] { find_ruler_cells(dir(), {"cwe"}); }, ErrorCode::kNotFound,
               ": task cwe is in none of the length folders searched");
  fs::create_directories(dir_ / "4096" / "niah_single_1");
  expect_error([&] { find_ruler_cells(dir()); }, ErrorCode::kNotFound,
               "4096/niah_single_1: no validation.jsonl");
  EXPECT_EQ(find_ruler_cells(dir(), {"vt"}).size(), 1u);  // the filter leaves it out
  fs::remove_all(dir_ / "4096" / "niah_single_1");
  write("4096/my_task/validation.jsonl", sample(0));
  expect_error([&] { find_ruler_cells(dir()); }, ErrorCode::kInvalidArgument,
               "4096/my_task: unknown RULER task 'my_task'");
  fs::remove_all(dir_ / "4096" / "my_task");
  write("data/vt/validation.jsonl", sample(0));
  expect_error([&] { find_ruler_cells(dir()); }, ErrorCode::kInvalidArgument,
               "/data: not a length folder");
}

TEST_F(RulerLayout, MalformedLinesNameFileAndLine) {
  const auto expect_line_error = [&](const std::string& name, const std::string& text,
                                     const std::string& message) {
    const std::string path = write(name, text);
    expect_error([&] { read_ruler_jsonl(path); }, ErrorCode::kInvalidArgument, path + message);
  };
  expect_line_error("bad.jsonl", sample(0) + "{\"index\": \n", ":2: not JSON");
  expect_line_error("array.jsonl", "[1, 2]\n", ":1: not a JSON object");
  expect_line_error("noindex.jsonl", "\n{\"input\": \"Q\"}\n", ":2: sample has no \"index\" field");
  expect_line_error("noprefix.jsonl", "{\"index\": 1, \"input\": \"Q\", \"outputs\": [\"1\"]}",
                    ":1: sample has no \"answer_prefix\" field");
  expect_line_error(
      "type.jsonl",
      "{\"index\": 1, \"input\": \"Q\", \"outputs\": \"42\", \"answer_prefix\": \"\"}",
      ":1: field \"outputs\" has the wrong type (string)");
  expect_line_error(
      "index.jsonl",
      "{\"index\": \"a\", \"input\": \"Q\", \"outputs\": [], \"answer_prefix\": \"\"}",
      ":1: field \"index\" has the wrong type (string)");
  expect_line_error("noout.jsonl",
                    "{\"index\": 1, \"input\": \"Q\", \"outputs\": [], \"answer_prefix\": \"\"}",
                    ":1: \"outputs\" is empty");
  expect_line_error("deep.jsonl", std::string(1000, '[') + std::string(1000, ']'),
                    ":1: JSON nested deeper than");
  expect_line_error("empty.jsonl", "\n \n", ": no samples");
  expect_error([&] { read_ruler_jsonl(dir() + "/none.jsonl"); }, ErrorCode::kNotFound,
               "cannot open RULER samples file " + dir() + "/none.jsonl");
}

TEST(RulerTable, TasksByLengthsWithAverages) {
  const std::vector<RulerCellScore> cells = {
      {"vt", 4096, 2, 1.5},            // 75
      {"niah_single_1", 4096, 3, 3},   // 100
      {"niah_single_1", 32768, 4, 1},  // 25
      {"cwe", 32768, 1, 0.3},          // 30
  };
  EXPECT_EQ(format_ruler_table(cells),
            "task              4096    32768      avg\n"
            "niah_single_1   100.00    25.00    62.50\n"
            "vt               75.00        -    75.00\n"
            "cwe                  -    30.00    30.00\n"
            "average          87.50    27.50    57.50\n");
  // RULER rounds a cell's score to 2 decimals.
  EXPECT_DOUBLE_EQ((RulerCellScore{"vt", 4096, 3, 1}.percent()), 33.33);
  EXPECT_DOUBLE_EQ((RulerCellScore{"vt", 4096, 3, 2}.percent()), 66.67);
}
