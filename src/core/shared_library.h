// Libraries opened at run time (dlopen), for features only some runs use and whose libraries the
// project cannot link statically (libzmq, hiredis): a run without the feature needs no library,
// and one with it gets an error naming the file and the Debian package. The handle stays open for
// the process's life.
#pragma once

#include <dlfcn.h>

#include <string>

#include "longctx/core/error.h"

namespace longctx {

class SharedLibrary {
 public:
  // Opens `file` (e.g. "libzmq.so.5"); `why` says what needs it ("--kv-store needs hiredis") and
  // `package` is the Debian package that installs it. Throws Error(kNotFound) naming them.
  SharedLibrary(const char* file, const char* why, const char* package) : file_(file) {
    handle_ = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    LONGCTX_CHECK(handle_ != nullptr, ErrorCode::kNotFound,
                  "{}: cannot open {} ({}); install it (Debian: {})", why, file, dlerror(),
                  package);
  }

  // Points `f` at the symbol `name`; throws Error(kNotFound) naming the library and the symbol.
  template <typename F>
  void load(const char* name, F& f) const {
    f = reinterpret_cast<F>(dlsym(handle_, name));
    LONGCTX_CHECK(f != nullptr, ErrorCode::kNotFound, "{} has no {}", file_, name);
  }

 private:
  std::string file_;
  void* handle_ = nullptr;
};

}  // namespace longctx
