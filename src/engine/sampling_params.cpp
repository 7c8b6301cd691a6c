// SamplingParams::validate: the ranges vLLM accepts, with messages that say what was wrong.
#include "longctx/engine/sampling_params.h"

#include <cmath>

#include "longctx/core/error.h"

namespace longctx {

void SamplingParams::validate() const {
  constexpr auto kBad = ErrorCode::kInvalidArgument;
  LONGCTX_CHECK(std::isfinite(temperature) && temperature >= 0.0, kBad,
                "temperature must be a finite number >= 0 (0 = greedy), got {}", temperature);
  LONGCTX_CHECK(top_k >= -1, kBad, "top_k must be 0 or -1 (all tokens) or >= 1, got {}", top_k);
  LONGCTX_CHECK(top_p > 0.0 && top_p <= 1.0, kBad, "top_p must be in (0, 1], got {}", top_p);
  LONGCTX_CHECK(min_p >= 0.0 && min_p <= 1.0, kBad, "min_p must be in [0, 1], got {}", min_p);
  LONGCTX_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0, kBad,
                "repetition_penalty must be > 0 (1 = off), got {}", repetition_penalty);
  LONGCTX_CHECK(presence_penalty >= -2.0 && presence_penalty <= 2.0, kBad,
                "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  LONGCTX_CHECK(frequency_penalty >= -2.0 && frequency_penalty <= 2.0, kBad,
                "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  LONGCTX_CHECK(max_tokens >= 1, kBad, "max_tokens must be at least 1, got {}", max_tokens);
  for (size_t i = 0; i < stop.size(); ++i) {
    LONGCTX_CHECK(!stop[i].empty(), kBad, "stop string {} is empty", i);
  }
  for (int32_t t : stop_token_ids) {
    LONGCTX_CHECK(t >= 0, kBad, "stop_token_ids must be >= 0, got {}", t);
  }
  LONGCTX_CHECK(
      structured.kind != StructuredOutput::Kind::kJsonSchema || !structured.json_schema.empty(),
      kBad, "a JSON-schema structured output needs a schema");
  LONGCTX_CHECK(structured.kind != StructuredOutput::Kind::kChoice || !structured.choices.empty(),
                kBad, "a choice structured output needs at least one choice");
  if (logprobs) {
    LONGCTX_CHECK(*logprobs >= 0 && *logprobs <= kMaxLogprobs, kBad,
                  "logprobs must be in [0, {}], got {}", kMaxLogprobs, *logprobs);
  }
}

}  // namespace longctx
