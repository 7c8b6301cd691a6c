// cpp-httplib in front of the same ApiServer, for the library comparison only: blocking I/O,
// one pool thread per open connection; a stream's provider waits on the ResponseStream.
#pragma once

#include <memory>

#include "server/http_types.h"

namespace longctx::bench {

class HttplibTransport {
 public:
  // Listens on 127.0.0.1, an ephemeral port; `threads` pool threads.
  HttplibTransport(server::HttpHandler handler, int threads, int64_t max_body_bytes);
  ~HttplibTransport();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx::bench
