// Shared by `longctx generate` and `longctx chat`: the engine and sampling options, and the
// streaming printer (UTF-8-safe text to stdout, a summary line to stderr).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longctx/llm.h"
#include "model_options.h"

namespace longctx::cli {

struct GenerateOptions {
  ModelOptions model;  // --model DIR | --load-format dummy --preset NAME
  EngineConfig engine;
  SamplingParams sampling;
  std::string log_level;
  std::string chat_template;  // --chat-template: a file or the template text
};

// Adds the model options, --tokenizer, --max-model-len, --engine-seed, --log-level.
void add_engine_options(CLI::App& cmd, GenerateOptions& opts);
void add_sampling_options(CLI::App& cmd, SamplingParams& sp);

// Builds the LLM (after validating the sampling parameters, so a typo fails before loading).
std::unique_ptr<LLM> make_llm(const GenerateOptions& opts);

// One line on stderr: the model, the device it runs on (and why, for --device auto), the dtype;
// and the GPU memory plan when there is one.
void log_placement(const LLM& llm, const ModelOptions& model);

// Runs one prompt, streaming its text (or, without a tokenizer, its token ids) to stdout.
RequestOutput stream_one(LLM& llm, const Prompt& prompt, const SamplingParams& sp);

// "12 prompt + 34 generated tokens, finish: length; TTFT 5.1 ms, prefill 2345 tok/s, ..."
std::string summary_line(const RequestOutput& out);

// The whole text of PATH, or of standard input for "-" (prompts past the argument-list limit);
// throws Error naming a file that cannot be read.
std::string read_prompt_file(const std::string& path, const char* flag = "--prompt-file");

// --chat-template's value: the file's text, or the value itself when it is a template.
std::string read_chat_template(const std::string& file_or_text);

// "1,2, 3" -> {1, 2, 3}; throws Error naming the bad item.
std::vector<int32_t> parse_ids(const std::string& text);

}  // namespace longctx::cli
