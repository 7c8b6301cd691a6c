// Token sampling from f32 logits, in vLLM's order: penalties -> temperature -> min_p -> top_k ->
// top_p -> draw. Every request owns its generator (SamplerState), so a seed reproduces a request
// whatever else runs beside it.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "longctx/engine/sampling_params.h"

namespace longctx {

// Logprobs of one generated token (raw model distribution, see SamplingParams::logprobs).
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;                        // of `token`
  int64_t rank = 0;                            // 1 = most likely token
  std::vector<std::pair<int32_t, float>> top;  // the N most likely, most likely first
};

// What the sampler keeps per request.
class SamplerState {
 public:
  SamplerState() = default;
  SamplerState(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt);

  // Records a generated token (for the penalties).
  void append_output(int32_t token);

  std::mt19937_64& rng() { return rng_; }
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  // Tokens seen in prompt or output (for repetition_penalty); empty when that penalty is off.
  const std::unordered_set<int32_t>& seen() const { return seen_; }

 private:
  std::mt19937_64 rng_;
  bool track_seen_ = false;
  std::unordered_map<int32_t, int32_t> output_counts_;  // token -> times generated
  std::unordered_set<int32_t> seen_;                    // prompt + generated tokens
};

struct SampleResult {
  int32_t token = -1;
  TokenLogprobs logprobs;  // filled when params.logprobs is set
};

// Samples one token from `logits` ([vocab] f32, not modified). Throws Error(kInvalidArgument) on
// NaN logits or when nothing has finite probability.
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          SamplerState& state);

// The steps, exposed for tests. `logits` is modified in place; masked entries become -inf.
void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     const SamplerState& state);
void apply_temperature(std::span<float> logits, double temperature);
void apply_min_p(std::span<float> logits, double min_p);
void apply_top_k(std::span<float> logits, int64_t top_k);
void apply_top_p(std::span<float> logits, double top_p);

// A uniform double in [0, 1) from 53 bits of the generator (portable, unlike
// std::uniform_real_distribution whose output differs between standard libraries).
inline double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

}  // namespace longctx
