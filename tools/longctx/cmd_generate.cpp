// longctx generate: one prompt (text, chat message or token ids), streamed to stdout; a summary
// line on stderr.
#include <cstdio>

#include "command.h"
#include "generate_common.h"
#include "longctx/core/error.h"

namespace longctx::cli {
namespace {

struct Options {
  GenerateOptions gen;
  std::string prompt;
  std::string ids;
  bool chat = false;
  bool no_summary = false;
  bool has_prompt = false;  // --prompt given (possibly empty: the engine reports that)
  bool has_ids = false;
};

void run(Options& o) {
  LONGCTX_CHECK(o.has_prompt != o.has_ids, ErrorCode::kInvalidArgument,
                "give --prompt TEXT or --ids 1,2,3");
  auto llm = make_llm(o.gen);
  Prompt prompt = o.has_prompt ? Prompt(o.prompt) : Prompt(parse_ids(o.ids));
  if (o.chat) {
    LONGCTX_CHECK(!prompt.is_ids, ErrorCode::kInvalidArgument, "--chat needs --prompt text");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "user"}, {"content", o.prompt}});
    prompt = Prompt(llm->render_chat(messages, /*add_generation_prompt=*/true));
    prompt.add_special_tokens = false;  // the template wrote them
  }
  RequestOutput out = stream_one(*llm, prompt, o.gen.sampling);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!o.no_summary) std::fprintf(stderr, "%s\n", summary_line(out).c_str());
}

CommandRegistration reg("generate", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->gen.sampling.max_tokens = 256;
  auto* cmd = app.add_subcommand("generate", "Generate text from one prompt (streams to stdout)");
  add_engine_options(*cmd, o->gen);
  auto* prompt = cmd->add_option("--prompt,-p", o->prompt, "prompt text");
  auto* ids = cmd->add_option("--ids", o->ids, "prompt token ids, comma separated");
  prompt->excludes(ids);
  cmd->add_flag("--chat", o->chat, "wrap the prompt as a user message in the chat template");
  cmd->add_flag("--no-summary", o->no_summary, "no summary line on stderr");
  add_sampling_options(*cmd, o->gen.sampling);
  cmd->callback([o, cmd] {
    o->has_prompt = cmd->count("--prompt") > 0;
    o->has_ids = cmd->count("--ids") > 0;
    run(*o);
  });
});

}  // namespace
}  // namespace longctx::cli
