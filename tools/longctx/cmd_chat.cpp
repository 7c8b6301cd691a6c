// longctx chat: an interactive multi-turn conversation through the model's chat template, with
// line editing and history on a terminal, slash commands, Ctrl-C to stop a reply, and a context
// that never overflows (chat_repl.h). Piped stdin is read line by line, one message per line.
#include <fstream>
#include <sstream>
#include <string>

#include "chat_repl.h"
#include "command.h"
#include "generate_common.h"
#include "longctx/core/error.h"

namespace longctx::cli {
namespace {

struct Options {
  GenerateOptions gen;
  ChatOptions chat;
  std::string system_file;
  std::string prompt_file;  // the first message; "-": standard input
};

void run(Options& o) {
  if (!o.system_file.empty()) {
    std::ifstream f(o.system_file);
    LONGCTX_CHECK(f.good(), ErrorCode::kNotFound, "cannot read --system-file '{}'", o.system_file);
    std::stringstream text;
    text << f.rdbuf();
    o.chat.system = text.str();
    while (!o.chat.system.empty() && (o.chat.system.back() == '\n' || o.chat.system.back() == '\r'))
      o.chat.system.pop_back();
  }
  if (!o.prompt_file.empty()) {
    o.chat.first_message = read_prompt_file(o.prompt_file);
    LONGCTX_CHECK(!o.chat.first_message.empty(), ErrorCode::kInvalidArgument,
                  "--prompt-file {}: the prompt is empty", o.prompt_file);
  }
  auto llm = make_llm(o.gen);
  run_chat(*llm, o.gen.sampling, o.chat);
}

CommandRegistration reg("chat", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->gen.sampling.max_tokens = 1024;
  auto* cmd = app.add_subcommand(
      "chat",
      "Interactive chat (line editing on a terminal, /help for commands; piped: one "
      "message per line)");
  add_engine_options(*cmd, o->gen);
  add_sampling_options(*cmd, o->gen.sampling);
  auto* system = cmd->add_option("--system", o->chat.system, "system message");
  cmd->add_option("--system-file", o->system_file, "system message from a file")->excludes(system);
  cmd->add_option("--prompt-file,-f", o->prompt_file,
                  "the first message from a file (a document to ask about); - reads it from "
                  "standard input, which then ends the chat after the reply");
  cmd->add_option("--history-file", o->chat.history_file,
                  "keep the typed lines across sessions in this file (terminal only)");
  cmd->add_flag("--no-thinking", o->chat.no_thinking, "enable_thinking=false (Qwen3 templates)");
  cmd->add_flag("--summary", o->chat.summary, "a timing line on stderr after each reply");
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
