// longctx generate: one prompt (text, chat message or token ids) streamed to stdout with a
// summary line on stderr; several prompts (repeat --prompt or --ids) run as one batch with a
// progress bar on stderr, each output printed when all are done.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "command.h"
#include "generate_common.h"
#include "longctx/core/error.h"

namespace longctx::cli {
namespace {

struct Options {
  GenerateOptions gen;
  std::vector<std::string> prompts;
  std::vector<std::string> prompt_files;  // "-": standard input
  std::vector<std::string> ids;
  bool chat = false;
  bool no_summary = false;
};

void print_output(const LLM& llm, const RequestOutput& out) {
  if (llm.tokenizer() != nullptr) {
    std::fwrite(out.text.data(), 1, out.text.size(), stdout);
  } else {
    for (size_t i = 0; i < out.token_ids.size(); ++i) {
      std::fprintf(stdout, i == 0 ? "%d" : " %d", out.token_ids[i]);
    }
  }
  std::fputc('\n', stdout);
}

void run(Options& o) {
  LONGCTX_CHECK((o.prompts.empty() && o.prompt_files.empty()) != o.ids.empty(),
                ErrorCode::kInvalidArgument,
                "give --prompt TEXT, --prompt-file PATH (- for standard input) or --ids 1,2,3");
  LONGCTX_CHECK(std::count(o.prompt_files.begin(), o.prompt_files.end(), "-") <= 1,
                ErrorCode::kInvalidArgument, "--prompt-file -: standard input can be read once");
  // An empty prompt is most often a failed $(...) substitution; generating from BOS alone would
  // print text and exit 0 as if it had worked.
  for (const std::string& text : o.prompts)
    LONGCTX_CHECK(!text.empty(), ErrorCode::kInvalidArgument, "--prompt: the prompt is empty");
  for (const std::string& path : o.prompt_files) {
    o.prompts.push_back(read_prompt_file(path));
    LONGCTX_CHECK(!o.prompts.back().empty(), ErrorCode::kInvalidArgument,
                  "--prompt-file {}: the prompt is empty", path);
  }
  auto llm = make_llm(o.gen);
  std::vector<Prompt> prompts;
  for (const auto& text : o.prompts) {
    if (!o.chat) {
      prompts.emplace_back(text);
      continue;
    }
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "user"}, {"content", text}});
    Prompt p(llm->render_chat(messages.dump(), /*add_generation_prompt=*/true));
    p.add_special_tokens = false;  // the template wrote them
    prompts.push_back(std::move(p));
  }
  LONGCTX_CHECK(!o.chat || o.ids.empty(), ErrorCode::kInvalidArgument,
                "--chat needs --prompt text");
  for (const auto& ids : o.ids) prompts.emplace_back(parse_ids(ids));

  if (prompts.size() == 1) {
    RequestOutput out = stream_one(*llm, prompts[0], o.gen.sampling);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!o.no_summary) std::fprintf(stderr, "%s\n", summary_line(out).c_str());
    return;
  }
  auto outs = llm->generate(prompts, o.gen.sampling, /*use_progress_bar=*/true);
  for (const RequestOutput& out : outs) {
    std::fprintf(stdout, "=== prompt %zu ===\n", out.index);
    print_output(*llm, out);
    if (!o.no_summary) std::fprintf(stderr, "[%zu] %s\n", out.index, summary_line(out).c_str());
  }
  std::fflush(stdout);
}

CommandRegistration reg("generate", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->gen.sampling.max_tokens = 256;
  auto* cmd = app.add_subcommand("generate", "Generate text (one prompt streams to stdout)");
  add_engine_options(*cmd, o->gen);
  cmd->add_option("--prompt,-p", o->prompts, "prompt text (repeat for a batch)")
      ->allow_extra_args(false);
  cmd->add_option("--prompt-file,-f", o->prompt_files,
                  "read a prompt from a file, - for standard input (repeat for a batch; for "
                  "prompts past the shell's argument limit)")
      ->allow_extra_args(false);
  cmd->add_option("--ids", o->ids, "prompt token ids, comma separated (repeat for a batch)")
      ->allow_extra_args(false);
  cmd->add_flag("--chat", o->chat, "wrap each prompt as a user message in the chat template");
  cmd->add_flag("--no-summary", o->no_summary, "no summary line on stderr");
  add_sampling_options(*cmd, o->gen.sampling);
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
