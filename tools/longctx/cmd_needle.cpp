// longctx needle: RULER-style retrieval accuracy of a model on samples written by
// tools/needle_model/needle_data.py (one JSON object per line: task, length, input,
// answer_prefix, outputs, answer), decoded greedily. The prompt is input + answer_prefix, encoded
// with the tokenizer's special tokens (BOS). Per (task, length) it reports
//   exact: the generated text is `answer` and generation stopped at EOS (the format the needle
//          model is trained to produce; what tools/needle_model/eval.py counts), and
//   ruler: RULER's string_match_all, the mean over samples of the fraction of `outputs` found in
//          the generated text (case-insensitive),
// both in percent, and the decode speed: tokens after the first over the time after the first,
// summed over the cell's samples (run with --max-num-seqs 1 for one sequence's speed), with
// speculative decoding's mean acceptance length. This is the accuracy yardstick of the engine
// itself: offload and sparse attention are judged by it against the all-on-GPU path.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "command.h"
#include "eval/jsonl.h"
#include "generate_common.h"
#include "longctx/core/error.h"

namespace longctx::cli {
namespace {

struct Sample {
  std::string where;  // "FILE:LINE", for messages
  std::string task;
  int64_t length = 0;  // the generator's target length (0 when the record has none)
  std::string prompt;  // input + answer_prefix
  std::vector<std::string> outputs;
  std::string answer;
};

struct Options {
  GenerateOptions gen;
  std::vector<std::string> samples;
  int64_t limit = 0;
  int show_failures = 5;
  double fail_below = -1;
  std::string out;
};

std::vector<Sample> read_samples(const std::string& path, int64_t limit) {
  std::vector<Sample> out;
  eval::for_each_jsonl_object(
      path, "samples", [&](const nlohmann::json& j, const std::string& where) {
        Sample s;
        s.where = where;
        s.task = eval::json_field<std::string>(j, "task", where);
        s.length = j.contains("length") ? eval::json_field<int64_t>(j, "length", where) : 0;
        s.prompt = eval::json_field<std::string>(j, "input", where) +
                   eval::json_field<std::string>(j, "answer_prefix", where);
        s.outputs = eval::json_field<std::vector<std::string>>(j, "outputs", where);
        s.answer = eval::json_field<std::string>(j, "answer", where);
        LONGCTX_CHECK(!s.outputs.empty(), ErrorCode::kInvalidArgument, "{}: \"outputs\" is empty",
                      where);
        out.push_back(std::move(s));
        return limit <= 0 || static_cast<int64_t>(out.size()) < limit;
      });
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// RULER's string_match_all for one sample: the fraction of references found in the prediction.
double string_match_all(const std::string& prediction, const std::vector<std::string>& refs) {
  const std::string p = lower(prediction);
  double found = 0;
  for (const auto& r : refs) found += p.find(lower(r)) != std::string::npos ? 1.0 : 0.0;
  return found / static_cast<double>(refs.size());
}

struct Cell {
  int n = 0;
  int exact = 0;
  double ruler = 0;           // sum over samples
  int64_t decode_tokens = 0;  // after each sample's first
  double decode_seconds = 0;
  RequestMetrics spec;  // the speculative counters summed over the samples
};

void run(Options& o) {
  std::vector<Sample> samples;
  for (const auto& path : o.samples) {
    auto s = read_samples(path, o.limit);
    samples.insert(samples.end(), std::make_move_iterator(s.begin()),
                   std::make_move_iterator(s.end()));
  }
  o.gen.sampling.temperature = 0;  // greedy, as RULER and eval.py
  o.gen.sampling.logprobs = 2;     // the top-2 margin of every token goes into --out
  auto llm = make_llm(o.gen);
  LONGCTX_CHECK(llm->tokenizer() != nullptr, ErrorCode::kInvalidArgument, "{}",
                "needle samples are text: the model needs a tokenizer (--tokenizer DIR)");
  std::vector<Prompt> prompts;
  for (const Sample& s : samples) {
    // Encoded once here (the check needs the length) and passed on as ids.
    std::vector<int32_t> ids = llm->encode(Prompt(s.prompt));
    const auto n = static_cast<int64_t>(ids.size());
    // A too-long sample would otherwise fail the whole batch without saying which one.
    // As a difference: n + max_tokens overflows for --max-tokens near INT64_MAX.
    LONGCTX_CHECK(o.gen.sampling.max_tokens <= llm->max_model_len() - n, ErrorCode::kOutOfRange,
                  "{}: {} prompt tokens + {} to generate exceed the context ({} tokens)", s.where,
                  n, o.gen.sampling.max_tokens, llm->max_model_len());
    prompts.emplace_back(std::move(ids));
  }
  auto outs = llm->generate(prompts, o.gen.sampling, /*use_progress_bar=*/true);

  std::map<std::pair<std::string, int64_t>, Cell> cells;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  int shown = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const RequestOutput& out = outs.at(i);
    const bool exact = out.text == s.answer && out.stop_reason.kind == StopReason::Kind::kEos;
    const double ruler = string_match_all(out.text, s.outputs);
    Cell& c = cells[{s.task, s.length}];
    c.n += 1;
    c.exact += exact ? 1 : 0;
    c.ruler += ruler;
    c.decode_tokens += std::max<int64_t>(0, out.metrics.num_generated_tokens - 1);
    c.decode_seconds += out.metrics.decode_seconds();
    c.spec.add_speculative(out.metrics);
    if (!exact && shown < o.show_failures) {
      ++shown;
      std::fprintf(stdout, "failure %s (%s L=%lld): expected \"%s\" got \"%s\" (%s)\n",
                   s.where.c_str(), s.task.c_str(), static_cast<long long>(s.length),
                   s.answer.c_str(), out.text.c_str(), finish_reason_name(out.finish_reason));
    }
    std::vector<double> margins;  // top-1 minus top-2 logprob per generated token
    for (const TokenLogprobs& lp : out.logprobs)
      margins.push_back(lp.top.size() >= 2 ? lp.top[0].second - lp.top[1].second : 0.0);
    results.push_back({{"where", s.where},
                       {"task", s.task},
                       {"length", s.length},
                       {"prompt_tokens", out.metrics.num_prompt_tokens},
                       {"answer", s.answer},
                       {"prediction", out.text},
                       {"token_ids", out.token_ids},
                       {"top2_margins", margins},
                       {"exact", exact},
                       {"ruler", ruler}});
  }
  const bool speculative = o.gen.model.speculative.enabled();
  std::fprintf(stdout, "%-18s %8s %5s %8s %8s %9s%s\n", "task", "length", "n", "exact%", "ruler%",
               "decode/s", speculative ? "   accept" : "");
  std::string below;
  for (const auto& [key, c] : cells) {
    const double exact = 100.0 * c.exact / c.n;
    std::fprintf(stdout, "%-18s %8lld %5d %8.1f %8.1f %9.1f", key.first.c_str(),
                 static_cast<long long>(key.second), c.n, exact, 100.0 * c.ruler / c.n,
                 c.decode_seconds > 0 ? double(c.decode_tokens) / c.decode_seconds : 0.0);
    if (speculative) std::fprintf(stdout, " %8.2f", c.spec.mean_acceptance_length());
    std::fprintf(stdout, "\n");
    if (exact < o.fail_below && below.empty()) {
      below = key.first + " L=" + std::to_string(key.second) + ": exact " +
              std::to_string(c.exact) + "/" + std::to_string(c.n);
    }
  }
  const LLM::SparseStats sparse = llm->sparse_stats();
  if (sparse.prefill_blocks_causal > 0)
    std::fprintf(stdout, "sparse prefill density %.4f (%lld of %lld causal key blocks read)\n",
                 double(sparse.prefill_blocks_kept) / double(sparse.prefill_blocks_causal),
                 static_cast<long long>(sparse.prefill_blocks_kept),
                 static_cast<long long>(sparse.prefill_blocks_causal));
  // (Counted with KV offload on the GPU.)
  if (o.gen.model.sparse.quest_reuse && (sparse.pages_reused > 0 || sparse.host_bytes_read > 0))
    std::fprintf(stdout,
                 "quest reuse: %lld (page, KV head) pairs copied from kept pages; %.3f GB of host "
                 "pages read in place\n",
                 static_cast<long long>(sparse.pages_reused), double(sparse.host_bytes_read) / 1e9);
  std::fflush(stdout);
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    LONGCTX_CHECK(f.good(), ErrorCode::kIo, "cannot write {}", o.out);
    f << results.dump(1) << "\n";
  }
  LONGCTX_CHECK(below.empty(), ErrorCode::kOutOfRange, "{} is below --fail-below {}%", below,
                o.fail_below);
}

CommandRegistration reg("needle", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->gen.sampling.max_tokens = 64;
  auto* cmd = app.add_subcommand(
      "needle",
      "RULER-style accuracy on needle_data.py samples (JSONL), greedy: exact match and "
      "string_match_all per task and length");
  add_engine_options(*cmd, o->gen);
  cmd->add_option("--samples,-s", o->samples,
                  "JSONL file(s) from tools/needle_model/needle_data.py")
      ->required()
      ->allow_extra_args(false);
  cmd->add_option("--limit", o->limit, "first N samples of each file (0 = all)")
      ->capture_default_str();
  cmd->add_option("--max-tokens,-n", o->gen.sampling.max_tokens, "tokens to generate at most")
      ->capture_default_str();
  cmd->add_option("--show-failures", o->show_failures, "print this many wrong answers")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "write every sample's prediction and scores (JSON) here");
  cmd->add_option("--fail-below", o->fail_below,
                  "exit with an error when a (task, length) exact-match accuracy is below this "
                  "percentage");
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
