// The `longctx chat` loop: reads messages (line_editor.h), handles slash commands locally,
// keeps the conversation within the context, and streams each reply through the LLM API, where
// Ctrl-C aborts the request in the engine (the same path on the CPU and the GPU).
#pragma once

#include <string>

#include "longctx/llm.h"

namespace longctx::cli {

struct ChatOptions {
  std::string system;         // the system message; empty: none
  bool no_thinking = false;   // enable_thinking=false for the template (Qwen3)
  bool summary = false;       // a timing line on stderr after each reply
  std::string history_file;   // line history across sessions (terminal only); empty: none
  std::string first_message;  // sent before the first prompt (--prompt-file); empty: none
};

// Runs until /exit, end of input (Ctrl-D), or Ctrl-C twice at an empty prompt.
void run_chat(LLM& llm, const SamplingParams& sampling, const ChatOptions& options);

}  // namespace longctx::cli
