#include "engine/zmq_library.h"

#include <mutex>

#include "core/shared_library.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

ZmqLibrary open_library() {
  const SharedLibrary lib("libzmq.so.5", "KV-cache events need ZeroMQ", "libzmq5");
  ZmqLibrary z{};
  lib.load("zmq_ctx_new", z.ctx_new);
  lib.load("zmq_ctx_term", z.ctx_term);
  lib.load("zmq_socket", z.socket);
  lib.load("zmq_close", z.close);
  lib.load("zmq_setsockopt", z.setsockopt);
  lib.load("zmq_getsockopt", z.getsockopt);
  lib.load("zmq_bind", z.bind);
  lib.load("zmq_connect", z.connect);
  lib.load("zmq_send", z.send);
  lib.load("zmq_recv", z.recv);
  lib.load("zmq_poll", z.poll);
  lib.load("zmq_errno", z.errno_);
  lib.load("zmq_strerror", z.strerror);
  return z;  // the library stays open for the process's life
}

}  // namespace

const ZmqLibrary& zmq_library() {
  static std::once_flag once;
  static ZmqLibrary lib;
  static std::string failure;
  std::call_once(once, [] {
    try {
      lib = open_library();
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  LONGCTX_CHECK(failure.empty(), ErrorCode::kNotFound, "{}", failure);
  return lib;
}

}  // namespace longctx
