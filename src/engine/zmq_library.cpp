#include "engine/zmq_library.h"

#include <dlfcn.h>

#include <mutex>

#include "longctx/core/error.h"

namespace longctx {

namespace {

template <typename F>
void load(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  LONGCTX_CHECK(f != nullptr, ErrorCode::kNotFound, "libzmq.so.5 has no {}", name);
}

ZmqLibrary open_library() {
  void* lib = dlopen("libzmq.so.5", RTLD_NOW | RTLD_LOCAL);
  LONGCTX_CHECK(lib != nullptr, ErrorCode::kNotFound,
                "KV-cache events need ZeroMQ: cannot open libzmq.so.5 ({}); install it (Debian: "
                "libzmq5)",
                dlerror());
  ZmqLibrary z{};
  load(lib, "zmq_ctx_new", z.ctx_new);
  load(lib, "zmq_ctx_term", z.ctx_term);
  load(lib, "zmq_socket", z.socket);
  load(lib, "zmq_close", z.close);
  load(lib, "zmq_setsockopt", z.setsockopt);
  load(lib, "zmq_getsockopt", z.getsockopt);
  load(lib, "zmq_bind", z.bind);
  load(lib, "zmq_connect", z.connect);
  load(lib, "zmq_send", z.send);
  load(lib, "zmq_recv", z.recv);
  load(lib, "zmq_poll", z.poll);
  load(lib, "zmq_errno", z.errno_);
  load(lib, "zmq_strerror", z.strerror);
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
