// Errors. Two kinds, kept apart on purpose:
//  - invariants (programming errors inside longctx) fail LONGCTX_ASSERT, which throws
//    InternalError carrying file:line, so tests can observe them and nothing aborts silently;
//  - recoverable conditions (bad checkpoint, bad request, bad config) throw longctx::Error with a
//    message that names the failing thing (file, tensor, field, value).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
// nvcc cannot compile fmt's compile-time format checks; .cu files use the small runtime
// formatter below, which substitutes each "{}" with the next argument.
namespace longctx::detail {
inline void format_into(std::ostringstream& os, std::string_view f) { os << f; }
template <typename T, typename... Rest>
void format_into(std::ostringstream& os, std::string_view f, const T& v, const Rest&... rest) {
  size_t p = f.find("{}");
  if (p == std::string_view::npos) {
    os << f;
    return;
  }
  os << f.substr(0, p) << v;
  format_into(os, f.substr(p + 2), rest...);
}
template <typename... Args>
std::string format(std::string_view f, const Args&... args) {
  std::ostringstream os;
  format_into(os, f, args...);
  return os.str();
}
}  // namespace longctx::detail
#define LONGCTX_FORMAT ::longctx::detail::format
#else
#include <fmt/format.h>
#define LONGCTX_FORMAT ::fmt::format
#endif

namespace longctx {

enum class ErrorCode {
  kInvalidArgument,  // a caller passed something malformed
  kNotFound,         // a file, tensor or key is missing
  kUnsupported,      // well-formed but not implemented (architecture, dtype, rope type, ...)
  kOutOfRange,       // a length or index past a limit (prompt longer than the context, ...)
  kIo,               // the OS refused (open, mmap, read)
  kCuda,             // a CUDA / cuBLAS call failed
  kOutOfMemory,      // an allocation past a memory budget (device pool, host)
  kInternal,         // a broken invariant
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message) : Error(ErrorCode::kInternal, message) {}
};

[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& message);

}  // namespace longctx

// Throws longctx::Error(code, formatted message) when cond is false.
#define LONGCTX_CHECK(cond, code, ...)                                        \
  do {                                                                        \
    if (!(cond)) throw ::longctx::Error((code), LONGCTX_FORMAT(__VA_ARGS__)); \
  } while (0)

#define LONGCTX_THROW(code, ...) throw ::longctx::Error((code), LONGCTX_FORMAT(__VA_ARGS__))

// Invariant: throws InternalError "file:line: assertion `cond` failed: message".
#define LONGCTX_ASSERT(cond, ...)                                                           \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::longctx::throw_internal(__FILE__, __LINE__, #cond, LONGCTX_FORMAT("" __VA_ARGS__)); \
  } while (0)
