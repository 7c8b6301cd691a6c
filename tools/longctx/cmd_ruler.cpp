// longctx ruler: a model's RULER scores on samples written by RULER's own generator, laid out as
// DIR/<length>/<task>/validation.jsonl (src/eval/ruler.h). Each sample's prompt is input +
// answer_prefix, encoded as any text prompt (with the tokenizer's special tokens, e.g. BOS),
// decoded greedily for RULER's tokens_to_generate of its task (or --max-tokens) and scored with
// RULER's metric of the task on RULER's postprocessed prediction. All samples of a (length,
// task) cell go to the engine in one generate() call. Prints a task x length table in percent;
// --output writes one JSON line per sample.
//
// A prompt that does not fit the context (prompt + max tokens > max model length) is an error
// naming the sample, raised before anything runs: a sample left out would change what a cell's
// score means.
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "eval/ruler.h"
#include "generate_common.h"
#include "longctx/core/error.h"

namespace longctx::cli {
namespace {

using eval::RulerCell;
using eval::RulerSample;

struct Options {
  GenerateOptions gen;
  std::string data;
  std::vector<std::string> tasks;
  std::vector<int64_t> lengths;
  int64_t limit = 0;
  std::string max_tokens;  // "" | "N" | "task=N,task=N"
  std::string output;
};

// --max-tokens: "N" for every task, or "task=N,..." for some; throws naming the bad item.
struct MaxTokens {
  int64_t all = 0;  // 0: RULER's per task
  std::map<std::string, int64_t, std::less<>> per_task;
  int64_t of(const eval::RulerTask& task) const {
    auto it = per_task.find(task.name);
    if (it != per_task.end()) return it->second;
    return all > 0 ? all : task.max_tokens;
  }
};

int64_t parse_positive(const std::string& text, const std::string& item) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  LONGCTX_CHECK(ec == std::errc() && p == text.data() + text.size() && v > 0,
                ErrorCode::kInvalidArgument,
                "--max-tokens '{}': expected a positive number of tokens, or task=N items", item);
  return v;
}

MaxTokens parse_max_tokens(const std::string& spec) {
  MaxTokens m;
  if (spec.empty()) return m;
  if (spec.find('=') == std::string::npos) {
    m.all = parse_positive(spec, spec);
    return m;
  }
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    LONGCTX_CHECK(eq != std::string::npos, ErrorCode::kInvalidArgument,
                  "--max-tokens '{}': expected task=N", item);
    const std::string task(eval::ruler_task(item.substr(0, eq)).name);
    m.per_task[task] = parse_positive(item.substr(eq + 1), item);
    pos = end + 1;
  }
  return m;
}

struct CellRun {
  RulerCell cell;
  std::vector<RulerSample> samples;
  std::vector<Prompt> prompts;  // token ids
  int64_t max_tokens = 0;
};

void run(Options& o) {
  const MaxTokens max_tokens = parse_max_tokens(o.max_tokens);
  std::vector<CellRun> runs;
  size_t total = 0;
  for (RulerCell& cell : eval::find_ruler_cells(o.data, o.tasks, o.lengths)) {
    CellRun r;
    r.samples = eval::read_ruler_jsonl(cell.path, o.limit);
    r.max_tokens = max_tokens.of(*cell.task);
    r.cell = std::move(cell);
    total += r.samples.size();
    runs.push_back(std::move(r));
  }

  std::ofstream out;
  if (!o.output.empty()) {
    out.open(o.output);
    LONGCTX_CHECK(out.good(), ErrorCode::kIo, "cannot write {}", o.output);
  }
  auto llm = make_llm(o.gen);
  LONGCTX_CHECK(llm->tokenizer() != nullptr, ErrorCode::kInvalidArgument, "{}",
                "RULER samples are text: the model needs a tokenizer (--tokenizer DIR)");
  // Every prompt is encoded (and checked against the context) before any runs.
  std::string first_too_long;
  size_t too_long = 0;
  for (CellRun& r : runs) {
    for (RulerSample& s : r.samples) {
      std::vector<int32_t> ids = llm->encode(Prompt(s.prompt()));
      // Only the ids are needed from here on; at 128K a cell's text is tens of MB.
      std::string().swap(s.input);
      const auto n = static_cast<int64_t>(ids.size());
      // As a difference: n + max_tokens overflows for --max-tokens near INT64_MAX.
      if (r.max_tokens > llm->max_model_len() - n) {
        if (too_long++ == 0) {
          first_too_long = fmt::format(
              "{}: {} prompt tokens + {} to generate exceed the context "
              "({} tokens)",
              s.where, n, r.max_tokens, llm->max_model_len());
        }
      }
      r.prompts.emplace_back(std::move(ids));
    }
  }
  LONGCTX_CHECK(too_long == 0, ErrorCode::kOutOfRange,
                "{}; {} of {} samples do not fit (leave their lengths out with --lengths)",
                first_too_long, too_long, total);

  std::vector<eval::RulerCellScore> scores;
  const auto t_start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < runs.size(); ++i) {
    CellRun& r = runs[i];
    const auto t0 = std::chrono::steady_clock::now();
    SamplingParams sp = o.gen.sampling;
    sp.temperature = 0;  // greedy, as RULER's runs
    sp.max_tokens = r.max_tokens;
    auto outs = llm->generate(r.prompts, sp, /*use_progress_bar=*/true);
    eval::RulerCellScore cell{std::string(r.cell.task->name), r.cell.length};
    for (size_t k = 0; k < r.samples.size(); ++k) {
      const RulerSample& s = r.samples[k];
      const RequestOutput& res = outs.at(k);
      const double score = eval::ruler_score(*r.cell.task, res.text, s.outputs);
      cell.samples += 1;
      cell.score_sum += score;
      if (out.is_open()) {
        nlohmann::ordered_json j = {{"length", r.cell.length},
                                    {"task", cell.task},
                                    {"index", s.index},
                                    {"prediction", res.text},
                                    {"outputs", s.outputs},
                                    {"score", score},
                                    {"sample_length", s.length},
                                    {"prompt_tokens", res.metrics.num_prompt_tokens},
                                    {"generated_tokens", res.metrics.num_generated_tokens},
                                    {"finish_reason", finish_reason_name(res.finish_reason)}};
        // Generated text may end inside a UTF-8 sequence; the file stays valid JSON.
        out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
      }
    }
    if (out.is_open()) {
      out.flush();
      LONGCTX_CHECK(out.good(), ErrorCode::kIo, "cannot write {}", o.output);
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "ruler: [%zu/%zu] %lld %s: %lld samples, %.2f%%, %.1f s\n", i + 1,
                 runs.size(), static_cast<long long>(r.cell.length), cell.task.c_str(),
                 static_cast<long long>(cell.samples), cell.percent(), secs);
    scores.push_back(std::move(cell));
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::fputs(eval::format_ruler_table(scores).c_str(), stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "ruler: %zu samples in %zu cells, %.1f s\n", total, runs.size(), secs);
}

CommandRegistration reg("ruler", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "ruler",
      "RULER scores on samples from RULER's generator (DIR/<length>/<task>/validation.jsonl), "
      "greedy, per task and length");
  add_engine_options(*cmd, o->gen);
  cmd->add_option("--data,-d", o->data, "RULER data folder: DIR/<length>/<task>/validation.jsonl")
      ->required();
  cmd->add_option("--tasks", o->tasks, "only these tasks, comma separated (e.g. niah_single_1,vt)")
      ->delimiter(',');
  cmd->add_option("--lengths", o->lengths, "only these lengths, comma separated (e.g. 4096,32768)")
      ->delimiter(',');
  cmd->add_option("--limit", o->limit, "first N samples of each task and length (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-tokens,-n", o->max_tokens,
                  "tokens to generate: N for every task or task=N,... (default: RULER's per "
                  "task: niah 128, vt 30, cwe 120, fwe 50, qa 32)");
  cmd->add_option("--output,-o", o->output,
                  "write one JSON line per sample (length, task, index, prediction, outputs, "
                  "score, ...)");
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
