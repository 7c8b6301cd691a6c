#include "longctx/engine/request_output.h"

#include <fmt/format.h>

namespace longctx {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kNone:
      break;
  }
  return "";
}

std::string StopReason::str() const {
  switch (kind) {
    case Kind::kEos:
      return fmt::format("eos (token {})", token);
    case Kind::kStopToken:
      return fmt::format("stop token {}", token);
    case Kind::kStopString: {
      std::string escaped;
      for (char c : text) {
        if (c == '\n') {
          escaped += "\\n";
        } else if (c == '"' || c == '\\') {
          escaped += '\\';
          escaped += c;
        } else {
          escaped += c;
        }
      }
      return fmt::format("stop string \"{}\"", escaped);
    }
    case Kind::kNone:
      break;
  }
  return "";
}

double RequestMetrics::prefill_tokens_per_s() const {
  const double s = prefill_seconds();
  return s > 0 ? static_cast<double>(num_prompt_tokens) / s : 0.0;
}

double RequestMetrics::decode_tokens_per_s() const {
  const double s = decode_seconds();
  return s > 0 && num_generated_tokens > 1 ? static_cast<double>(num_generated_tokens - 1) / s
                                           : 0.0;
}

}  // namespace longctx
