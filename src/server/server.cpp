#include "server/server.h"

#include <signal.h>

#include <thread>

#include "engine/llm_internal.h"
#include "longctx/core/logging.h"

namespace longctx::server {

Server::Server(LLM& llm, ServeOptions options) : options_(std::move(options)) {
  loop_ = std::make_unique<EngineLoop>(engine_core(llm), options_.api.debug_kv_cache_blocks);
  api_ = std::make_unique<ApiServer>(llm, *loop_, options_.api);
  ApiServer* api = api_.get();
  transport_ =
      std::make_unique<HttpTransport>([api](const HttpRequest& r) { return api->handle(r); },
                                      [api](int status, const std::string& message) {
                                        return api->error_response(status, message);
                                      },
                                      options_.transport);
  transport_->start();
}

Server::~Server() { shutdown(EngineLoop::ShutdownMode::kAbort); }

void Server::shutdown(EngineLoop::ShutdownMode mode, double drain_timeout_s) {
  // A drain keeps the listener open until the requests in flight finished: routers and
  // readiness probes read /health's 503 (and new requests get 503) rather than a refused
  // connection they may take for a crash.
  if (mode == EngineLoop::ShutdownMode::kAbort) transport_->stop_accepting();
  loop_->shutdown(mode, drain_timeout_s);
  transport_->stop_accepting();
  // Every request has its final event now; give the streams a moment to flush it.
  transport_->stop(options_.close_grace_s);
}

void block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void serve_until_signal(Server& server, double drain_timeout_s) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  const auto stats = server.loop().stats();
  LONGCTX_LOG_WARN("{}: draining {} requests (up to {} s; a second signal aborts them)",
                   strsignal(sig), stats.num_in_flight, drain_timeout_s);
  std::thread second([&server, set] {
    // Waits for a second signal until the drain ended on its own.
    const timespec tick{0, 100 * 1000 * 1000};
    while (true) {
      const LoopStats s = server.loop().stats();
      if (!s.accepting && s.num_in_flight == 0) return;
      if (sigtimedwait(&set, nullptr, &tick) > 0) {
        LONGCTX_LOG_WARN("second signal: aborting the requests in flight");
        server.loop().shutdown(EngineLoop::ShutdownMode::kAbort);
        return;
      }
    }
  });
  server.shutdown(EngineLoop::ShutdownMode::kDrain, drain_timeout_s);
  second.join();
}

}  // namespace longctx::server
