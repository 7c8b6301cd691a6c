#include "generate_common.h"

#include <fmt/format.h>

#include <cstdio>

#include "longctx/core/error.h"
#include "longctx/core/logging.h"
#include "seed_option.h"
#include "token_ids.h"

namespace longctx::cli {

void add_engine_options(CLI::App& cmd, GenerateOptions& opts) {
  opts.model.add_to(&cmd);
  cmd.add_option("--tokenizer", opts.engine.tokenizer,
                 "folder with tokenizer.json (default: the model folder's)");
  cmd.add_option("--max-model-len", opts.engine.max_model_len,
                 "tokens per sequence (default: max_position_embeddings)");
  add_seed_option(cmd, "--engine-seed", opts.engine.seed, "seed for requests without --seed");
  cmd.add_option("--log-level", opts.log_level, "trace, debug, info, warn, error, off");
}

void add_sampling_options(CLI::App& cmd, SamplingParams& sp) {
  cmd.add_option("--max-tokens,-n", sp.max_tokens, "tokens to generate at most")
      ->capture_default_str();
  cmd.add_option("--temperature,-t", sp.temperature, "0 = greedy")->capture_default_str();
  cmd.add_option("--top-p", sp.top_p, "nucleus sampling mass, (0, 1]")->capture_default_str();
  cmd.add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd.add_option("--min-p", sp.min_p, "drop tokens below min_p * top probability")
      ->capture_default_str();
  add_seed_option(cmd, "--seed", sp.seed, "per-request seed");
  cmd.add_option("--repetition-penalty", sp.repetition_penalty, "HF/vLLM repetition penalty")
      ->capture_default_str();
  cmd.add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty")
      ->capture_default_str();
  cmd.add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty")
      ->capture_default_str();
  cmd.add_option("--stop", sp.stop, "stop string (repeatable); never printed")
      ->allow_extra_args(false);
  cmd.add_option("--stop-token-ids", sp.stop_token_ids, "token ids that end generation")
      ->delimiter(',');
  cmd.add_flag("--ignore-eos", sp.ignore_eos, "keep generating past the model's EOS");
}

std::unique_ptr<LLM> make_llm(const GenerateOptions& opts) {
  if (!opts.log_level.empty()) set_log_level(opts.log_level);
  opts.sampling.validate();
  std::shared_ptr<const Checkpoint> checkpoint = opts.model.load();
  EngineConfig engine = opts.engine;
  engine.model_options = opts.model.build_options(*checkpoint);
  opts.model.apply_to(engine);
  return std::make_unique<LLM>(std::move(checkpoint), engine);
}

RequestOutput stream_one(LLM& llm, const Prompt& prompt, const SamplingParams& sp) {
  const bool has_text = llm.tokenizer() != nullptr;
  bool first_id = true;
  auto outs = llm.generate_stream({prompt}, sp, [&](const StreamEvent& ev) {
    if (has_text) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
    } else {
      for (int32_t id : ev.new_token_ids) {
        std::fprintf(stdout, first_id ? "%d" : " %d", id);
        first_id = false;
      }
    }
    std::fflush(stdout);
  });
  return std::move(outs.at(0));
}

std::string summary_line(const RequestOutput& out) {
  const RequestMetrics& m = out.metrics;
  std::string reason = finish_reason_name(out.finish_reason);
  if (out.stop_reason.kind != StopReason::Kind::kNone) reason += " (" + out.stop_reason.str() + ")";
  return fmt::format(
      "{} prompt + {} generated tokens, finish: {}; TTFT {:.1f} ms, prefill {:.1f} tok/s, "
      "decode {:.1f} tok/s",
      m.num_prompt_tokens, m.num_generated_tokens, reason, m.ttft() * 1e3, m.prefill_tokens_per_s(),
      m.decode_tokens_per_s());
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty() || end < text.size()) ids.push_back(parse_token_id(item, "--ids"));
    pos = end + 1;
  }
  return ids;
}

}  // namespace longctx::cli
