// HTTP/1.1 over Boost.Beast/Asio (header-only, Debian's libboost-dev): asynchronous I/O on a
// few threads, so hundreds of open streams cost no thread each; request bodies past the limit
// get 413 before they are read; a client that closes its connection while its response is
// pending (streamed or not) cancels the ResponseStream, which aborts the request. Connections
// are persistent (HTTP/1.1's default; `Connection: close` and HTTP/1.0 without keep-alive
// honoured): streams go out chunked, and the connection then waits for its next request up to
// the keep-alive timeout. Past max_connections open ones, a new connection gets 503. CORS
// (cors.h) is answered here, before the handler: preflights need no API key.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "server/cors.h"
#include "server/http_types.h"

namespace longctx::server {

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: an ephemeral port (see HttpTransport::port())
  int threads = 2;  // I/O threads
  int64_t max_body_bytes = 32 << 20;
  int64_t max_header_bytes = 64 << 10;
  double idle_timeout_s = 60;  // a new connection that sends no (complete) request for this long
  // A kept-alive connection idle for this long after a response is closed (uvicorn's and so
  // vLLM's default).
  double keep_alive_timeout_s = 5;
  int64_t max_connections = 4096;  // open at once; more get 503 (descriptors are finite)
  CorsOptions cors;
};

// Makes the response for errors the transport finds itself (413 oversized body, 400 bad HTTP).
using ErrorResponder = std::function<HttpResponse(int status, const std::string& message)>;

class HttpTransport {
 public:
  // Binds and listens (Error(kIo) naming host:port when it cannot); serves after start().
  HttpTransport(HttpHandler handler, ErrorResponder on_error, TransportOptions options);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  int port() const;
  void start();
  // Closes the listening socket (new connections are refused); open ones go on.
  void stop_accepting();
  // Waits up to `grace_s` for open connections to end, then stops the I/O threads (closing what
  // is left). Idempotent.
  void stop(double grace_s = 0);
  int64_t open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx::server
