#include "generate_common.h"

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "longctx/core/error.h"
#include "longctx/core/logging.h"
#include "seed_option.h"
#include "token_ids.h"

namespace longctx::cli {

void add_engine_options(CLI::App& cmd, GenerateOptions& opts) {
  opts.model.add_to(&cmd);
  cmd.option_defaults()->group("Model");
  cmd.add_option("--tokenizer", opts.engine.tokenizer,
                 "folder with tokenizer.json (default: the model folder's)");
  cmd.add_option("--chat-template", opts.chat_template,
                 "a Jinja chat template file (or the template itself) instead of "
                 "tokenizer_config.json's");
  cmd.option_defaults()->group("Engine");
  cmd.add_option("--max-model-len", opts.engine.max_model_len,
                 "tokens per sequence (default: max_position_embeddings)");
  add_seed_option(cmd, "--engine-seed", opts.engine.seed, "seed for requests without --seed");
  cmd.option_defaults()->group("Options");
  cmd.add_option("--log-level", opts.log_level, "trace, debug, info, warn, error, off");
}

void add_sampling_options(CLI::App& cmd, SamplingParams& sp) {
  cmd.option_defaults()->group("Sampling");
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
  cmd.option_defaults()->group("Options");
}

std::unique_ptr<LLM> make_llm(const GenerateOptions& opts) {
  if (!opts.log_level.empty()) set_log_level(opts.log_level);
  opts.sampling.validate();
  std::shared_ptr<const Checkpoint> checkpoint = opts.model.load();
  EngineConfig engine = opts.engine;
  if (!opts.chat_template.empty()) engine.chat_template = read_chat_template(opts.chat_template);
  engine.model_options = opts.model.build_options(*checkpoint);
  opts.model.apply_to(engine);
  auto llm = std::make_unique<LLM>(std::move(checkpoint), engine);
  log_placement(*llm, opts.model);
  return llm;
}

void log_placement(const LLM& llm, const ModelOptions& model) {
  const std::string name = model.load_format == "dummy" ? "dummy:" + model.preset : model.model;
  const Device device = llm.device();
  std::string why;
  if (model.device == "auto")
    why = device.is_cuda() ? " (--device auto)" : " (--device auto: no CUDA device)";
  std::fprintf(stderr, "longctx: %s on %s%s, %s\n", name.c_str(), device.str().c_str(), why.c_str(),
               device.is_cuda() ? model.dtype.c_str() : "float32 reference");
  if (const GpuMemoryPlan* plan = llm.memory_plan())
    std::fprintf(stderr, "longctx: memory plan: %s\n", plan->str().c_str());
}

RequestOutput stream_one(LLM& llm, const Prompt& prompt, const SamplingParams& sp) {
  const bool has_text = llm.tokenizer() != nullptr;
  bool first_id = true;
  auto outs = llm.generate_stream(
      {prompt}, sp,
      [&](const StreamEvent& ev) {
        if (has_text) {
          std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
        } else {
          for (int32_t id : ev.new_token_ids) {
            std::fprintf(stdout, first_id ? "%d" : " %d", id);
            first_id = false;
          }
        }
        std::fflush(stdout);
      },
      StreamOptions{.prefill_progress = true});
  return std::move(outs.at(0));
}

std::string summary_line(const RequestOutput& out) {
  const RequestMetrics& m = out.metrics;
  std::string reason = finish_reason_name(out.finish_reason);
  if (out.stop_reason.kind != StopReason::Kind::kNone) reason += " (" + out.stop_reason.str() + ")";
  std::string line = fmt::format(
      "{} prompt + {} generated tokens, finish: {}; TTFT {:.1f} ms, prefill {:.1f} tok/s, "
      "decode {:.1f} tok/s",
      m.num_prompt_tokens, m.num_generated_tokens, reason, m.ttft() * 1e3, m.prefill_tokens_per_s(),
      m.decode_tokens_per_s());
  if (m.num_drafts > 0)
    line += fmt::format(
        "; speculative: mean acceptance length {:.2f} ({} of {} draft tokens in {} "
        "drafts accepted)",
        m.mean_acceptance_length(), m.num_accepted_tokens, m.num_draft_tokens, m.num_drafts);
  return line;
}

std::string read_chat_template(const std::string& file_or_text) {
  // As vLLM's --chat-template: a file's path, or the template in one line.
  if (std::filesystem::is_regular_file(file_or_text))
    return read_prompt_file(file_or_text, "--chat-template");
  LONGCTX_CHECK(
      file_or_text.find("{{") != std::string::npos || file_or_text.find("{%") != std::string::npos,
      ErrorCode::kNotFound,
      "--chat-template '{}': no such file, and not a template (no {{{{ or {{%)", file_or_text);
  return file_or_text;
}

std::string read_prompt_file(const std::string& path, const char* flag) {
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  LONGCTX_CHECK(f != nullptr, ErrorCode::kNotFound, "{} {}: cannot open ({})", flag, path,
                std::strerror(errno));
  std::string text;
  std::array<char, 1 << 16> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) text.append(buf.data(), n);
  const bool failed = std::ferror(f) != 0;
  if (f != stdin) std::fclose(f);
  LONGCTX_CHECK(!failed, ErrorCode::kIo, "{} {}: read error", flag, path);
  return text;
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
