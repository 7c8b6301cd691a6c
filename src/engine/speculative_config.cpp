#include "longctx/engine/speculative_config.h"

#include "longctx/core/error.h"

namespace longctx {

SpeculativeMethod parse_speculative_method(std::string_view name) {
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name.empty() || name == "none") return SpeculativeMethod::kNone;
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "unknown speculative method '{}' (known: ngram, none)",
                name);
}

std::string_view speculative_method_name(SpeculativeMethod method) {
  return method == SpeculativeMethod::kNgram ? "ngram" : "none";
}

SpeculativeConfig SpeculativeConfig::resolved() const {
  SpeculativeConfig c = *this;
  if (!enabled()) {
    LONGCTX_CHECK(num_speculative_tokens == 0 && prompt_lookup_min == 0 && prompt_lookup_max == 0,
                  ErrorCode::kInvalidArgument,
                  "--num-speculative-tokens / --prompt-lookup-min / --prompt-lookup-max need "
                  "--speculative-method ngram");
    return c;
  }
  LONGCTX_CHECK(num_speculative_tokens >= 1, ErrorCode::kInvalidArgument,
                "--speculative-method {} needs --num-speculative-tokens >= 1, got {}",
                speculative_method_name(method), num_speculative_tokens);
  LONGCTX_CHECK(prompt_lookup_min >= 0 && prompt_lookup_max >= 0, ErrorCode::kInvalidArgument,
                "--prompt-lookup-min ({}) and --prompt-lookup-max ({}) must be >= 1",
                prompt_lookup_min, prompt_lookup_max);
  constexpr int64_t kDefaultLookup = 5;
  if (c.prompt_lookup_min == 0 && c.prompt_lookup_max == 0) {
    c.prompt_lookup_min = c.prompt_lookup_max = kDefaultLookup;
  } else if (c.prompt_lookup_min == 0) {
    c.prompt_lookup_min = c.prompt_lookup_max;
  } else if (c.prompt_lookup_max == 0) {
    c.prompt_lookup_max = c.prompt_lookup_min;
  }
  LONGCTX_CHECK(c.prompt_lookup_min <= c.prompt_lookup_max, ErrorCode::kInvalidArgument,
                "--prompt-lookup-min {} is greater than --prompt-lookup-max {}",
                c.prompt_lookup_min, c.prompt_lookup_max);
  return c;
}

}  // namespace longctx
