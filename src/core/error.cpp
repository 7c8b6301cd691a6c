#include "longctx/core/error.h"

namespace longctx {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kOutOfRange:
      return "out of range";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kCuda:
      return "CUDA error";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

void throw_internal(const char* file, int line, const char* cond, const std::string& message) {
  std::string m = fmt::format("{}:{}: assertion `{}` failed", file, line, cond);
  if (!message.empty()) m += ": " + message;
  throw InternalError(m);
}

void throw_cuda_error(const char* file, int line, const char* call, const char* what) {
  throw Error(ErrorCode::kCuda, fmt::format("{}:{}: {} failed: {}", file, line, call, what));
}

}  // namespace longctx
