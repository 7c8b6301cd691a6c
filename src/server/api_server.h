// The OpenAI-compatible API over an LLM driven by an EngineLoop: routing, the API key, request
// checks, the streaming and non-streaming response flows, /metrics, /tokenize, /detokenize and
// the chat page. Transport-agnostic (see http_types.h); handle() is called from any number of
// I/O threads at once.
#pragma once

#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "longctx/llm.h"
#include "server/http_types.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"

namespace longctx::server {

struct ApiServerOptions {
  // Names the model answers to; the first is the one responses and /v1/models show.
  std::vector<std::string> served_model_names;
  std::string model_root;   // /v1/models' "root" (the model folder)
  std::string api_key;      // empty: no key; else /v1/*, /tokenize, /detokenize need it
  int max_json_depth = 64;  // request bodies nested deeper are refused (400)
  Json default_chat_template_kwargs = Json::object();  // e.g. {"enable_thinking": false}
  // --tool-call-parser (tool_choice "auto") and --reasoning-parser.
  OutputParsers parsers;
  // --debug-kv-cache-blocks: GET /debug/kv_cache_blocks lists the prefix cache's block hashes
  // (the engine loop must track them), for checking what a KV-event consumer rebuilt.
  bool debug_kv_cache_blocks = false;
};

class ApiServer {
 public:
  // `loop` must drive `llm`'s engine core; both must outlive the server.
  ApiServer(LLM& llm, EngineLoop& loop, ApiServerOptions options);

  HandlerResult handle(const HttpRequest& request);
  // The error response the transport sends itself (oversized body, unparsable HTTP).
  HttpResponse error_response(int status, const std::string& message);

  const ServerMetrics& metrics() const { return metrics_; }
  const std::string& model_name() const { return options_.served_model_names.front(); }
  // /health: 200 while requests are accepted (the model is loaded before the server exists),
  // 503 once shutdown (a SIGTERM drain) began.
  HttpResponse health() const;

 private:
  HandlerResult route(const HttpRequest& request);
  HandlerResult generate(const HttpRequest& request, Endpoint endpoint);
  HttpResponse kv_cache_blocks() const;
  HttpResponse models() const;
  HttpResponse tokenize(const HttpRequest& request);
  HttpResponse detokenize(const HttpRequest& request);
  Json parse_body(const HttpRequest& request) const;
  void check_model(const std::string& model) const;
  bool authorized(const HttpRequest& request) const;
  std::vector<int32_t> prompt_ids(const GenerationRequest& g);

  LLM& llm_;
  EngineLoop& loop_;
  ApiServerOptions options_;
  ServerMetrics metrics_;
  int64_t created_;  // unix seconds when the server started (/v1/models)
};

// The chat page served at "/" (one static HTML + JS file, embedded at build time).
std::string_view chat_page_html();

}  // namespace longctx::server
