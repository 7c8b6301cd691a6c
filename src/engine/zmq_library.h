// libzmq's C API, opened on first use (dlopen of libzmq.so.5): binaries that publish no KV-cache
// events do not need the library (the GPU machines run binaries built elsewhere), and one that
// does gets a clear error naming the package when it is missing.
#pragma once

#include <zmq.h>

namespace longctx {

struct ZmqLibrary {
  decltype(&::zmq_ctx_new) ctx_new;
  decltype(&::zmq_ctx_term) ctx_term;
  decltype(&::zmq_socket) socket;
  decltype(&::zmq_close) close;
  decltype(&::zmq_setsockopt) setsockopt;
  decltype(&::zmq_getsockopt) getsockopt;
  decltype(&::zmq_bind) bind;
  decltype(&::zmq_connect) connect;
  decltype(&::zmq_send) send;
  decltype(&::zmq_recv) recv;
  decltype(&::zmq_poll) poll;
  decltype(&::zmq_errno) errno_;
  decltype(&::zmq_strerror) strerror;
};

// The loaded library; throws Error(kNotFound) when libzmq.so.5 cannot be opened or lacks a
// function.
const ZmqLibrary& zmq_library();

}  // namespace longctx
