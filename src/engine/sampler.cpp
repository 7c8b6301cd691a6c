// Sampling, step by step as vLLM's V1 sampler: penalties on the raw logits, then (unless greedy)
// temperature, min_p, top_k, top_p, and a draw from what is left. This is also the reference of
// the CUDA sampler: top_p and the draw count probability in exact integer masses
// (kernels/sampling_math.h) and the draw's uniform comes from (seed, step), so the GPU picks
// the same token bit for bit.
#include "longctx/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/philox.h"
#include "kernels/sampling_math.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float max_finite(std::span<const float> logits) {
  float m = kNegInf;
  for (float x : logits) m = std::max(m, x);
  return m;
}

int32_t argmax(std::span<const float> logits) {
  // First index of the maximum, like torch.argmax.
  int64_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void check_logits(std::span<const float> logits) {
  LONGCTX_CHECK(!logits.empty(), ErrorCode::kInvalidArgument, "sampling from empty logits");
  LONGCTX_CHECK(static_cast<int64_t>(logits.size()) <= kernels::kMaxSamplingVocab,
                ErrorCode::kInvalidArgument, "sampling: vocabulary of {} tokens, at most {}",
                logits.size(), kernels::kMaxSamplingVocab);
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    LONGCTX_CHECK(!std::isnan(logits[i]), ErrorCode::kInvalidArgument,
                  "the model produced a NaN logit (token {})", i);
    LONGCTX_CHECK(logits[i] != -kNegInf, ErrorCode::kInvalidArgument,
                  "the model produced a +inf logit (token {})", i);
    any_finite = any_finite || logits[i] != kNegInf;
  }
  LONGCTX_CHECK(any_finite, ErrorCode::kInvalidArgument,
                "every logit is -inf: no token can be sampled");
}

// After penalties and temperature: a finite logit may have overflowed, or all become -inf.
void check_transformed(std::span<const float> logits) {
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    LONGCTX_CHECK(logits[i] != -kNegInf, ErrorCode::kInvalidArgument,
                  "the logit of token {} overflows to +inf after penalties and temperature", i);
    any_finite = any_finite || logits[i] != kNegInf;
  }
  LONGCTX_CHECK(any_finite, ErrorCode::kInvalidArgument,
                "every logit is -inf after penalties and temperature: no token can be sampled");
}

// The first token (in id order) whose cumulative mass exceeds u * total.
int32_t draw(std::span<const float> logits, double u) {
  const float m = max_finite(logits);
  uint64_t total = 0;
  for (float x : logits) total += kernels::token_mass(kernels::sub_rn(x, m));
  const uint64_t target = kernels::draw_target(u, total);
  uint64_t cum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    cum += kernels::token_mass(kernels::sub_rn(logits[i], m));
    if (target < cum) return static_cast<int32_t>(i);
  }
  LONGCTX_ASSERT(false, "draw: target {} past the total mass {}", target, total);
  return -1;
}

double log_sum_exp(std::span<const float> logits) {
  const double m = max_finite(logits);
  double total = 0.0;
  for (float x : logits) total += x == kNegInf ? 0.0 : std::exp(x - m);
  return m + std::log(total);
}

TokenLogprobs compute_logprobs(std::span<const float> raw, int32_t token, int n_top) {
  // logprob_i = logit_i - logsumexp: ranks and the top N follow from the raw logits directly.
  const double log_z = log_sum_exp(raw);
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(raw[token] - log_z);
  out.rank = 1;
  for (float v : raw) out.rank += v > raw[token] ? 1 : 0;
  if (n_top > 0) {
    std::vector<int32_t> idx(raw.size());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t n = std::min(static_cast<size_t>(n_top), idx.size());
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
    });
    for (size_t i = 0; i < n; ++i) {
      out.top.emplace_back(idx[i], static_cast<float>(raw[idx[i]] - log_z));
    }
  }
  return out;
}

}  // namespace

SamplerState::SamplerState(const SamplingParams& params, uint64_t seed,
                           std::span<const int32_t> prompt)
    : seed_(seed), track_seen_(params.repetition_penalty != 1.0) {
  if (track_seen_) seen_.insert(prompt.begin(), prompt.end());
}

void SamplerState::append_output(int32_t token) {
  ++output_counts_[token];
  if (track_seen_) seen_.insert(token);
}

void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     const SamplerState& state) {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (params.repetition_penalty != 1.0) {
    const auto r = static_cast<float>(params.repetition_penalty);
    for (int32_t t : state.seen()) {
      if (t < 0 || t >= vocab) continue;
      logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
    }
  }
  if (params.frequency_penalty != 0.0 || params.presence_penalty != 0.0) {
    for (const auto& [t, count] : state.output_counts()) {
      if (t < 0 || t >= vocab) continue;
      logits[t] -= static_cast<float>(params.frequency_penalty * count + params.presence_penalty);
    }
  }
}

void apply_temperature(std::span<float> logits, double temperature) {
  if (temperature == 1.0) return;
  const auto inv = static_cast<float>(1.0 / temperature);
  for (float& x : logits) x *= inv;  // -inf stays -inf
}

void apply_min_p(std::span<float> logits, double min_p) {
  if (min_p <= 0.0) return;
  // p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p)
  const double threshold = max_finite(logits) + std::log(min_p);
  for (float& x : logits) {
    if (x < threshold) x = kNegInf;
  }
}

void apply_top_k(std::span<float> logits, int64_t top_k) {
  if (top_k <= 0 || top_k >= static_cast<int64_t>(logits.size())) return;
  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
  const float kth = sorted[top_k - 1];
  // Ties with the k-th value are kept, as vLLM's mask (logits < kth) does.
  for (float& x : logits) {
    if (x < kth) x = kNegInf;
  }
}

void apply_top_p(std::span<float> logits, double top_p) {
  if (top_p >= 1.0) return;
  std::vector<int32_t> idx;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kNegInf) idx.push_back(static_cast<int32_t>(i));
  }
  if (idx.empty()) return;
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const float m = max_finite(logits);
  auto mass = [&](int32_t i) { return kernels::token_mass(kernels::sub_rn(logits[i], m)); };
  uint64_t total = 0;
  for (int32_t i : idx) total += mass(i);
  // Keep a token while the mass ranked above it is below top_p: the smallest prefix whose mass
  // reaches top_p (the top token always stays). Sorting all of a 150k vocabulary costs tens of
  // ms, so sort only the best `head` tokens, growing it until the prefix ends inside it.
  size_t keep = 0;
  for (size_t head = std::min<size_t>(1024, idx.size());; head = std::min(head * 8, idx.size())) {
    std::partial_sort(idx.begin(), idx.begin() + head, idx.end(), before);
    uint64_t above = 0;
    keep = 0;
    while (keep < head && kernels::top_p_keeps(above, total, top_p)) {
      above += mass(idx[keep]);
      ++keep;
    }
    if (keep < head || !kernels::top_p_keeps(above, total, top_p) || head == idx.size()) break;
  }
  for (size_t j = keep; j < idx.size(); ++j) logits[idx[j]] = kNegInf;
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  return kernels::sampling_uniform(seed, step);
}

uint64_t sampling_token_mass(float d) { return kernels::token_mass(d); }

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          SamplerState& state) {
  check_logits(logits);
  std::vector<float> work(logits.begin(), logits.end());
  apply_penalties(work, params, state);
  SampleResult result;
  if (params.greedy()) {
    check_transformed(work);
    result.token = argmax(work);
  } else {
    apply_temperature(work, params.temperature);
    check_transformed(work);
    apply_min_p(work, params.min_p);
    apply_top_k(work, params.top_k);
    apply_top_p(work, params.top_p);
    result.token = draw(work, sampling_uniform(state.seed(), state.step()));
  }
  if (params.logprobs) result.logprobs = compute_logprobs(logits, result.token, *params.logprobs);
  state.advance();
  return result;
}

}  // namespace longctx
