// longctx serve: the OpenAI-compatible HTTP server (docs/server.md), with vLLM's flag names.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "command.h"
#include "generate_common.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/logging.h"
#include "longctx/template/chat_template.h"
#include "server/server.h"

namespace longctx::cli {
namespace {

struct Options {
  GenerateOptions gen;
  server::ServeOptions serve;
  std::vector<std::string> served_model_names;
  std::string default_chat_template_kwargs;
  std::string max_request_body = "32MiB";
  std::string model_positional;  // `longctx serve MODEL`, as `vllm serve MODEL`
  std::string allowed_origins, allowed_methods = "*", allowed_headers = "*";
  std::string tool_call_parser, reasoning_parser;
};

// The chat template the server will render (--chat-template, else the tokenizer folder's
// tokenizer_config.json); empty when there is none.
std::string chat_template_text(const Options& o) {
  if (!o.gen.chat_template.empty()) return read_chat_template(o.gen.chat_template);
  std::string folder = o.gen.engine.tokenizer;
  if (folder.empty() && o.gen.model.load_format != "dummy") folder = o.gen.model.model;
  const std::filesystem::path config = std::filesystem::path(folder) / "tokenizer_config.json";
  if (folder.empty() || !std::filesystem::is_regular_file(config)) return "";
  try {
    return chat_template_source(parse_ordered_json(
        read_prompt_file(config.string(), "tokenizer_config.json"), config.string()));
  } catch (const Error&) {
    return "";  // no template: chat requests say so when they come
  }
}

// --tool-call-parser NAME, else the format the chat template shows; --reasoning-parser NAME.
server::OutputParsers output_parsers(const Options& o) {
  server::OutputParsers p;
  if (!o.tool_call_parser.empty()) {
    const auto kind = server::tool_parser_from_name(o.tool_call_parser);
    LONGCTX_CHECK(kind.has_value(), ErrorCode::kInvalidArgument,
                  "--tool-call-parser '{}': must be hermes, llama3_json or mistral",
                  o.tool_call_parser);
    p.tool = *kind;
  } else {
    p.tool = server::detect_tool_parser(chat_template_text(o));
    if (p.tool != server::ToolParserKind::kNone)
      std::fprintf(stderr, "longctx serve: tool-call parser %s (from the chat template)\n",
                   server::tool_parser_name(p.tool));
  }
  if (!o.reasoning_parser.empty()) {
    const auto kind = server::reasoning_parser_from_name(o.reasoning_parser);
    LONGCTX_CHECK(kind.has_value(), ErrorCode::kInvalidArgument,
                  "--reasoning-parser '{}': must be qwen3 or deepseek_r1", o.reasoning_parser);
    p.reasoning = *kind;
  }
  return p;
}

void run(Options& o) {
  // Before any thread starts, so that only serve_until_signal receives SIGINT/SIGTERM (a
  // signal during loading waits and shuts the server down as soon as it is up).
  server::block_shutdown_signals();
  if (o.serve.api.api_key.empty()) {
    if (const char* key = std::getenv("LONGCTX_API_KEY")) o.serve.api.api_key = key;
  }
  o.serve.transport.max_body_bytes = parse_byte_size(o.max_request_body, "--max-request-body");
  if (!o.model_positional.empty()) {
    LONGCTX_CHECK(o.gen.model.model.empty() || o.gen.model.model == o.model_positional,
                  ErrorCode::kInvalidArgument,
                  "the model is given twice: '{}' (positional) and --model '{}'; give one",
                  o.model_positional, o.gen.model.model);
    o.gen.model.model = o.model_positional;
  }
  server::CorsOptions& cors = o.serve.transport.cors;
  cors.allowed_origins = server::split_comma_list(o.allowed_origins);
  cors.allowed_methods = server::split_comma_list(o.allowed_methods);
  cors.allowed_headers = server::split_comma_list(o.allowed_headers);
  cors.validate();
  if (!o.default_chat_template_kwargs.empty()) {
    o.serve.api.default_chat_template_kwargs =
        parse_ordered_json(o.default_chat_template_kwargs, "--default-chat-template-kwargs");
    LONGCTX_CHECK(o.serve.api.default_chat_template_kwargs.is_object(), ErrorCode::kInvalidArgument,
                  "--default-chat-template-kwargs must be a JSON object, e.g. '{}'",
                  R"({"enable_thinking": false})");
  }
  o.serve.api.parsers = output_parsers(o);
  const ModelOptions& m = o.gen.model;
  if (o.served_model_names.empty())
    o.served_model_names.push_back(m.load_format == "dummy" ? m.preset : m.model);
  o.serve.api.served_model_names = o.served_model_names;
  o.serve.api.model_root = m.load_format == "dummy" ? m.preset : m.model;
  auto llm = make_llm(o.gen);
  server::Server srv(*llm, o.serve);
  std::fprintf(stderr, "longctx serve: listening on http://%s:%d (model %s, context %lld)\n",
               o.serve.transport.host.c_str(), srv.port(), o.served_model_names[0].c_str(),
               static_cast<long long>(llm->max_model_len()));
  std::fflush(stderr);
  server::serve_until_signal(srv, o.serve.drain_timeout_s);
  std::fprintf(stderr, "longctx serve: stopped\n");
}

CommandRegistration reg("serve", [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/server.md)");
  add_engine_options(*cmd, o->gen);
  cmd->add_option("model", o->model_positional,
                  "checkpoint folder (as `vllm serve MODEL`; the same as --model)");
  cmd->option_defaults()->group("Server");
  cmd->add_option("--host", o->serve.transport.host,
                  "address or host name to listen on (e.g. 0.0.0.0, ::, localhost)")
      ->capture_default_str();
  cmd->add_option("--port", o->serve.transport.port, "port (0: any free port)")
      ->capture_default_str();
  cmd->add_option("--api-key", o->serve.api.api_key,
                  "require 'Authorization: Bearer KEY' on /v1 (default: $LONGCTX_API_KEY)");
  cmd->add_option("--served-model-name", o->served_model_names,
                  "model names the API answers to (default: --model); the first is shown");
  cmd->add_option("--default-chat-template-kwargs", o->default_chat_template_kwargs,
                  "JSON object passed to every chat template, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "the model's tool-call format, for tool_choice \"auto\": hermes, llama3_json "
                  "or mistral (default: the one its chat template shows, if any)");
  cmd->add_option("--reasoning-parser", o->reasoning_parser,
                  "split <think>...</think> into reasoning_content: qwen3 (the output opens the "
                  "tag) or deepseek_r1 (the prompt opens it)");
  cmd->add_option("--max-request-body", o->max_request_body,
                  "largest request body (413 past it), e.g. 32MiB")
      ->capture_default_str();
  cmd->add_option("--http-threads", o->serve.transport.threads, "HTTP I/O threads")
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", o->serve.transport.keep_alive_timeout_s,
                  "seconds a kept-alive connection may wait idle for its next request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-connections", o->serve.transport.max_connections,
                  "open connections at once; more get 503")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "CORS: comma-separated origins (https://app.example:8080) or * (default: no "
                  "CORS headers)");
  cmd->add_option("--allowed-methods", o->allowed_methods,
                  "CORS: comma-separated methods a preflight may ask for, or *")
      ->capture_default_str();
  cmd->add_option("--allowed-headers", o->allowed_headers,
                  "CORS: comma-separated request headers a preflight may ask for, or *")
      ->capture_default_str();
  cmd->add_flag("--debug-kv-cache-blocks", o->serve.api.debug_kv_cache_blocks,
                "serve GET /debug/kv_cache_blocks, the prefix cache's block hashes (for checking "
                "a KV-event consumer's view; costs a copy of them every step)");
  cmd->add_option("--drain-timeout", o->serve.drain_timeout_s,
                  "seconds requests in flight get to finish on SIGINT/SIGTERM")
      ->capture_default_str();
  cmd->option_defaults()->group("Options");
  cmd->callback([o] { run(*o); });
});

}  // namespace
}  // namespace longctx::cli
