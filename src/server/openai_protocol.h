// The OpenAI API's JSON: request bodies of /v1/completions and /v1/chat/completions mapped onto
// SamplingParams (field names, defaults and types as OpenAI and vLLM), responses and SSE chunks,
// and the error body {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/engine/request_output.h"
#include "longctx/engine/sampling_params.h"
#include "server/reasoning_parser.h"
#include "server/tool_parsers.h"

namespace longctx {
class Tokenizer;
}

namespace longctx::server {

using Json = nlohmann::ordered_json;

// An error answered with `status` and the OpenAI error body. `param` names the request field
// at fault (empty: null), `code` is OpenAI's machine-readable code (empty: null).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {})
      : std::runtime_error(message),
        status_(status),
        param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// "invalid_request_error" (400, 404, 405, 413), "authentication_error" (401),
// "service_unavailable" (503), "server_error" (other 5xx).
const char* error_type(int status);
std::string error_body(int status, std::string_view message, std::string_view param = {},
                       std::string_view code = {});
std::string error_body(const ApiError& e);
// An engine Error as the client's fault (400) or the server's (500, kInternal / kCuda / kIo).
ApiError to_api_error(const Error& e);

enum class Endpoint { kCompletions, kChat };

// The server's parsers of model output (--tool-call-parser, --reasoning-parser).
struct OutputParsers {
  ToolParserKind tool = ToolParserKind::kNone;
  ReasoningParserKind reasoning = ReasoningParserKind::kNone;
};

// What one chat request's output is parsed into: tool calls (tool_choice "auto"), reasoning.
struct OutputParsing {
  ToolParserKind tool = ToolParserKind::kNone;
  std::vector<std::string> tool_names;  // the declared tools; a call to another stays text
  bool parallel_tool_calls = true;      // false: the first call only
  ReasoningParserKind reasoning = ReasoningParserKind::kNone;
  bool active() const {
    return tool != ToolParserKind::kNone || reasoning != ReasoningParserKind::kNone;
  }
};

// A generation request, type-checked: wrong types, missing fields, empty prompts, unknown roles
// and unsupported values throw ApiError(400) naming the field (OpenAI's and vLLM's status); the
// ranges of the sampling fields are SamplingParams' validate()'s business.
struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as sent; empty when absent
  // Completions: the prompt as text or as token ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // Chat: the messages, normalized to string contents, and the template's options.
  Json messages = Json::array();
  bool add_generation_prompt = true;
  Json chat_template_kwargs = Json::object();
  bool add_special_tokens = true;  // completions: true (vLLM), chat: false (template has them)

  SamplingParams params;
  bool max_tokens_given = false;  // else: 16 (completions) or the rest of the context (chat)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // the response carries logprobs (params.logprobs = top count)
  // Chat with tools and tool_choice "required" or a named function: the output is constrained
  // to {"name": <a declared tool>, "arguments": <its parameters>} (params.structured) and
  // answered as one tool call.
  bool tool_call = false;
  // tool_choice "auto" (with a tool parser) and the reasoning parser: the unconstrained output
  // parsed into tool_calls, reasoning_content and content.
  OutputParsing parsing;
};

// `parsers`: what the server can parse; tool_choice "auto" without a tool parser is a 400.
GenerationRequest parse_generation_request(const Json& body, Endpoint endpoint,
                                           const OutputParsers& parsers = {});

// Builds one request's response: the complete JSON, or its SSE events. Not thread-safe; one
// builder per request, used on the engine thread.
class ResponseBuilder {
 public:
  // tool_call: the generated text is a {"name", "arguments"} document answered as tool_calls
  // (streamed: the call's id and name once the name is complete, then argument fragments).
  // parsing: the output split into reasoning, content and tool calls (chat, not with tool_call).
  ResponseBuilder(Endpoint endpoint, std::string model, const Tokenizer* tokenizer, bool logprobs,
                  bool tool_call = false, OutputParsing parsing = {});

  const std::string& id() const { return id_; }
  // "data: <json>\n\n" events.
  std::string role_chunk();  // chat's first event: delta {"role": "assistant", "content": ""}
  // New text (and the logprobs of its tokens); finish_reason empty while running. With a tool
  // call, the call's deltas (empty string while the name is being written) and "tool_calls"
  // for "stop".
  std::string delta_chunk(std::string_view text, std::span<const TokenLogprobs> logprobs,
                          std::string_view finish_reason);
  std::string usage_chunk(int64_t prompt_tokens, int64_t completion_tokens);
  std::string error_event(const ApiError& e);
  static std::string done_event() { return "data: [DONE]\n\n"; }
  // The non-streamed response.
  std::string full_response(const RequestOutput& out);

 private:
  Json chunk_base();
  Json tool_call_delta(std::string_view text, bool last);
  std::string parsed_delta_chunks(std::string_view text, std::span<const TokenLogprobs> logprobs,
                                  std::string_view finish_reason);
  Json chat_chunk(Json delta, Json logprobs, std::string_view finish_reason);
  Json parsed_message(std::string_view text, std::string& finish);
  // The forced call's {"id", "type", "function"} when `text` is a complete {"name", "arguments"}
  // document (the grammar's); null otherwise (the text stays content).
  Json forced_tool_call(const std::string& text) const;
  std::vector<ParsedToolCall> kept_calls(std::vector<ParsedToolCall> calls) const;
  const std::string& parsed_call_id(int index);
  Json logprobs_json(std::span<const TokenLogprobs> lps);
  std::string token_text(int32_t token) const;

  Endpoint endpoint_;
  std::string model_;
  const Tokenizer* tokenizer_;
  bool logprobs_;
  std::string id_;
  int64_t created_;
  int64_t text_offset_ = 0;  // completions' logprobs.text_offset
  // tool_call: the text so far, where the arguments start in it (npos until the name is
  // complete) and how many of their bytes were streamed.
  bool tool_call_ = false;
  std::string tool_text_;
  size_t args_begin_ = std::string::npos;
  size_t args_sent_ = 0;
  std::string call_id_;
  // parsing: the parsers' state and the ids given to the calls so far.
  OutputParsing parsing_;
  ToolCallStreamParser tool_parser_;
  ReasoningStreamParser reasoning_parser_;
  std::vector<std::string> call_ids_;
  bool any_call_ = false;
};

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
std::string random_id(const char* prefix);              // prefix + 24 random hex digits
std::string sse(const Json& j);                         // "data: <json>\n\n"
const char* openai_finish_reason(FinishReason reason);  // "stop", "length", "abort"

}  // namespace longctx::server
