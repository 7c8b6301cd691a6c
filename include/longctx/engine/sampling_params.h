// Per-request sampling and stopping parameters, with vLLM's names, defaults and meaning (see
// validate() for the accepted ranges). Greedy decoding is temperature 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace longctx {

// Structured output (docs/server.md, "Structured outputs"): the generated text is a compact JSON
// document (no whitespace) of this kind. Each step the sampler keeps only the tokens the grammar
// allows, EOS only where the document may end, and generation ends when the document is
// complete. The document is closed by max_tokens when the vocabulary holds every byte as a token
// (byte-level BPE) and max_tokens covers the shortest document; docs/server.md says how.
struct StructuredOutput {
  // kRegex: the whole output matches `regex` (an ECMA-262 subset, docs/server.md); kChoice: the
  // output is exactly one of `choices`.
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice };
  Kind kind = Kind::kNone;
  std::string json_schema;           // kJsonSchema: the schema as JSON text
  std::string regex;                 // kRegex
  std::vector<std::string> choices;  // kChoice
  bool enabled() const { return kind != Kind::kNone; }
};

struct SamplingParams {
  // Below kGreedyTemperature the request is greedy: argmax of the penalized logits, and
  // top_k / top_p / min_p / seed play no part (as vLLM's _SAMPLING_EPS).
  static constexpr double kGreedyTemperature = 1e-5;
  // The most top logprobs a request may ask for (vLLM's default max_logprobs).
  static constexpr int kMaxLogprobs = 20;

  double temperature = 1.0;  // >= 0; 0 = greedy
  int64_t top_k = 0;         // 0 or -1 = all tokens; else >= 1
  double top_p = 1.0;        // (0, 1]: keep the smallest set of top tokens with mass >= top_p
  double min_p = 0.0;        // [0, 1]: drop tokens with prob < min_p * max prob
  // Seed of this request's own generator: same seed, same tokens. Unset: the engine draws one
  // from its own generator (EngineConfig::seed), so a whole run is still reproducible.
  std::optional<uint64_t> seed;

  // HF / vLLM: over prompt and generated tokens, positive logits are divided by it and negative
  // ones multiplied. 1 = off; must be > 0.
  double repetition_penalty = 1.0;
  // OpenAI: over generated tokens, logit -= presence * [count > 0] + frequency * count.
  double presence_penalty = 0.0;   // [-2, 2]
  double frequency_penalty = 0.0;  // [-2, 2]

  // Generated tokens at most (the stop token included); also clipped by the context length.
  int64_t max_tokens = 16;
  // Text that ends generation; it is not part of the output text (nor streamed).
  std::vector<std::string> stop;
  // Tokens that end generation (kept in token_ids, their text not in the output).
  std::vector<int32_t> stop_token_ids;
  // Keep going past the model's EOS tokens (stop_token_ids still apply).
  bool ignore_eos = false;
  // Detokenize without special tokens (vLLM's default).
  bool skip_special_tokens = true;

  // Unset: no logprobs. N >= 0: for every generated token its logprob and rank, plus the N most
  // likely tokens with theirs. Logprobs are those of the raw model distribution (log_softmax of
  // the logits before penalties and temperature), like vLLM's default logprobs_mode.
  std::optional<int> logprobs;

  // None by default. A request with one needs an engine with a tokenizer; the schema is compiled
  // (and cached) when the request is checked, an unsupported keyword an Error naming it.
  StructuredOutput structured;

  bool greedy() const { return temperature < kGreedyTemperature; }

  // Throws Error(kInvalidArgument) naming the field, its value and the accepted range.
  void validate() const;
};

}  // namespace longctx
