#include "eval/ruler.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "eval/jsonl.h"
#include "longctx/core/error.h"
#include "template/util.h"

namespace longctx::eval {
namespace {

namespace fs = std::filesystem;

constexpr auto kAll = RulerMetric::kStringMatchAll;
constexpr auto kPart = RulerMetric::kStringMatchPart;

// Names and families: RULER's scripts/synthetic.yaml. tokens_to_generate per family: RULER's
// scripts/data/synthetic/constants.py (niah 128, variable_tracking 30, common_words_extraction
// 120, freq_words_extraction 50, qa 32). Metrics: scripts/eval/synthetic/constants.py (qa:
// string_match_part, every other family: string_match_all).
constexpr RulerTask kTasks[] = {
    {"niah_single_1", "niah", 128, kAll},
    {"niah_single_2", "niah", 128, kAll},
    {"niah_single_3", "niah", 128, kAll},
    {"niah_multikey_1", "niah", 128, kAll},
    {"niah_multikey_2", "niah", 128, kAll},
    {"niah_multikey_3", "niah", 128, kAll},
    {"niah_multivalue", "niah", 128, kAll},
    {"niah_multiquery", "niah", 128, kAll},
    {"vt", "variable_tracking", 30, kAll},
    {"cwe", "common_words_extraction", 120, kAll},
    {"fwe", "freq_words_extraction", 50, kAll},
    {"qa_1", "qa", 32, kPart},
    {"qa_2", "qa", 32, kPart},
};

const RulerTask* find_task(std::string_view name) {
  for (const RulerTask& t : kTasks)
    if (t.name == name) return &t;
  return nullptr;
}

std::string known_task_names() {
  std::string s;
  for (const RulerTask& t : kTasks) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

size_t task_order(std::string_view name) {
  for (size_t i = 0; i < std::size(kTasks); ++i)
    if (kTasks[i].name == name) return i;
  return std::size(kTasks);
}

std::vector<std::string> lowered(const std::vector<std::string>& references) {
  LONGCTX_CHECK(!references.empty(), ErrorCode::kInvalidArgument,
                "RULER metric: a sample needs at least one reference");
  std::vector<std::string> out;
  out.reserve(references.size());
  for (const auto& r : references) out.push_back(jinja::str_lower(r));
  return out;
}

// A folder name that is a positive decimal number.
bool parse_length(const std::string& name, int64_t* out) {
  if (name.empty() || name[0] == '0') return false;
  const char* end = name.data() + name.size();
  auto [p, ec] = std::from_chars(name.data(), end, *out);
  return ec == std::errc() && p == end && *out > 0;
}

}  // namespace

const char* ruler_metric_name(RulerMetric metric) {
  return metric == RulerMetric::kStringMatchPart ? "string_match_part" : "string_match_all";
}

std::span<const RulerTask> ruler_tasks() { return kTasks; }

const RulerTask& ruler_task(std::string_view name) {
  const RulerTask* t = find_task(name);
  LONGCTX_CHECK(t != nullptr, ErrorCode::kInvalidArgument, "unknown RULER task '{}' (known: {})",
                name, known_task_names());
  return *t;
}

std::string ruler_postprocess(std::string_view prediction) {
  std::string s = jinja::py_strip(std::string(prediction), nullptr, true, true);
  // UTF-8 never uses bytes below 0x20 inside a multi-byte character, so bytewise is exact.
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  return jinja::py_strip(s, nullptr, true, true);
}

double string_match_all(std::string_view prediction, const std::vector<std::string>& references) {
  const std::vector<std::string> refs = lowered(references);
  const std::string pred = jinja::str_lower(std::string(prediction));
  double found = 0;
  for (const auto& r : refs) found += pred.find(r) != std::string::npos ? 1.0 : 0.0;
  return found / static_cast<double>(refs.size());
}

double string_match_part(std::string_view prediction, const std::vector<std::string>& references) {
  const std::vector<std::string> refs = lowered(references);
  const std::string pred = jinja::str_lower(std::string(prediction));
  for (const auto& r : refs)
    if (pred.find(r) != std::string::npos) return 1.0;
  return 0.0;
}

double ruler_score(const RulerTask& task, std::string_view raw_prediction,
                   const std::vector<std::string>& references) {
  const std::string pred = ruler_postprocess(raw_prediction);
  return task.metric == RulerMetric::kStringMatchPart ? string_match_part(pred, references)
                                                      : string_match_all(pred, references);
}

std::vector<RulerSample> read_ruler_jsonl(const std::string& path, int64_t limit) {
  std::vector<RulerSample> out;
  for_each_jsonl_object(path, "RULER samples",
                        [&](const nlohmann::json& j, const std::string& where) {
                          RulerSample s;
                          s.where = where;
                          s.index = json_field<int64_t>(j, "index", where);
                          s.input = json_field<std::string>(j, "input", where);
                          s.answer_prefix = json_field<std::string>(j, "answer_prefix", where);
                          s.outputs = json_field<std::vector<std::string>>(j, "outputs", where);
                          if (j.contains("length"))
                            s.length = json_field<int64_t>(j, "length", where);
                          LONGCTX_CHECK(!s.outputs.empty(), ErrorCode::kInvalidArgument,
                                        "{}: \"outputs\" is empty", where);
                          out.push_back(std::move(s));
                          return limit <= 0 || static_cast<int64_t>(out.size()) < limit;
                        });
  return out;
}

std::vector<RulerCell> find_ruler_cells(const std::string& dir,
                                        const std::vector<std::string>& tasks,
                                        const std::vector<int64_t>& lengths) {
  for (const auto& t : tasks) ruler_task(t);  // unknown names fail before the folder is read
  std::error_code ec;
  LONGCTX_CHECK(fs::is_directory(dir, ec), ErrorCode::kNotFound,
                "RULER data folder {} does not exist (expected {}/<length>/<task>/"
                "validation.jsonl)",
                dir, dir);
  const std::set<std::string> want_tasks(tasks.begin(), tasks.end());
  const std::set<int64_t> want_lengths(lengths.begin(), lengths.end());
  std::map<int64_t, fs::path> length_dirs;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.starts_with(".")) continue;
    int64_t length = 0;
    LONGCTX_CHECK(parse_length(name, &length), ErrorCode::kInvalidArgument,
                  "{}: not a length folder (expected {}/<length>/<task>/validation.jsonl)",
                  e.path().string(), dir);
    length_dirs[length] = e.path();
  }
  std::string present;
  for (const auto& [length, p] : length_dirs)
    present += (present.empty() ? "" : ", ") + std::to_string(length);
  for (int64_t length : want_lengths)
    LONGCTX_CHECK(length_dirs.count(length), ErrorCode::kNotFound,
                  "{}: no folder for length {} (lengths there: {})", dir, length,
                  present.empty() ? "none" : present);

  std::vector<RulerCell> cells;
  std::set<std::string> found_tasks;
  for (const auto& [length, length_dir] : length_dirs) {
    if (!want_lengths.empty() && !want_lengths.count(length)) continue;
    std::vector<RulerCell> row;
    for (const auto& e : fs::directory_iterator(length_dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_directory() || name.starts_with(".")) continue;
      if (!want_tasks.empty() && !want_tasks.count(name)) continue;
      const RulerTask* task = find_task(name);
      LONGCTX_CHECK(task != nullptr, ErrorCode::kInvalidArgument,
                    "{}: unknown RULER task '{}' (known: {}; --tasks picks some)",
                    e.path().string(), name, known_task_names());
      const fs::path file = e.path() / "validation.jsonl";
      LONGCTX_CHECK(fs::is_regular_file(file, ec), ErrorCode::kNotFound, "{}: no validation.jsonl",
                    e.path().string());
      row.push_back({length, task, file.string()});
      found_tasks.insert(name);
    }
    std::sort(row.begin(), row.end(), [](const RulerCell& a, const RulerCell& b) {
      return task_order(a.task->name) < task_order(b.task->name);
    });
    cells.insert(cells.end(), row.begin(), row.end());
  }
  for (const auto& t : want_tasks)
    LONGCTX_CHECK(found_tasks.count(t), ErrorCode::kNotFound,
                  "{}: task {} is in none of the length folders searched", dir, t);
  LONGCTX_CHECK(!cells.empty(), ErrorCode::kNotFound,
                "{}: no <length>/<task>/validation.jsonl found", dir);
  return cells;
}

double RulerCellScore::percent() const {
  if (samples == 0) return 0;
  return std::round(10000.0 * score_sum / static_cast<double>(samples)) / 100.0;
}

std::string format_ruler_table(const std::vector<RulerCellScore>& cells) {
  std::vector<std::string> tasks;
  std::set<int64_t> lengths;
  std::map<std::pair<std::string, int64_t>, double> pct;
  for (const auto& c : cells) {
    if (std::find(tasks.begin(), tasks.end(), c.task) == tasks.end()) tasks.push_back(c.task);
    lengths.insert(c.length);
    pct[{c.task, c.length}] = c.percent();
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const std::string& a, const std::string& b) {
    return task_order(a) < task_order(b);
  });
  size_t width = std::string_view("average").size();
  for (const auto& t : tasks) width = std::max(width, t.size());

  std::string out = fmt::format("{:<{}}", "task", width);
  for (int64_t length : lengths) out += fmt::format(" {:>8}", length);
  out += fmt::format(" {:>8}\n", "avg");
  const auto mean_cell = [](double sum, int n) {
    return n == 0 ? std::string("-") : fmt::format("{:.2f}", sum / n);
  };
  for (const auto& t : tasks) {
    out += fmt::format("{:<{}}", t, width);
    double sum = 0;
    int n = 0;
    for (int64_t length : lengths) {
      auto it = pct.find({t, length});
      out += fmt::format(" {:>8}", it == pct.end() ? "-" : fmt::format("{:.2f}", it->second));
      if (it != pct.end()) {
        sum += it->second;
        ++n;
      }
    }
    out += fmt::format(" {:>8}\n", mean_cell(sum, n));
  }
  out += fmt::format("{:<{}}", "average", width);
  double total = 0;
  int total_n = 0;
  for (int64_t length : lengths) {
    double sum = 0;
    int n = 0;
    for (const auto& t : tasks) {
      auto it = pct.find({t, length});
      if (it != pct.end()) {
        sum += it->second;
        ++n;
      }
    }
    out += fmt::format(" {:>8}", mean_cell(sum, n));
    total += sum;
    total_n += n;
  }
  out += fmt::format(" {:>8}\n", mean_cell(total, total_n));
  return out;
}

}  // namespace longctx::eval
