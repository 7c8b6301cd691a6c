#include "server/openai_protocol.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "longctx/core/json_limits.h"
#include "longctx/tokenizer/tokenizer.h"
#include "server/structured_fields.h"
#include "structured/json_schema.h"

namespace longctx::server {

const char* error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 503) return "service_unavailable";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

std::string error_body(int status, std::string_view message, std::string_view param,
                       std::string_view code) {
  Json err = {
      {"message", message}, {"type", error_type(status)}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) err["param"] = param;
  if (!code.empty()) err["code"] = code;
  // Replaces invalid UTF-8 (an excerpt of a hostile body) instead of throwing.
  return Json{{"error", err}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string error_body(const ApiError& e) {
  return error_body(e.status(), e.what(), e.param(), e.code());
}

ApiError to_api_error(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kOutOfRange:
    case ErrorCode::kUnsupported:
    case ErrorCode::kNotFound: {
      // validate()'s messages start with the field's name ("top_p must be in (0, 1], ...").
      std::string msg = e.what();
      std::string param = msg.substr(0, msg.find(' '));
      const bool is_field =
          param.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos &&
          msg.find(" must ") == param.size();
      const bool context = msg.find("max_model_len") != std::string::npos;
      return ApiError(400, msg, is_field ? param : "", context ? "context_length_exceeded" : "");
    }
    case ErrorCode::kOutOfMemory:
      return ApiError(400, e.what(), "", "kv_cache_exceeded");
    default:
      return ApiError(500, e.what());
  }
}

namespace {

const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const Json& v) {
  throw ApiError(400,
                 "'" + field + "' must be " + expected + ", got " + type_name(v) + " (" +
                     json_excerpt(v) + ")",
                 field);
}

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> opt_number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  return v->get<double>();
}

int64_t as_int(const std::string& name, const Json& v) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw ApiError(400, "'" + name + "' is too large: " + v.dump(), name);
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  // JSON has one number type; 4.0 is accepted as 4, 4.5 is not an integer.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // Range first: converting a double outside int64 is undefined behaviour.
    if (d == std::trunc(d) && !(d > -9.0e18 && d < 9.0e18))
      throw ApiError(400, "'" + name + "' is too large: " + v.dump(), name);
    if (d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  wrong_type(name, "an integer", v);
}

std::optional<int64_t> opt_int(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  return as_int(name, *v);
}

std::optional<bool> opt_bool(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

int32_t as_token(const std::string& name, const Json& v) {
  const int64_t t = as_int(name, v);
  if (t < 0 || t > std::numeric_limits<int32_t>::max())
    throw ApiError(
        400, "'" + name + "' holds token id " + std::to_string(t) + ", outside [0, 2^31)", name);
  return static_cast<int32_t>(t);
}

std::vector<int32_t> token_list(const std::string& name, const Json& v) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const Json& t : v) ids.push_back(as_token(name, t));
  return ids;
}

void parse_prompt(const Json& body, GenerationRequest& req) {
  const Json* p = field(body, "prompt");
  if (p == nullptr) throw ApiError(400, "'prompt' is required", "prompt");
  const Json* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    // A list of prompts; one is supported (n = 1, one choice per response).
    if (p->size() != 1)
      throw ApiError(400,
                     "'prompt' holds " + std::to_string(p->size()) +
                         " prompts; this server takes one prompt per request",
                     "prompt");
    one = &p->front();
  }
  if (one->is_string()) {
    req.prompt_text = one->get<std::string>();
    // vLLM refuses an empty prompt even where a BOS token would make it one token long.
    if (req.prompt_text.empty()) throw ApiError(400, "'prompt' is empty", "prompt");
  } else if (one->is_array()) {
    for (const Json& t : *one) {
      if (!t.is_number())
        wrong_type("prompt",
                   "a string, an array of token ids or a list of one "
                   "of those",
                   *p);
    }
    req.prompt_ids = token_list("prompt", *one);
    req.prompt_is_ids = true;
    if (req.prompt_ids.empty())
      throw ApiError(400, "'prompt' is an empty list of tokens", "prompt");
  } else {
    wrong_type("prompt", "a string, an array of token ids or a list of one of those", *p);
  }
}

// OpenAI's chat roles (vLLM passes any role to the template, which then renders it as the
// template decides; a typo such as "usr" should not silently become an odd prompt).
bool known_role(const std::string& role) {
  for (const char* r : {"system", "developer", "user", "assistant", "tool", "function"}) {
    if (role == r) return true;
  }
  return false;
}

void parse_messages(const Json& body, GenerationRequest& req) {
  const Json* m = field(body, "messages");
  if (m == nullptr) throw ApiError(400, "'messages' is required", "messages");
  if (!m->is_array()) wrong_type("messages", "an array", *m);
  if (m->empty()) throw ApiError(400, "'messages' is empty", "messages");
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) wrong_type(where, "an object", msg);
    const Json* role = field(msg, "role");
    if (role == nullptr) throw ApiError(400, "'" + where + ".role' is required", where + ".role");
    if (!role->is_string()) wrong_type(where + ".role", "a string", *role);
    if (!known_role(role->get<std::string>()))
      throw ApiError(400,
                     "'" + where +
                         ".role' must be one of system, developer, user, assistant, "
                         "tool, function; got " +
                         json_excerpt(*role),
                     where + ".role");
    Json out = msg;
    const Json* content = field(msg, "content");
    if (content == nullptr) {
      out["content"] = "";
    } else if (content->is_array()) {
      // Content parts: text parts are joined, as vLLM does for text-only models.
      std::string text;
      for (const Json& part : *content) {
        const Json* type = part.is_object() ? field(part, "type") : nullptr;
        const Json* part_text = part.is_object() ? field(part, "text") : nullptr;
        if (type == nullptr || !type->is_string() || *type != "text" || part_text == nullptr ||
            !part_text->is_string())
          throw ApiError(400,
                         "'" + where +
                             ".content' parts must be {\"type\": \"text\", "
                             "\"text\": ...} (this model reads text only)",
                         where + ".content");
        if (!text.empty()) text += "\n";
        text += part_text->get<std::string>();
      }
      out["content"] = text;
    } else if (!content->is_string()) {
      wrong_type(where + ".content", "a string or an array of text parts", *content);
    }
    req.messages.push_back(std::move(out));
  }
}

void parse_stop(const Json& body, SamplingParams& sp) {
  const Json* s = field(body, "stop");
  if (s == nullptr) return;
  if (s->is_string()) {
    sp.stop.push_back(s->get<std::string>());
    return;
  }
  if (!s->is_array()) wrong_type("stop", "a string or an array of strings", *s);
  for (const Json& x : *s) {
    if (!x.is_string()) wrong_type("stop", "a string or an array of strings", *s);
    sp.stop.push_back(x.get<std::string>());
  }
}

// Fields this server refuses rather than silently ignores: they change what a client gets.
void check_unsupported(const Json& body, Endpoint endpoint) {
  if (auto n = opt_int(body, "n"); n && *n != 1)
    throw ApiError(400, "'n' must be 1 (one choice per request), got " + std::to_string(*n), "n");
  if (auto b = opt_int(body, "best_of"); b && *b != 1)
    throw ApiError(400, "'best_of' must be 1, got " + std::to_string(*b), "best_of");
  if (auto e = opt_bool(body, "echo"); e && *e)
    throw ApiError(400, "'echo' is not supported", "echo");
  if (endpoint != Endpoint::kChat) {
    if (const Json* v = field(body, "tools"); v != nullptr && !(v->is_array() && v->empty()))
      throw ApiError(400, "'tools' is for /v1/chat/completions", "tools");
  }
  for (const char* name : {"logit_bias", "suffix", "functions", "guided_grammar"}) {
    const Json* v = field(body, name);
    if (v != nullptr && !(v->is_array() && v->empty()) && !(v->is_object() && v->empty()))
      throw ApiError(400, std::string("'") + name + "' is not supported", name);
  }
}

// tools + tool_choice (chat): "required" or {"type": "function", "function": {"name"}} constrain
// the output to a call of a declared tool ({"name", "arguments"} with the tool's parameters as
// the arguments' schema); "auto" (the default) generates freely and parses the model's own
// tool-call format (the server's tool parser; none: a 400); "none" generates text without the
// tools in the prompt (a model shown tools may still write a call, which would reach the client
// as raw text). The tools go to the chat template (`tools`).
void parse_tools(const Json& body, GenerationRequest& req, const OutputParsers& parsers) {
  const Json* tools = field(body, "tools");
  if (tools == nullptr || (tools->is_array() && tools->empty())) return;
  if (!tools->is_array()) wrong_type("tools", "an array", *tools);
  Json choices = Json::array();  // {"name", "arguments"} schemas of the declared tools
  std::vector<std::string> names;
  for (const Json& t : *tools) {
    const Json* fn = t.is_object() ? field(t, "function") : nullptr;
    const Json* type = t.is_object() ? field(t, "type") : nullptr;
    const Json* name = fn != nullptr && fn->is_object() ? field(*fn, "name") : nullptr;
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string())
      throw ApiError(400,
                     "each of 'tools' must be {\"type\": \"function\", \"function\": "
                     "{\"name\": ..., \"parameters\": ...}}",
                     "tools");
    const Json* params = field(*fn, "parameters");
    if (params != nullptr && !params->is_object())
      wrong_type("tools.function.parameters", "a JSON schema object", *params);
    names.push_back(name->get<std::string>());
    Json schema = {{"type", "object"},
                   {"properties",
                    {{"name", {{"const", *name}}},
                     {"arguments", params != nullptr ? *params : Json{{"type", "object"}}}}},
                   {"required", {"name", "arguments"}},
                   {"additionalProperties", false}};
    choices.push_back(std::move(schema));
  }
  std::string choice = "auto";
  std::optional<std::string> named;
  if (const Json* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
    } else if (tc->is_object() && field(*tc, "function") != nullptr &&
               field(*tc, "function")->is_object() &&
               field(*field(*tc, "function"), "name") != nullptr &&
               field(*field(*tc, "function"), "name")->is_string()) {
      named = field(*field(*tc, "function"), "name")->get<std::string>();
      choice = "named";
    } else {
      throw ApiError(400,
                     "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                     "tool_choice");
    }
  }
  const bool parallel = opt_bool(body, "parallel_tool_calls").value_or(true);
  if (choice == "none") return;
  if (choice == "auto") {
    if (parsers.tool == ToolParserKind::kNone)
      throw ApiError(400,
                     "'tool_choice' \"auto\" (the default with tools) needs a parser of the "
                     "model's tool-call format, and this server has none: start it with "
                     "--tool-call-parser hermes|llama3_json|mistral (its chat template shows no "
                     "known format), or send \"required\" or a named function",
                     "tool_choice");
    req.parsing.tool = parsers.tool;
    req.parsing.tool_names = names;
    req.parsing.parallel_tool_calls = parallel;
    // [TOOL_CALLS] is a special token of Mistral's tokenizers (vLLM does the same).
    if (parsers.tool == ToolParserKind::kMistral) req.params.skip_special_tokens = false;
    if (!req.chat_template_kwargs.contains("tools")) req.chat_template_kwargs["tools"] = *tools;
    return;
  }
  if (choice != "required" && choice != "named")
    throw ApiError(400,
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or a named "
                   "function, got \"" +
                       choice + "\"",
                   "tool_choice");
  if (field(body, "response_format") != nullptr &&
      field(body, "response_format")->value("type", "text") != "text")
    throw ApiError(400, "'response_format' and a forced tool call cannot be combined",
                   "tool_choice");
  if (req.params.structured.enabled())
    throw ApiError(400, "structured outputs and a forced tool call cannot be combined",
                   "tool_choice");
  Json schema;
  if (named) {
    const auto it = std::find(names.begin(), names.end(), *named);
    if (it == names.end())
      throw ApiError(400, "'tool_choice' names \"" + *named + "\", which is not in 'tools'",
                     "tool_choice");
    schema = choices[static_cast<size_t>(it - names.begin())];
  } else {
    schema = choices.size() == 1 ? choices[0] : Json{{"anyOf", choices}};
  }
  try {
    structured::json_schema_grammar(schema);
  } catch (const Error& e) {
    throw ApiError(400, std::string("tools: ") + e.what(), "tools");
  }
  req.params.structured.kind = StructuredOutput::Kind::kJsonSchema;
  req.params.structured.json_schema = schema.dump();
  req.tool_call = true;
  if (!req.chat_template_kwargs.contains("tools")) req.chat_template_kwargs["tools"] = *tools;
}

// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict"}}. The schema is compiled here so an unsupported
// keyword is a 400 naming it; Json keeps the client's key order, so properties are generated in
// the order the schema lists them.
void parse_response_format(const Json& body, SamplingParams& sp) {
  const Json* rf = field(body, "response_format");
  if (rf == nullptr) return;
  constexpr const char* kParam = "response_format";
  if (!rf->is_object()) wrong_type(kParam, "an object", *rf);
  const Json* type = field(*rf, "type");
  if (type == nullptr || !type->is_string())
    throw ApiError(400, "'response_format.type' must be a string", kParam);
  const std::string t = type->get<std::string>();
  if (t == "text") return;
  if (t == "json_object") {
    sp.structured.kind = StructuredOutput::Kind::kJsonObject;
    return;
  }
  if (t != "json_schema")
    throw ApiError(400,
                   "'response_format.type' must be \"text\", \"json_object\" or "
                   "\"json_schema\", got \"" +
                       t + "\"",
                   kParam);
  const Json* js = field(*rf, "json_schema");
  if (js == nullptr || !js->is_object())
    throw ApiError(400, "'response_format.json_schema' must be an object", kParam);
  if (const Json* strict = field(*js, "strict"); strict != nullptr && !strict->is_boolean())
    throw ApiError(400, "'response_format.json_schema.strict' must be a boolean", kParam);
  const Json* schema = field(*js, "schema");
  if (schema == nullptr || !(schema->is_object() || schema->is_boolean()))
    throw ApiError(400, "'response_format.json_schema.schema' must be a JSON schema object",
                   kParam);
  try {
    structured::json_schema_grammar(*schema);
  } catch (const Error& e) {
    throw ApiError(400, std::string("response_format: ") + e.what(), kParam);
  }
  sp.structured.kind = StructuredOutput::Kind::kJsonSchema;
  sp.structured.json_schema = schema->dump();
}

}  // namespace

GenerationRequest parse_generation_request(const Json& body, Endpoint endpoint,
                                           const OutputParsers& parsers) {
  if (!body.is_object()) {
    throw ApiError(400, std::string("the request body must be a JSON object, got ") +
                            type_name(body) + " (" + json_excerpt(body) + ")");
  }
  GenerationRequest req;
  req.endpoint = endpoint;
  if (const Json* m = field(body, "model")) {
    if (!m->is_string()) wrong_type("model", "a string", *m);
    req.model = m->get<std::string>();
  }
  check_unsupported(body, endpoint);
  SamplingParams& sp = req.params;
  if (endpoint == Endpoint::kCompletions) {
    parse_prompt(body, req);
    req.add_special_tokens = opt_bool(body, "add_special_tokens").value_or(true);
  } else {
    parse_messages(body, req);
    req.add_special_tokens = opt_bool(body, "add_special_tokens").value_or(false);
    req.add_generation_prompt = opt_bool(body, "add_generation_prompt").value_or(true);
    if (const Json* k = field(body, "chat_template_kwargs")) {
      if (!k->is_object()) wrong_type("chat_template_kwargs", "an object", *k);
      req.chat_template_kwargs = *k;
    }
  }
  // max_completion_tokens is the chat name; max_tokens its older alias.
  const char* max_name = "max_completion_tokens";
  std::optional<int64_t> max_tokens = opt_int(body, max_name);
  if (!max_tokens) {
    max_name = "max_tokens";
    max_tokens = opt_int(body, max_name);
  }
  if (max_tokens) {
    if (*max_tokens < 1) {
      throw ApiError(
          400,
          std::string("'") + max_name + "' must be at least 1, got " + std::to_string(*max_tokens),
          max_name);
    }
    sp.max_tokens = *max_tokens;
    req.max_tokens_given = true;
  }
  if (auto v = opt_number(body, "temperature")) sp.temperature = *v;
  if (auto v = opt_number(body, "top_p")) sp.top_p = *v;
  if (auto v = opt_int(body, "top_k")) sp.top_k = *v;
  if (auto v = opt_number(body, "min_p")) sp.min_p = *v;
  // vLLM's range, a signed 64-bit integer (past it: 400 from as_int); the generator takes its
  // two's-complement bits, so -1 and 2^64 - 1 are not both accepted.
  if (auto v = opt_int(body, "seed")) sp.seed = static_cast<uint64_t>(*v);
  if (auto v = opt_number(body, "presence_penalty")) sp.presence_penalty = *v;
  if (auto v = opt_number(body, "frequency_penalty")) sp.frequency_penalty = *v;
  if (auto v = opt_number(body, "repetition_penalty")) sp.repetition_penalty = *v;
  if (auto v = opt_bool(body, "ignore_eos")) sp.ignore_eos = *v;
  if (auto v = opt_bool(body, "skip_special_tokens")) sp.skip_special_tokens = *v;
  parse_stop(body, sp);
  parse_response_format(body, sp);
  parse_structured_fields(body, sp);
  if (endpoint == Endpoint::kChat) {
    (void)opt_bool(body, "parallel_tool_calls");  // type-checked with or without tools
    parse_tools(body, req, parsers);
    // Constrained output (a forced call, a response_format) has no reasoning to split off.
    if (!req.tool_call && !sp.structured.enabled()) req.parsing.reasoning = parsers.reasoning;
  }
  if (const Json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) wrong_type("stop_token_ids", "an array of token ids", *ids);
    sp.stop_token_ids = token_list("stop_token_ids", *ids);
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto lp = opt_int(body, "logprobs")) {
      if (*lp < 0 || *lp > SamplingParams::kMaxLogprobs)
        throw ApiError(400,
                       "'logprobs' must be in [0, " + std::to_string(SamplingParams::kMaxLogprobs) +
                           "], got " + std::to_string(*lp),
                       "logprobs");
      sp.logprobs = static_cast<int>(*lp);
      req.logprobs = true;
    }
  } else {
    req.logprobs = opt_bool(body, "logprobs").value_or(false);
    const auto top = opt_int(body, "top_logprobs");
    if (top && !req.logprobs && *top > 0)
      throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    if (top && (*top < 0 || *top > SamplingParams::kMaxLogprobs))
      throw ApiError(400,
                     "'top_logprobs' must be in [0, " +
                         std::to_string(SamplingParams::kMaxLogprobs) + "], got " +
                         std::to_string(*top),
                     "top_logprobs");
    if (req.logprobs) sp.logprobs = static_cast<int>(top.value_or(0));
  }
  req.stream = opt_bool(body, "stream").value_or(false);
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!req.stream)
      throw ApiError(400, "'stream_options' is only allowed with 'stream': true", "stream_options");
    req.include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  return req;
}

const char* openai_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    default:
      return "";
  }
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() % 16];
  return id;
}

namespace {}  // namespace

std::string sse(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

ResponseBuilder::ResponseBuilder(Endpoint endpoint, std::string model, const Tokenizer* tokenizer,
                                 bool logprobs, bool tool_call, OutputParsing parsing)
    : endpoint_(endpoint),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      logprobs_(logprobs),
      id_(random_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-")),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      tool_call_(tool_call && endpoint == Endpoint::kChat),
      call_id_(random_id("call_")),
      parsing_(tool_call_ || endpoint != Endpoint::kChat ? OutputParsing{} : std::move(parsing)),
      tool_parser_(parsing_.tool, parsing_.tool_names),
      reasoning_parser_(parsing_.reasoning) {}

Json ResponseBuilder::chunk_base() {
  return {{"id", id_},
          {"object", endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_}};
}

std::string ResponseBuilder::token_text(int32_t token) const {
  if (tokenizer_ == nullptr || !tokenizer_->is_valid_id(token)) return "";
  const int32_t ids[1] = {token};
  return tokenizer_->decode(ids);
}

Json ResponseBuilder::logprobs_json(std::span<const TokenLogprobs> lps) {
  if (endpoint_ == Endpoint::kChat) {
    auto bytes = [&](int32_t t) {
      Json b = Json::array();
      if (tokenizer_ != nullptr && tokenizer_->is_valid_id(t)) {
        for (unsigned char c : tokenizer_->token_bytes(t)) b.push_back(static_cast<int>(c));
      }
      return b;
    };
    Json content = Json::array();
    for (const TokenLogprobs& lp : lps) {
      Json top = Json::array();
      for (const auto& [t, l] : lp.top)
        top.push_back({{"token", token_text(t)}, {"logprob", l}, {"bytes", bytes(t)}});
      content.push_back({{"token", token_text(lp.token)},
                         {"logprob", lp.logprob},
                         {"bytes", bytes(lp.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  for (const TokenLogprobs& lp : lps) {
    const std::string text = token_text(lp.token);
    tokens.push_back(text);
    token_logprobs.push_back(lp.logprob);
    Json t = Json::object();
    for (const auto& [id, l] : lp.top) t[token_text(id)] = l;
    top.push_back(t);
    offsets.push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(text.size());
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

std::string ResponseBuilder::role_chunk() {
  Json j = chunk_base();
  j["choices"] = Json::array({{{"index", 0},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return sse(j);
}

std::string ResponseBuilder::delta_chunk(std::string_view text,
                                         std::span<const TokenLogprobs> logprobs,
                                         std::string_view finish_reason) {
  Json j = chunk_base();
  if (parsing_.active()) return parsed_delta_chunks(text, logprobs, finish_reason);
  Json choice = {{"index", 0}};
  if (tool_call_) {
    choice["delta"] = tool_call_delta(text, !finish_reason.empty());
    if (finish_reason == "stop") finish_reason = "tool_calls";
    // Nothing to send yet (the name is still being written): no event.
    if (choice["delta"].empty() && finish_reason.empty() && logprobs.empty()) return "";
  } else if (endpoint_ == Endpoint::kChat) {
    choice["delta"] = text.empty() ? Json::object() : Json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs_ && !logprobs.empty() ? logprobs_json(logprobs) : Json(nullptr);
  choice["finish_reason"] = finish_reason.empty() ? Json(nullptr) : Json(finish_reason);
  j["choices"] = Json::array({choice});
  return sse(j);
}

Json ResponseBuilder::tool_call_delta(std::string_view text, bool last) {
  tool_text_ += text;
  Json call = {{"index", 0}};
  if (args_begin_ == std::string::npos) {
    // The grammar writes {"name":"<tool>","arguments":...; the name is complete at the comma.
    static constexpr std::string_view kArgs = ",\"arguments\":";
    const size_t at = tool_text_.find(kArgs);
    if (at == std::string::npos) return Json::object();
    std::string name;
    try {
      name = Json::parse(tool_text_.substr(8, at - 8)).get<std::string>();  // after {"name":
    } catch (const Json::exception&) {
      return Json::object();
    }
    args_begin_ = at + kArgs.size();
    call["id"] = call_id_;
    call["type"] = "function";
    call["function"] = {{"name", name}, {"arguments", ""}};
  }
  // The arguments so far; the last byte is held back until the end: it may be the call
  // object's closing brace.
  size_t end = tool_text_.size();
  if (last) {
    if (end > args_begin_ && tool_text_.back() == '}') --end;
  } else {
    end = end > args_begin_ ? end - 1 : args_begin_;
  }
  const size_t from = args_begin_ + args_sent_;
  if (end > from) {
    if (!call.contains("function")) call["function"] = Json::object();
    call["function"]["arguments"] = tool_text_.substr(from, end - from);
    args_sent_ += end - from;
  }
  if (call.size() == 1) return Json::object();
  return {{"tool_calls", Json::array({call})}};
}

std::string ResponseBuilder::usage_chunk(int64_t prompt_tokens, int64_t completion_tokens) {
  Json j = chunk_base();
  j["choices"] = Json::array();
  j["usage"] = usage_json(prompt_tokens, completion_tokens);
  return sse(j);
}

std::string ResponseBuilder::error_event(const ApiError& e) {
  return "data: " + error_body(e) + "\n\n";
}

Json ResponseBuilder::forced_tool_call(const std::string& text) const {
  try {
    const Json doc = Json::parse(text);
    if (doc.is_object() && doc.contains("name") && doc.contains("arguments"))
      return {{"id", call_id_},
              {"type", "function"},
              {"function", {{"name", doc["name"]}, {"arguments", doc["arguments"].dump()}}}};
  } catch (const Json::exception&) {
  }
  return nullptr;
}

std::string ResponseBuilder::full_response(const RequestOutput& out) {
  Json j = {{"id", id_},
            {"object", endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion"},
            {"created", created_},
            {"model", model_}};
  Json choice = {{"index", 0}};
  std::string finish = openai_finish_reason(out.finish_reason);
  if (parsing_.active()) {
    choice["message"] = parsed_message(out.text, finish);
  } else if (Json call = tool_call_ ? forced_tool_call(out.text) : Json(); !call.is_null()) {
    choice["message"] = {
        {"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array({call})}};
    if (finish == "stop") finish = "tool_calls";
  } else if (endpoint_ == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", out.text}};
  } else {
    choice["text"] = out.text;
  }
  choice["logprobs"] = logprobs_ ? logprobs_json(out.logprobs) : Json(nullptr);
  choice["finish_reason"] = finish;
  j["choices"] = Json::array({choice});
  j["usage"] = usage_json(static_cast<int64_t>(out.prompt_token_ids.size()),
                          static_cast<int64_t>(out.token_ids.size()));
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace longctx::server
