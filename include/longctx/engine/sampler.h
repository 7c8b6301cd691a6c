// Token sampling from f32 logits, in vLLM's order: penalties -> temperature -> min_p -> top_k ->
// top_p -> draw, by the sampling op (src/ops/sampling.h; its CPU twin is the reference). The
// draw's uniform is counter-based: for a request's k-th sampled token it is a function of
// (seed, k) alone (Philox4x32-10), so a seed reproduces a request whatever else runs beside it,
// and the GPU sampler (src/engine/gpu_sampler.h) draws the same number and token.
#pragma once

#include <cstdint>
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

  uint64_t seed() const { return seed_; }
  // Tokens sampled so far: the counter of the next draw's uniform.
  uint64_t step() const { return step_; }
  // Moves to the next draw; sample_token and GpuSampler::sample call it once per token.
  void advance() { ++step_; }
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  // Tokens seen in prompt or output (for repetition_penalty); empty when that penalty is off.
  const std::unordered_set<int32_t>& seen() const { return seen_; }
  // The tokens the next draw may take, bit t of word t / 32 ((vocab + 31) / 32 words), set
  // before each draw for a request with a structured output (the engine's grammar matcher);
  // empty: every token. Disallowed tokens become -inf after the penalties.
  std::vector<uint32_t>& token_mask() { return token_mask_; }
  const std::vector<uint32_t>& token_mask() const { return token_mask_; }

 private:
  uint64_t seed_ = 0;
  uint64_t step_ = 0;
  bool track_seen_ = false;
  std::unordered_map<int32_t, int32_t> output_counts_;  // token -> times generated
  std::unordered_set<int32_t> seen_;                    // prompt + generated tokens
  std::vector<uint32_t> token_mask_;
};

struct SampleResult {
  int32_t token = -1;
  TokenLogprobs logprobs;  // filled when params.logprobs is set
};

// Samples one token from `logits` ([vocab] f32, not modified) with the uniform
// of (state.seed(), state.step()) (kernels/philox.h), then advances the state. Throws
// Error(kInvalidArgument) on NaN or +inf logits, when nothing has finite probability, when the
// penalties or the temperature overflow a logit, or past 2^20 tokens of vocabulary; the state
// does not advance then.
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          SamplerState& state);

}  // namespace longctx
