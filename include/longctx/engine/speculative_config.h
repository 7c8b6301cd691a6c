// Speculative decoding (docs/engine.md, "Speculative decoding"): a decoding sequence runs its
// last sampled token plus a draft of up to num_speculative_tokens tokens in one step, and keeps
// the longest prefix of the draft the target model agrees with (greedy: exactly; sampled: by
// rejection sampling, so the output distribution is the model's), plus one token of the model.
// The drafts come from prompt lookup (n-grams of the sequence's own tokens), as vLLM's `ngram`.
#pragma once

#include <cstdint>
#include <string_view>

namespace longctx {

enum class SpeculativeMethod { kNone, kNgram };

// "ngram" -> kNgram ("none" and "" -> kNone); throws Error(kInvalidArgument) naming the known
// methods for anything else.
SpeculativeMethod parse_speculative_method(std::string_view name);
std::string_view speculative_method_name(SpeculativeMethod method);

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int64_t num_speculative_tokens = 0;  // K: draft tokens per sequence and step (>= 1 when on)
  // The n-gram sizes looked up, longest first; 0: vLLM's defaults (both 5 when neither is given,
  // else the one given).
  int64_t prompt_lookup_min = 0;
  int64_t prompt_lookup_max = 0;

  bool enabled() const { return method != SpeculativeMethod::kNone; }
  // Fills the n-gram defaults and throws Error(kInvalidArgument) naming the problem: K < 1 with a
  // method, a lookup size < 1, min > max, lookup sizes or K without a method.
  SpeculativeConfig resolved() const;
};

}  // namespace longctx
