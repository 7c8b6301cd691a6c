#include "server/api_server.h"

#include <chrono>
#include <memory>

#include "engine/llm_internal.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/logging.h"
#include "longctx/tokenizer/tokenizer.h"

namespace longctx::server {

namespace {

HttpResponse json_response(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse api_error_response(const ApiError& e) {
  return json_response(e.status(), error_body(e));
}

// 405 carries the method the path takes (RFC 9110 requires the Allow header).
struct MethodNotAllowed : ApiError {
  MethodNotAllowed(ApiError e, std::string m) : ApiError(std::move(e)), allow(std::move(m)) {}
  std::string allow;
};

// Compares without an early exit, so the time taken does not reveal how much of a guess was
// right.
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char bi = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= static_cast<unsigned char>(a[i]) ^ bi;
  }
  return diff == 0;
}

// What one request carries through its callbacks (on the engine thread).
struct RequestState {
  GenerationRequest g;
  ResponseBuilder builder;
  std::shared_ptr<ResponseStream> stream;
  ServerMetrics* metrics;
  int64_t prompt_tokens = 0;
  double last_token_time = 0;  // when the previous tokens reached the server (0: none yet)
};

// The token counters and vLLM's per-token TPOT / inter-token latency: an event's tokens share
// the interval since the previous event (the first event's tokens start the clock).
void record_tokens(RequestState& st, size_t n) {
  if (n == 0) return;
  const double now = now_seconds();
  const auto count = static_cast<int64_t>(n);
  if (st.last_token_time == 0) {
    st.metrics->record_prompt(st.prompt_tokens);
    if (count > 1) st.metrics->record_inter_token(0, count - 1);
  } else {
    st.metrics->record_inter_token((now - st.last_token_time) / static_cast<double>(count), count);
  }
  st.metrics->record_output_tokens(count);
  st.last_token_time = now;
}

void on_event(RequestState& st, const LoopEvent& ev) {
  ResponseStream& out = *st.stream;
  switch (ev.kind) {
    case LoopEvent::Kind::kRejected: {
      const ApiError e = to_api_error(*ev.error);
      out.start({e.status(), "application/json", false});
      out.write(error_body(e));
      out.finish();
      st.metrics->record_http_status(e.status());
      return;
    }
    case LoopEvent::Kind::kAccepted:
      if (st.g.stream) {
        out.start({200, "text/event-stream", true});
        if (st.g.endpoint == Endpoint::kChat) out.write(st.builder.role_chunk());
      }
      return;
    case LoopEvent::Kind::kOutput:
      record_tokens(st, ev.new_token_ids.size());
      break;
  }
  if (st.g.stream) {
    std::string data;
    if (!ev.text.empty() || (st.g.logprobs && !ev.new_logprobs.empty()))
      data += st.builder.delta_chunk(ev.text, ev.new_logprobs, "");
    if (ev.finished) {
      if (ev.error) {
        data += st.builder.error_event(to_api_error(*ev.error));
      } else {
        data += st.builder.delta_chunk("", {}, openai_finish_reason(ev.output->finish_reason));
      }
      if (st.g.include_usage)
        data += st.builder.usage_chunk(st.prompt_tokens,
                                       static_cast<int64_t>(ev.output->token_ids.size()));
      data += ResponseBuilder::done_event();
    }
    out.write(data);
  } else if (ev.finished) {
    if (ev.error) {
      const ApiError e = to_api_error(*ev.error);
      out.start({e.status(), "application/json", false});
      out.write(error_body(e));
    } else {
      out.start({200, "application/json", false});
      out.write(st.builder.full_response(*ev.output));
    }
  }
  if (ev.finished) {
    st.metrics->record_finished(*ev.output);
    st.metrics->record_http_status(ev.error ? 500 : 200);
    out.finish();
  }
}

}  // namespace

ApiServer::ApiServer(LLM& llm, EngineLoop& loop, ApiServerOptions options)
    : llm_(llm),
      loop_(loop),
      options_(std::move(options)),
      // The block size from the loop's snapshot (the core belongs to the engine thread); the
      // core's options never change after it was made.
      metrics_({options_.served_model_names.empty() ? "" : options_.served_model_names.front(),
                llm_.max_model_len(), loop_.stats().engine.kv_block_size,
                engine_core(llm_).options().enable_prefix_caching,
                engine_core(llm_).options().speculative.num_speculative_tokens}),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {
  LONGCTX_CHECK(!options_.served_model_names.empty(), ErrorCode::kInvalidArgument,
                "the server needs a model name (--served-model-name)");
}

HttpResponse ApiServer::health() const {
  HttpResponse r;
  const bool ok = loop_.stats().accepting;
  r.status = ok ? 200 : 503;
  r.content_type = "text/plain";
  r.body = ok ? "" : "shutting down\n";
  return r;
}

HttpResponse ApiServer::error_response(int status, const std::string& message) {
  metrics_.record_http_status(status);
  return json_response(status, error_body(status, message));
}

HandlerResult ApiServer::handle(const HttpRequest& request) {
  HandlerResult r;
  try {
    r = route(request);
  } catch (const MethodNotAllowed& e) {
    r.response = api_error_response(e);
    r.response.headers.emplace_back("Allow", e.allow);
  } catch (const ApiError& e) {
    r.response = api_error_response(e);
  } catch (const Error& e) {
    r.response = api_error_response(to_api_error(e));
  } catch (const std::exception& e) {
    LONGCTX_LOG_ERROR("server: {} {}: {}", request.method, request.path, e.what());
    r.response = json_response(500, error_body(500, std::string("internal error: ") + e.what()));
  }
  if (r.stream == nullptr) metrics_.record_http_status(r.response.status);
  return r;
}

bool ApiServer::authorized(const HttpRequest& request) const {
  if (options_.api_key.empty()) return true;
  std::string_view auth = request.header("authorization");
  constexpr std::string_view kBearer = "bearer ";
  if (auth.size() < kBearer.size()) return false;
  for (size_t i = 0; i < kBearer.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kBearer[i]) return false;
  }
  return constant_time_equal(auth.substr(kBearer.size()), options_.api_key);
}

HandlerResult ApiServer::route(const HttpRequest& req) {
  const std::string& p = req.path;
  const bool needs_key = p.starts_with("/v1/") || p == "/tokenize" || p == "/detokenize";
  if (needs_key && !authorized(req)) {
    throw ApiError(401,
                   "Unauthorized: send the API key as 'Authorization: Bearer <key>' (the server "
                   "was started with --api-key or LONGCTX_API_KEY)",
                   "", "invalid_api_key");
  }
  auto method = [&](const char* m) {
    if (req.method != m) {
      throw MethodNotAllowed(
          ApiError(405, "method " + req.method + " is not allowed on " + p + " (use " + m + ")"),
          m);
    }
  };
  HandlerResult r;
  if (p == "/v1/completions") {
    method("POST");
    return generate(req, Endpoint::kCompletions);
  }
  if (p == "/v1/chat/completions") {
    method("POST");
    return generate(req, Endpoint::kChat);
  }
  if (p == "/v1/models") {
    method("GET");
    r.response = models();
  } else if (p == "/health") {
    method("GET");
    r.response = health();
  } else if (p == "/ping") {
    // vLLM's (SageMaker's) liveness path: /health's answer, for GET and POST.
    if (req.method != "GET" && req.method != "POST") {
      throw MethodNotAllowed(
          ApiError(405, "method " + req.method + " is not allowed on /ping (use GET or POST)"),
          "GET, POST");
    }
    r.response = health();
  } else if (p == "/metrics") {
    method("GET");
    r.response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.response.body = metrics_.render(loop_.stats());
  } else if (p == "/debug/kv_cache_blocks" && options_.debug_kv_cache_blocks) {
    method("GET");
    r.response = kv_cache_blocks();
  } else if (p == "/tokenize") {
    method("POST");
    r.response = tokenize(req);
  } else if (p == "/detokenize") {
    method("POST");
    r.response = detokenize(req);
  } else if (p == "/" || p == "/index.html") {
    method("GET");
    r.response.content_type = "text/html; charset=utf-8";
    r.response.body = std::string(chat_page_html());
  } else {
    throw ApiError(404, "no such endpoint: " + req.method + " " + p);
  }
  return r;
}

Json ApiServer::parse_body(const HttpRequest& req) const {
  try {
    return parse_ordered_json(req.body, "the request body", options_.max_json_depth);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "", "invalid_json");
  }
}

void ApiServer::check_model(const std::string& model) const {
  if (model.empty()) return;
  for (const std::string& name : options_.served_model_names) {
    if (name == model) return;
  }
  throw ApiError(
      404, "The model `" + model + "` does not exist (this server serves `" + model_name() + "`)",
      "model", "model_not_found");
}

HttpResponse ApiServer::models() const {
  Json data = Json::array();
  for (const std::string& name : options_.served_model_names) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "longctx"},
                    {"root", options_.model_root},
                    {"parent", nullptr},
                    {"max_model_len", llm_.max_model_len()}});
  }
  return json_response(200, Json{{"object", "list"}, {"data", data}}.dump());
}

HttpResponse ApiServer::kv_cache_blocks() const {
  // Decimal strings: a 64-bit hash is past what a JSON number holds exactly in most parsers.
  Json hashes = Json::array();
  for (uint64_t h : loop_.cached_block_hashes()) hashes.push_back(std::to_string(h));
  return json_response(200, Json{{"block_hashes", hashes}}.dump());
}

std::vector<int32_t> ApiServer::prompt_ids(const GenerationRequest& g) {
  if (g.endpoint == Endpoint::kCompletions && g.prompt_is_ids) return g.prompt_ids;
  if (llm_.tokenizer() == nullptr)
    throw ApiError(400, "this model has no tokenizer: send the prompt as token ids", "prompt");
  std::string text = g.prompt_text;
  if (g.endpoint == Endpoint::kChat) {
    Json kwargs = options_.default_chat_template_kwargs;
    for (auto& [k, v] : g.chat_template_kwargs.items()) kwargs[k] = v;
    try {
      text = llm_.render_chat(g.messages.dump(), g.add_generation_prompt, kwargs.dump());
    } catch (const Error& e) {
      // A template that raised (roles out of order, ...) or a model without a template.
      throw ApiError(400, std::string("chat template: ") + e.what(), "messages");
    }
  }
  Prompt prompt(std::move(text));
  prompt.add_special_tokens = g.add_special_tokens;
  return llm_.encode(prompt);
}

HandlerResult ApiServer::generate(const HttpRequest& req, Endpoint endpoint) {
  const Json body = parse_body(req);
  GenerationRequest g = parse_generation_request(body, endpoint, options_.parsers);
  check_model(g.model);
  std::vector<int32_t> ids = prompt_ids(g);
  const char* prompt_field = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (ids.empty()) throw ApiError(400, "the prompt is empty (no tokens)", prompt_field);
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t limit = llm_.max_model_len();
  // vLLM's rule and message: prompt + requested completion must fit the context.
  const int64_t completion = g.max_tokens_given ? g.params.max_tokens : 1;
  if (n >= limit || (g.max_tokens_given && completion > limit - n)) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you "
                               "requested {} tokens ({} in the {}, {} in the completion). Please "
                               "reduce the length of the {} or completion.",
                               limit, n + completion, n, prompt_field, completion, prompt_field),
                   prompt_field, "context_length_exceeded");
  }
  if (!g.max_tokens_given && endpoint == Endpoint::kChat) g.params.max_tokens = limit - n;
  try {
    g.params.validate();
  } catch (const Error& e) {
    throw to_api_error(e);
  }
  ResponseBuilder builder(endpoint, model_name(), llm_.tokenizer(), g.logprobs, g.tool_call,
                          g.parsing);
  auto state = std::make_shared<RequestState>(RequestState{
      std::move(g), std::move(builder), std::make_shared<ResponseStream>(), &metrics_, n});
  std::shared_ptr<ResponseStream> stream = state->stream;
  const auto id = loop_.submit(std::move(ids), state->g.params,
                               [state](const LoopEvent& ev) { on_event(*state, ev); });
  if (!id) throw ApiError(503, "the server is shutting down");
  EngineLoop* loop = &loop_;
  const uint64_t rid = *id;
  stream->set_on_cancel([loop, rid] { loop->abort(rid); });
  HandlerResult r;
  r.stream = std::move(stream);
  return r;
}

HttpResponse ApiServer::tokenize(const HttpRequest& req) {
  const Json body = parse_body(req);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  GenerationRequest g;
  if (body.contains("model") && body["model"].is_string()) check_model(body["model"]);
  auto flag = [&](const char* name, bool dflt) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return dflt;
    if (!it->is_boolean())
      throw ApiError(400, std::string("'") + name + "' must be a boolean", name);
    return it->get<bool>();
  };
  if (body.contains("messages")) {
    Json chat = body;
    chat.erase("prompt");
    g = parse_generation_request(chat, Endpoint::kChat, options_.parsers);
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string())
      throw ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt");
    g.endpoint = Endpoint::kCompletions;
    g.prompt_text = it->get<std::string>();
  }
  g.add_special_tokens = flag("add_special_tokens", g.endpoint == Endpoint::kCompletions);
  g.add_generation_prompt = flag("add_generation_prompt", true);
  const std::vector<int32_t> ids = prompt_ids(g);
  Json out = {{"count", ids.size()}, {"max_model_len", llm_.max_model_len()}, {"tokens", ids}};
  if (flag("return_token_strs", false)) {
    Json strs = Json::array();
    for (int32_t t : ids) strs.push_back(llm_.tokenizer()->id_to_token(t));
    out["token_strs"] = strs;
  } else {
    out["token_strs"] = nullptr;
  }
  return json_response(200, out.dump(-1, ' ', false, Json::error_handler_t::replace));
}

HttpResponse ApiServer::detokenize(const HttpRequest& req) {
  const Json body = parse_body(req);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (body.contains("model") && body["model"].is_string()) check_model(body["model"]);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array())
    throw ApiError(400, "'tokens' (an array of token ids) is required", "tokens");
  const Tokenizer* tok = llm_.tokenizer();
  if (tok == nullptr) throw ApiError(400, "this model has no tokenizer");
  std::vector<int32_t> ids;
  for (const Json& t : *it) {
    if (!t.is_number_integer()) throw ApiError(400, "'tokens' must hold integers", "tokens");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > INT32_MAX || !tok->is_valid_id(static_cast<int32_t>(v)))
      throw ApiError(400, "token id " + std::to_string(v) + " is outside the vocabulary", "tokens");
    ids.push_back(static_cast<int32_t>(v));
  }
  return json_response(
      200, Json{{"prompt", tok->decode(ids)}}.dump(-1, ' ', false, Json::error_handler_t::replace));
}

}  // namespace longctx::server
