// What a request produces: its tokens, text, why it ended, logprobs and timings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/engine/sampler.h"

namespace longctx {

// vLLM / OpenAI naming: "stop" = the model ended it (EOS, a stop token or a stop string),
// "length" = max_tokens or the context length ran out, "abort" = the caller aborted it (a
// client that went away, a server shutting down). StopReason says which stop it was.
enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason reason);  // "", "stop", "length", "abort"

struct StopReason {
  enum class Kind { kNone, kEos, kStopToken, kStopString };
  Kind kind = Kind::kNone;
  int32_t token = -1;       // kEos, kStopToken
  std::string text;         // kStopString
  std::string str() const;  // "eos (token 2)", "stop token 7", "stop string \"\\n\"", ""
};

// Seconds on a steady clock; derived rates are 0 when undefined.
struct RequestMetrics {
  double arrival = 0;      // the request was submitted
  double scheduled = 0;    // its prefill started
  double first_token = 0;  // its first token was sampled
  double finished = 0;
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
  int64_t num_generated_tokens = 0;
  // Speculative decoding: steps that verified a draft, draft tokens verified, of those accepted.
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;

  double ttft() const { return first_token - arrival; }  // includes queueing, as vLLM
  double prefill_seconds() const { return first_token - scheduled; }
  double decode_seconds() const { return finished - first_token; }
  double prefill_tokens_per_s() const;
  // Tokens after the first over the time after the first (the first comes from the prefill).
  double decode_tokens_per_s() const;
  // Tokens a verifying step yielded on average: 1 + accepted / drafts (0 without drafts).
  double mean_acceptance_length() const {
    return num_drafts > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / num_drafts : 0.0;
  }
  // Adds `other`'s speculative counters (a run's totals over its requests).
  void add_speculative(const RequestMetrics& other) {
    num_drafts += other.num_drafts;
    num_draft_tokens += other.num_draft_tokens;
    num_accepted_tokens += other.num_accepted_tokens;
  }
};

struct RequestOutput {
  size_t index = 0;  // position in the generate() call's prompt list
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> token_ids;  // generated, including a final EOS / stop token
  std::string text;  // detokenized output, cut before a stop string ("" w/o tokenizer)
  FinishReason finish_reason = FinishReason::kNone;
  StopReason stop_reason;
  std::vector<TokenLogprobs> logprobs;  // one per generated token when asked
  RequestMetrics metrics;
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace longctx
