// longctx chat: an interactive multi-turn conversation through the model's chat template. Reads
// one user message per stdin line; "/exit" or end of input ends it. Replies stream to stdout.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "generate_common.h"
#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"

namespace longctx::cli {
namespace {

struct Options {
  GenerateOptions gen;
  std::string system;
  bool no_thinking = false;
  bool summary = false;
};

void run(Options& o) {
  auto llm = make_llm(o.gen);
  LONGCTX_CHECK(llm->tokenizer() != nullptr, ErrorCode::kInvalidArgument,
                "chat needs a tokenizer: the model folder has no tokenizer.json (use --tokenizer)");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (o.no_thinking) extra["enable_thinking"] = false;
  const bool interactive = isatty(fileno(stdin)) != 0;
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stderr);
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    Prompt prompt(llm->render_chat(messages.dump(), /*add_generation_prompt=*/true, extra.dump()));
    prompt.add_special_tokens = false;
    // The whole conversation is prefilled again each turn (no prefix cache yet); the reply must
    // fit what is left of the context.
    const int64_t used = static_cast<int64_t>(llm->encode(prompt).size());
    LONGCTX_CHECK(used < llm->max_model_len(), ErrorCode::kOutOfRange,
                  "the conversation has {} tokens, the context is {}: start a new chat", used,
                  llm->max_model_len());
    RequestOutput out = stream_one(*llm, prompt, o.gen.sampling);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (o.summary) std::fprintf(stderr, "[%s]\n", summary_line(out).c_str());
    messages.push_back({{"role", "assistant"}, {"content", out.text}});
  }
}

CommandRegistration reg("chat", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->gen.sampling.max_tokens = 1024;
  auto* cmd = app.add_subcommand("chat", "Interactive chat (stdin lines; /exit or EOF ends)");
  add_engine_options(*cmd, o->gen);
  add_sampling_options(*cmd, o->gen.sampling);
  cmd->add_option("--system", o->system, "system message");
  cmd->add_flag("--no-thinking", o->no_thinking, "enable_thinking=false (Qwen3 templates)");
  cmd->add_flag("--summary", o->summary, "a timing line on stderr after each reply");
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
