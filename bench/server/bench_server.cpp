// bench_server: requests/s and TTFT percentiles of N concurrent streaming clients against the
// server's API handler behind each HTTP library, with a scripted engine that costs ~nothing (so
// the HTTP layer is what is measured). Prints one markdown table row per (library, N).
//   bench_server [--tokenizer models/needle] [--tokens 16] [--clients 1,16,64,256]
// With --port P it loads a running server instead (`longctx serve`, e.g. the GPU engine):
//   bench_server --port P --clients 200 --tokens 128 --total 800 [--prompt-len 256]
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "engine/llm_internal.h"
#include "engine/text_stream.h"
#include "longctx/llm.h"
#include "longctx/tokenizer/tokenizer.h"
#include "server/api_server.h"
#include "server/http_transport.h"
#include "server/load_client.h"
#ifdef LONGCTX_BENCH_HTTPLIB
#include "httplib_transport.h"
#endif

namespace {

using namespace longctx;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Setup {
  std::unique_ptr<LLM> llm;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<server::ApiServer> api;
};

Setup make_setup(std::shared_ptr<const Tokenizer> tok) {
  const auto script = tok->encode(" the quick brown fox jumps over the lazy dog.");
  const auto vocab = static_cast<int64_t>(tok->vocab_size());
  auto fn = [script, vocab](const StepInput& in) {
    std::vector<float> l(vocab, 0.0f);
    l[script[in.all_tokens.size() % script.size()]] = 20.0f;
    return l;
  };
  Setup s;
  s.llm =
      std::make_unique<LLM>(make_function_executor(vocab, fn), tok, 4096, std::vector<int64_t>{});
  s.loop = std::make_unique<EngineLoop>(engine_core(*s.llm));
  server::ApiServerOptions o;
  o.served_model_names = {"bench"};
  s.api = std::make_unique<server::ApiServer>(*s.llm, *s.loop, o);
  return s;
}

void run(const char* library, int port, int clients, int tokens, int total = 0,
         int prompt_len = 4) {
  server::LoadOptions o;
  o.port = port;
  o.concurrency = clients;
  o.total = total > 0 ? total : std::max(200, clients * 4);
  o.timeout_s = 600;
  o.body = [tokens, prompt_len](int i) {
    nlohmann::json prompt = nlohmann::json::array({1 + i % 100});
    for (int k = 1; k < prompt_len; ++k) prompt.push_back(1 + (i * 7919 + k * 104729) % 30000);
    return nlohmann::json{
        {"prompt", prompt}, {"max_tokens", tokens}, {"ignore_eos", true}, {"stream", true}}
        .dump();
  };
  const double cpu0 = cpu_seconds();
  server::LoadResult r = server::run_sse_load(o);
  const double cpu = cpu_seconds() - cpu0;
  std::printf("| %s | %d | %d | %d | %.0f | %.1f | %.1f | %.1f | %.2f |\n", library, clients,
              r.completed, r.failed, r.requests_per_s(),
              1e3 * server::LoadResult::percentile(r.ttft_s, 0.5),
              1e3 * server::LoadResult::percentile(r.ttft_s, 0.99),
              1e3 * server::LoadResult::percentile(r.e2e_s, 0.99),
              r.completed > 0 ? 1e3 * cpu / r.completed : 0.0);
  std::printf("  %d streams in %.2f s: %.0f output tok/s (%d tokens each)\n", r.completed, r.wall_s,
              r.wall_s > 0 ? double(r.completed) * tokens / r.wall_s : 0.0, tokens);
  for (const auto& f : r.failures) std::printf("  failure: %s\n", f.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_dir = "models/needle";
  int tokens = 16;
  std::vector<int> clients = {1, 16, 64, 256};
  int port = 0, total = 0, prompt_len = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--port")) {
      port = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--total")) {
      total = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--prompt-len")) {
      prompt_len = std::max(1, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--tokenizer")) {
      tok_dir = argv[i + 1];
    } else if (!std::strcmp(argv[i], "--tokens")) {
      tokens = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--clients")) {
      clients.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string x; std::getline(ss, x, ',');) clients.push_back(std::atoi(x.c_str()));
    }
  }
  if (port > 0) {  // a running server (`longctx serve`), e.g. the GPU engine
    std::printf("%d tokens per request, prompts of %d tokens\n\n", tokens, prompt_len);
    std::printf(
        "| server | clients | completed | failed | req/s | TTFT p50 ms | TTFT p99 ms | "
        "e2e p99 ms | client CPU ms/req |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int n : clients) run("longctx serve", port, n, tokens, total, prompt_len);
    return 0;
  }
  auto tok = load_tokenizer_for_engine(tok_dir);
  std::printf("%d tokens per request, requests = max(200, 4 x clients)\n\n", tokens);
  std::printf(
      "| library | clients | completed | failed | req/s | TTFT p50 ms | TTFT p99 ms | "
      "e2e p99 ms | CPU ms/req |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int n : clients) {
    Setup s = make_setup(tok);
    server::ApiServer* api = s.api.get();
    server::TransportOptions t;
    t.port = 0;
    server::HttpTransport beast(
        [api](const server::HttpRequest& r) { return api->handle(r); },
        [api](int status, const std::string& m) { return api->error_response(status, m); }, t);
    beast.start();
    run("Boost.Beast (2 I/O threads)", beast.port(), n, tokens);
    s.loop->shutdown(EngineLoop::ShutdownMode::kAbort);
  }
#ifdef LONGCTX_BENCH_HTTPLIB
  for (int n : clients) {
    Setup s = make_setup(tok);
    server::ApiServer* api = s.api.get();
    bench::HttplibTransport h([api](const server::HttpRequest& r) { return api->handle(r); }, n + 8,
                              32 << 20);
    run("cpp-httplib (thread per connection)", h.port(), n, tokens);
    s.loop->shutdown(EngineLoop::ShutdownMode::kAbort);
  }
#else
  std::printf("\n(cpp-httplib not installed: apt-get install libcpp-httplib-dev, reconfigure)\n");
#endif
  return 0;
}
