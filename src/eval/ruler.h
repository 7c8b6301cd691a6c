// RULER (NVIDIA's long-context benchmark) on the engine's side: its task table, its metrics with
// its prediction postprocessing, and a reader for the samples its generator writes, laid out as
//   DIR/<length>/<task>/validation.jsonl   (one JSON object a line: index, input, outputs,
//                                           answer_prefix, length)
// The prompt RULER measured is `input + answer_prefix`: its generators format the whole
// template, answer prefix included, then cut it at the prefix (rfind of its first 10
// characters), so the concatenation is the prompt exactly. `longctx ruler` runs it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longctx::eval {

enum class RulerMetric {
  kStringMatchAll,   // the fraction of references found in the prediction
  kStringMatchPart,  // 1 when any reference is found in the prediction
};
const char* ruler_metric_name(RulerMetric metric);  // "string_match_all" | "string_match_part"

struct RulerTask {
  std::string_view name;    // RULER's task name (scripts/synthetic.yaml), e.g. "niah_single_1"
  std::string_view family;  // its generator / config, e.g. "niah", "variable_tracking"
  int64_t max_tokens = 0;   // RULER's tokens_to_generate for the family
  RulerMetric metric = RulerMetric::kStringMatchAll;
};

// The tasks of RULER's synthetic.yaml, in its order (the order tables list them in).
std::span<const RulerTask> ruler_tasks();
// The task named `name`; throws Error(kInvalidArgument) listing the known names otherwise.
const RulerTask& ruler_task(std::string_view name);

// RULER's postprocess_pred (scripts/eval/evaluate.py): strip whitespace, turn every control
// character (U+0000..U+001F) into "\n", strip again.
std::string ruler_postprocess(std::string_view prediction);
// RULER's per-sample metrics (scripts/eval/synthetic/constants.py), case-insensitive (Python's
// str.lower(); here Latin, Greek and Cyrillic letters), on an already postprocessed prediction.
// `references` must not be empty (Error(kInvalidArgument)).
double string_match_all(std::string_view prediction, const std::vector<std::string>& references);
double string_match_part(std::string_view prediction, const std::vector<std::string>& references);
// The task's metric on the raw model output (postprocessed first), in [0, 1].
double ruler_score(const RulerTask& task, std::string_view raw_prediction,
                   const std::vector<std::string>& references);

struct RulerSample {
  std::string where;  // "FILE:LINE", for messages
  int64_t index = 0;  // RULER's sample index
  std::string input;
  std::string answer_prefix;
  std::vector<std::string> outputs;  // the references; never empty
  int64_t length = -1;               // RULER's token count (its tokenizer); -1 when absent
  std::string prompt() const { return input + answer_prefix; }
};

// The samples of one validation.jsonl (blank lines skipped), the first `limit` when limit > 0.
// Throws Error naming the file and line: a missing file (kNotFound), a line that is not a JSON
// object, a missing or mistyped field, empty `outputs`, a file without samples
// (kInvalidArgument).
std::vector<RulerSample> read_ruler_jsonl(const std::string& path, int64_t limit = 0);

struct RulerCell {
  int64_t length = 0;  // the <length> folder
  const RulerTask* task = nullptr;
  std::string path;  // DIR/<length>/<task>/validation.jsonl
};

// The (length, task) cells under `dir`, by length then in ruler_tasks() order, restricted to
// `tasks` / `lengths` when not empty. Throws Error: `dir` missing (kNotFound), a folder under it
// that is not a number, an unknown task folder (unless `tasks` leaves it out), a task folder
// without validation.jsonl, a requested length without a folder or a requested task in no
// length folder (kNotFound), unknown names in `tasks`, nothing found.
std::vector<RulerCell> find_ruler_cells(const std::string& dir,
                                        const std::vector<std::string>& tasks = {},
                                        const std::vector<int64_t>& lengths = {});

struct RulerCellScore {
  std::string task;
  int64_t length = 0;
  int64_t samples = 0;
  double score_sum = 0;    // sum of the samples' scores in [0, 1]
  double percent() const;  // RULER's cell score: 100 * mean, rounded to 2 decimals
};

// Tasks as rows (ruler_tasks() order, then unknown names) by lengths as columns, in percent,
// with an "avg" column (mean over the task's lengths) and an "average" row (mean over the
// tasks of each length); an absent cell prints "-" and is left out of the means.
std::string format_ruler_table(const std::vector<RulerCellScore>& cells);

}  // namespace longctx::eval
