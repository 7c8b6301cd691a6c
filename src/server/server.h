// `longctx serve` in one object: the engine loop over an LLM's core, the OpenAI API handler and
// the HTTP transport, started together and shut down in order (stop accepting, drain or abort
// the requests in flight, let their last bytes go out, stop the I/O threads).
#pragma once

#include <functional>
#include <memory>

#include "engine/engine_loop.h"
#include "longctx/llm.h"
#include "server/api_server.h"
#include "server/http_transport.h"

namespace longctx::server {

struct ServeOptions {
  TransportOptions transport;
  ApiServerOptions api;
  // On SIGINT/SIGTERM: requests in flight get this long to finish, then they are aborted (a
  // second signal aborts them at once).
  double drain_timeout_s = 30;
  double close_grace_s = 2;  // time for finished streams to reach their clients
};

class Server {
 public:
  // Starts serving `llm` (which must outlive the server and not be used meanwhile).
  Server(LLM& llm, ServeOptions options);
  ~Server();  // shutdown(kAbort)

  int port() const { return transport_->port(); }
  ApiServer& api() { return *api_; }
  EngineLoop& loop() { return *loop_; }
  HttpTransport& transport() { return *transport_; }

  // Idempotent; a kAbort during a kDrain in another thread cuts the drain short.
  void shutdown(EngineLoop::ShutdownMode mode, double drain_timeout_s = 0);

 private:
  ServeOptions options_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<HttpTransport> transport_;
};

// Blocks SIGINT and SIGTERM in the calling thread (call it before any thread starts, so every
// thread inherits the mask and only serve_until_signal sees them).
void block_shutdown_signals();
// Serves until SIGINT or SIGTERM: then drains (a second signal aborts) and shuts down.
void serve_until_signal(Server& server, double drain_timeout_s);

}  // namespace longctx::server
