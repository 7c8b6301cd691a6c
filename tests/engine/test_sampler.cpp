// Sampler tests: the empirical distribution of sampled tokens against the distribution each
// setting should give (computed here independently), seeds, penalties, logprobs, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampling_pack.h"
#include "kernels/cpu/sampling_cpu.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"
#include "longctx/core/error.h"
#include "longctx/engine/sampler.h"

namespace longctx {
namespace {

using kernels::cpu::apply_top_p;

uint64_t sampling_token_mass(float d) { return kernels::token_mass(d); }
double sampling_uniform(uint64_t seed, uint64_t step) {
  return kernels::sampling_uniform(seed, step);
}

// The penalties as the sampler applies them: the engine's packing of the request's state into
// penalty entries, then the sampling op's CPU reference step.
void apply_penalties(std::vector<float>& logits, const SamplingParams& params,
                     const SamplerState& state) {
  const auto vocab = static_cast<int64_t>(logits.size());
  std::vector<kernels::SamplingPenaltyEntry> entries;
  append_penalty_entries(params, state, vocab, entries);
  const std::vector<float> raw = logits;
  kernels::cpu::apply_penalty_entries(logits, raw, entries,
                                      sampling_row_params(params, state, vocab));
}

// Unsorted on purpose so index bookkeeping matters; no ties.
const std::vector<float> kLogits = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -3.0f, 1.0f, -0.5f};

// The target distribution, written the plain way: probabilities, then each filter on the set of
// kept tokens, in vLLM's order (temperature, min_p, top_k, top_p), renormalizing at the end.
std::vector<double> expected_distribution(const std::vector<float>& logits, double t, int k,
                                          double top_p, double min_p) {
  const size_t n = logits.size();
  std::vector<double> p(n);
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += p[i] = std::exp(logits[i] / t);
  for (double& x : p) x /= z;
  std::vector<bool> keep(n, true);
  const double pmax = *std::max_element(p.begin(), p.end());
  for (size_t i = 0; i < n; ++i) keep[i] = p[i] >= min_p * pmax;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  if (k > 0) {
    int seen = 0;
    for (size_t i : order) {
      if (keep[i] && ++seen > k) keep[i] = false;
    }
  }
  double kept_mass = 0;
  for (size_t i = 0; i < n; ++i) kept_mass += keep[i] ? p[i] : 0;
  double cum = 0;
  for (size_t i : order) {
    if (!keep[i]) continue;
    if (cum >= top_p) {
      keep[i] = false;
    } else {
      cum += p[i] / kept_mass;
    }
  }
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += keep[i] ? p[i] : 0;
  std::vector<double> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = keep[i] ? p[i] / s : 0;
  return q;
}

// Upper 0.1% points of the chi-square distribution for 1..9 degrees of freedom (standard
// tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4).
double chi2_critical_p001(int df) {
  static const double kTable[] = {10.828, 13.816, 16.266, 18.467, 20.515,
                                  22.458, 24.322, 26.124, 27.877};
  EXPECT_GE(df, 1);
  EXPECT_LE(df, 9);
  return kTable[df - 1];
}

std::vector<int64_t> sample_counts(const SamplingParams& params, int n, uint64_t seed) {
  SamplerState state(params, seed, {});
  std::vector<int64_t> counts(kLogits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[sample_token(kLogits, params, state).token];
  return counts;
}

// Pearson's statistic over tokens with expected mass; tokens without must never appear.
// Returns {statistic, degrees of freedom}.
std::pair<double, int> chi_square(const std::vector<int64_t>& counts,
                                  const std::vector<double>& expected, int n) {
  double stat = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " was filtered out but sampled";
      continue;
    }
    const double e = expected[i] * n;
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  return {stat, cells - 1};
}

struct DistCase {
  const char* name;
  double temperature;
  int top_k;
  double top_p;
  double min_p;
  int expected_support;  // tokens left after filtering (guards the expectation itself)
};

TEST(Sampler, FollowsTheIntendedDistribution) {
  const DistCase cases[] = {
      {"t=1", 1.0, 0, 1.0, 0.0, 8},
      {"t=0.5", 0.5, 0, 1.0, 0.0, 8},
      {"t=2", 2.0, 0, 1.0, 0.0, 8},
      {"top_k=3", 1.0, 3, 1.0, 0.0, 3},
      {"top_p=0.75", 1.0, 0, 0.75, 0.0, 3},
      {"min_p=0.2", 1.0, 0, 1.0, 0.2, 4},
      {"t=0.7,top_k=5,top_p=0.9,min_p=0.05", 0.7, 5, 0.9, 0.05, 3},
      {"t=1.3,top_k=6,top_p=0.7", 1.3, 6, 0.7, 0.0, 3},
  };
  constexpr int kDraws = 20000;
  for (const DistCase& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    const auto expected = expected_distribution(kLogits, c.temperature, c.top_k, c.top_p, c.min_p);
    EXPECT_EQ(std::count_if(expected.begin(), expected.end(), [](double x) { return x > 0; }),
              c.expected_support);
    const auto counts = sample_counts(params, kDraws, 1234);
    const auto [stat, df] = chi_square(counts, expected, kDraws);
    EXPECT_LT(stat, chi2_critical_p001(df)) << "df " << df;
  }
}

TEST(Sampler, ChiSquareRejectsAWrongDistribution) {
  // The test above has power: samples at t=0.7 do not pass as t=1.
  SamplingParams params;
  params.temperature = 0.7;
  constexpr int kDraws = 20000;
  const auto counts = sample_counts(params, kDraws, 99);
  const auto [stat, df] =
      chi_square(counts, expected_distribution(kLogits, 1.0, 0, 1.0, 0.0), kDraws);
  EXPECT_GT(stat, chi2_critical_p001(df));
}

TEST(Sampler, TopPOnALargeFlatVocabularyKeepsExactlyTheNucleus) {
  // Thousands of tokens in the nucleus: the kept set must still be exactly the smallest prefix
  // (by probability) whose mass reaches top_p, compared with a full sort here. Masses are the
  // sampler's integer ones (sampling_token_mass), the exact definition top_p works with.
  std::vector<float> logits(5000);
  std::mt19937_64 rng(3);
  for (float& x : logits) x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-54);
  const float m = *std::max_element(logits.begin(), logits.end());
  for (double top_p : {0.3, 0.6, 0.95}) {
    std::vector<float> got = logits;
    apply_top_p(got, top_p);
    std::vector<size_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    uint64_t total = 0;
    for (float x : logits) total += sampling_token_mass(x - m);
    uint64_t above = 0;
    size_t kept = 0;
    for (size_t i : order) {
      const bool keep = static_cast<double>(above) < top_p * static_cast<double>(total);
      above += sampling_token_mass(logits[i] - m);
      kept += keep ? 1 : 0;
      ASSERT_EQ(got[i] != -std::numeric_limits<float>::infinity(), keep) << "token " << i;
    }
    EXPECT_GT(kept, 1024u) << top_p;  // beyond the first sorted head
  }
}

TEST(Sampler, TokenMassFollowsExp) {
  // The integer mass is exp(d) * 2^43 within float rounding, and 0 past the window.
  for (float d = 0.0f; d >= -32.0f; d -= 0.0371f) {
    const double want = std::exp(static_cast<double>(d)) * 0x1.0p43;
    EXPECT_NEAR(static_cast<double>(sampling_token_mass(d)), want, want * 1e-6 + 0.5) << d;
  }
  EXPECT_EQ(sampling_token_mass(0.0f), uint64_t(1) << 43);
  EXPECT_EQ(sampling_token_mass(-32.01f), 0u);
  EXPECT_EQ(sampling_token_mass(-std::numeric_limits<float>::infinity()), 0u);
}

TEST(Sampler, TheUniformIsAFunctionOfSeedAndStep) {
  // Counter-based: the k-th draw's uniform depends on (seed, k) only, and sample_token uses it.
  EXPECT_EQ(sampling_uniform(5, 17), sampling_uniform(5, 17));
  EXPECT_NE(sampling_uniform(5, 17), sampling_uniform(5, 18));
  EXPECT_NE(sampling_uniform(5, 17), sampling_uniform(6, 17));
  double sum = 0;
  for (uint64_t k = 0; k < 10000; ++k) {
    const double u = sampling_uniform(42, k);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);  // 3.5 sigma of the mean of 10k uniforms
  // Two tokens of mass 1 : 1: token 0 exactly when u < 1/2.
  const std::vector<float> two = {0.0f, 0.0f};
  SamplingParams params;
  SamplerState state(params, 77, {});
  for (uint64_t k = 0; k < 64; ++k) {
    ASSERT_EQ(state.step(), k);
    const int32_t want = sampling_uniform(77, k) < 0.5 ? 0 : 1;
    EXPECT_EQ(sample_token(two, params, state).token, want) << k;
  }
  EXPECT_EQ(state.step(), 64u);
}

TEST(Sampler, GreedyTakesTheArgmaxAndIgnoresFilters) {
  SamplingParams params;
  params.temperature = 0.0;
  params.top_k = 2;
  params.top_p = 0.1;
  SamplerState state(params, 7, {});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sample_token(kLogits, params, state).token, 2);
  // Ties go to the lowest index, like torch.argmax.
  std::vector<float> tied = {0.0f, 3.0f, 3.0f, 1.0f};
  EXPECT_EQ(sample_token(tied, params, state).token, 1);
}

TEST(Sampler, SeedReproducesAndDifferentSeedsDiffer) {
  SamplingParams params;
  params.temperature = 1.0;
  auto run = [&](uint64_t seed) {
    SamplerState state(params, seed, {});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample_token(kLogits, params, state).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams params;
  params.repetition_penalty = 2.0;
  const std::vector<int32_t> prompt = {0, 1};
  SamplerState state(params, 0, prompt);
  state.append_output(3);
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -4.0f};
  apply_penalties(logits, params, state);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);   // prompt token, positive: divided
  EXPECT_FLOAT_EQ(logits[1], -2.0f);  // prompt token, negative: multiplied
  EXPECT_FLOAT_EQ(logits[2], 0.5f);   // unseen
  EXPECT_FLOAT_EQ(logits[3], 1.5f);   // generated token
  EXPECT_FLOAT_EQ(logits[4], -4.0f);  // unseen
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  SamplingParams params;
  params.presence_penalty = 0.25;
  params.frequency_penalty = 0.5;
  const std::vector<int32_t> prompt = {0};
  SamplerState state(params, 0, prompt);
  state.append_output(2);
  state.append_output(2);
  state.append_output(3);
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  apply_penalties(logits, params, state);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);                 // in the prompt only: untouched
  EXPECT_FLOAT_EQ(logits[1], 1.0f);                 // never seen
  EXPECT_FLOAT_EQ(logits[2], 1.0f - 0.25f - 1.0f);  // twice
  EXPECT_FLOAT_EQ(logits[3], 1.0f - 0.25f - 0.5f);  // once
}

TEST(Sampler, PenaltiesApplyBeforeGreedy) {
  SamplingParams params;
  params.temperature = 0;
  params.frequency_penalty = 2.0;
  SamplerState state(params, 0, {});
  std::vector<float> logits = {0.0f, 1.0f, 0.5f};
  EXPECT_EQ(sample_token(logits, params, state).token, 1);
  state.append_output(1);
  EXPECT_EQ(sample_token(logits, params, state).token, 2);  // 1 - 2 < 0.5
}

TEST(Sampler, LogprobsAreThoseOfTheRawDistribution) {
  SamplingParams params;
  params.temperature = 0.5;  // logprobs ignore temperature (vLLM's raw logprobs)
  params.logprobs = 3;
  SamplerState state(params, 5, {});
  const SampleResult r = sample_token(kLogits, params, state);
  double z = 0;
  for (float x : kLogits) z += std::exp(x);
  EXPECT_NEAR(r.logprobs.logprob, kLogits[r.token] - std::log(z), 1e-6);
  EXPECT_EQ(r.logprobs.token, r.token);
  int64_t rank = 1;
  for (float x : kLogits) rank += x > kLogits[r.token] ? 1 : 0;
  EXPECT_EQ(r.logprobs.rank, rank);
  ASSERT_EQ(r.logprobs.top.size(), 3u);
  EXPECT_EQ(r.logprobs.top[0].first, 2);
  EXPECT_EQ(r.logprobs.top[1].first, 4);
  EXPECT_EQ(r.logprobs.top[2].first, 6);
  EXPECT_NEAR(r.logprobs.top[0].second, 2.0 - std::log(z), 1e-6);
}

TEST(Sampler, RejectsNaNLogits) {
  SamplingParams params;
  SamplerState state(params, 0, {});
  std::vector<float> logits = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(sample_token(logits, params, state), Error);
  EXPECT_EQ(state.step(), 0u);  // a failed draw does not advance the request
}

TEST(Sampler, RejectsLogitsThatOverflowUnderTemperature) {
  SamplingParams params;
  params.temperature = 1e-4;
  SamplerState state(params, 0, {});
  std::vector<float> logits = {0.0f, 1e35f};
  try {
    sample_token(logits, params, state);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("token 1 overflows"), std::string::npos) << e.what();
  }
}

void expect_invalid(const SamplingParams& p, const std::string& field) {
  try {
    p.validate();
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(SamplingParams, Validation) {
  SamplingParams ok;
  EXPECT_NO_THROW(ok.validate());
  ok.top_k = -1;  // -1 and 0 both mean "all tokens"
  EXPECT_NO_THROW(ok.validate());
  auto with = [](auto f) {
    SamplingParams p;
    f(p);
    return p;
  };
  expect_invalid(with([](auto& p) { p.temperature = -0.1; }), "temperature");
  expect_invalid(with([](auto& p) { p.temperature = NAN; }), "temperature");
  expect_invalid(with([](auto& p) { p.top_k = -2; }), "top_k");
  expect_invalid(with([](auto& p) { p.top_p = 0.0; }), "top_p");
  expect_invalid(with([](auto& p) { p.top_p = 1.5; }), "top_p");
  expect_invalid(with([](auto& p) { p.min_p = -0.1; }), "min_p");
  expect_invalid(with([](auto& p) { p.min_p = 1.1; }), "min_p");
  expect_invalid(with([](auto& p) { p.repetition_penalty = 0.0; }), "repetition_penalty");
  expect_invalid(with([](auto& p) { p.presence_penalty = 2.5; }), "presence_penalty");
  expect_invalid(with([](auto& p) { p.frequency_penalty = -3; }), "frequency_penalty");
  expect_invalid(with([](auto& p) { p.max_tokens = 0; }), "max_tokens");
  expect_invalid(with([](auto& p) { p.max_tokens = -5; }), "max_tokens");
  expect_invalid(with([](auto& p) { p.stop = {"ok", ""}; }), "stop string");
  expect_invalid(with([](auto& p) { p.stop_token_ids = {-1}; }), "stop_token_ids");
  expect_invalid(with([](auto& p) { p.logprobs = 21; }), "logprobs");
  expect_invalid(with([](auto& p) { p.logprobs = -1; }), "logprobs");
}

TEST(Sampler, TokenMaskKeepsOnlyAllowedTokensAfterPenalties) {
  const int64_t vocab = 70;  // three mask words, the last partly used
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = static_cast<float>(i % 17) * 0.3f;
  const std::vector<int32_t> allowed = {3, 33, 40, 69};
  auto masked_state = [&](const SamplingParams& p, uint64_t seed) {
    SamplerState s(p, seed, {});
    s.token_mask().assign(kernels::sampling_mask_words(vocab), 0u);
    for (int32_t t : allowed) s.token_mask()[t >> 5] |= 1u << (t & 31);
    return s;
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplerState g = masked_state(greedy, 1);
  // Unmasked the argmax is 16 (4.8); among the allowed, 33 (33 % 17 = 16) ties 16 and wins.
  EXPECT_EQ(sample_token(logits, greedy, g).token, 33);
  // Penalties on 33 (4.8 - 2 - 2 = 0.8) move greedy to the best other allowed token: 40
  // (40 % 17 = 6: 1.8) over 3 (0.9) and 69 (0.3); 16 and 50 (4.8) stay masked.
  greedy.presence_penalty = 2.0;
  greedy.frequency_penalty = 2.0;
  SamplerState g2 = masked_state(greedy, 1);
  g2.append_output(33);
  EXPECT_EQ(sample_token(logits, greedy, g2).token, 40);
  SamplingParams random;
  random.temperature = 2.0;
  SamplerState r = masked_state(random, 7);
  std::vector<int> seen(vocab, 0);
  for (int i = 0; i < 400; ++i) ++seen[sample_token(logits, random, r).token];
  for (int64_t t = 0; t < vocab; ++t) {
    const bool ok = std::find(allowed.begin(), allowed.end(), t) != allowed.end();
    if (!ok) EXPECT_EQ(seen[t], 0) << t;
    if (ok) EXPECT_GT(seen[t], 0) << t;
  }
  SamplerState wrong(random, 7, {});
  wrong.token_mask().assign(2, ~0u);
  EXPECT_THROW(sample_token(logits, random, wrong), Error);
}

TEST(Sampler, GreedyMaskedRowsMatchTheMaskedCopy) {
  // A greedy row without penalties reads its mask with the raw logits (no masked copy); the
  // token and the errors are the masked copy's (sampling_logits, then argmax_token): ties go to
  // the lowest allowed id, NaN / +inf anywhere in the raw row are errors, masked out or not, and
  // a row whose allowed logits are all -inf is refused. With penalties the copy stays: the same
  // masks with a presence penalty give the copy's token too.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (const int64_t vocab : {1, 31, 32, 33, 70, 1000}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> logits(vocab);
      for (float& x : logits) {
        const int kind = static_cast<int>(rng() % 10);
        x = kind == 0 ? kNegInf : kind < 4 ? std::round(normal(rng)) : normal(rng);
      }
      const int bad = static_cast<int>(rng() % 8);  // 0: NaN, 1: +inf, somewhere
      if (bad < 2) {
        logits[rng() % vocab] = bad == 0 ? std::nanf("") : std::numeric_limits<float>::infinity();
      }
      std::vector<uint32_t> mask(kernels::sampling_mask_words(vocab), 0u);
      const int density = static_cast<int>(rng() % 3);  // none, some, all allowed
      for (int64_t t = 0; t < vocab; ++t) {
        if (density == 2 || (density == 1 && rng() % 3 == 0)) mask[t >> 5] |= 1u << (t & 31);
      }
      for (const bool penalized : {false, true}) {
        SamplingParams p;
        p.temperature = 0;
        if (penalized) p.presence_penalty = 1.5;
        SamplerState s(p, 9, {});
        if (penalized) s.append_output(static_cast<int32_t>(rng() % vocab));
        s.token_mask() = mask;
        // The reference: the masked copy.
        const kernels::SamplingRowParams rp = sampling_row_params(p, s, vocab);
        std::vector<kernels::SamplingPenaltyEntry> entries;
        append_penalty_entries(p, s, vocab, entries);
        std::vector<float> work;
        kernels::SamplingRowResult want;
        const bool ok = kernels::cpu::sampling_logits(logits, rp, entries, mask.data(), work, want);
        try {
          const SampleResult got = sample_token(logits, p, s);
          ASSERT_TRUE(ok) << "vocab " << vocab << " trial " << trial << ": status " << want.status
                          << " but token " << got.token;
          EXPECT_EQ(got.token, kernels::cpu::argmax_token(work))
              << "vocab " << vocab << " trial " << trial << " penalized " << penalized;
        } catch (const Error& e) {
          EXPECT_FALSE(ok) << "vocab " << vocab << " trial " << trial << ": " << e.what();
          const std::string what = e.what();
          const char* expected = want.status == kernels::kSamplingNaN      ? "NaN logit"
                                 : want.status == kernels::kSamplingPosInf ? "+inf logit"
                                                                           : "-inf";
          EXPECT_NE(what.find(expected), std::string::npos) << what;
        }
      }
    }
  }
}

TEST(Sampler, PackTokenMasksCopiesEachMaskInOrder) {
  // Inline (small masks) or over the thread pool (masks past the bytes a pool task takes),
  // each mask lands at its row of the buffer.
  for (const auto [n, words] : {std::pair<int64_t, int64_t>{0, 593},
                                {1, 593},
                                {67, 593},
                                {2, 40001},
                                {5, 40001},
                                {67, 40001},
                                {9, 4749}}) {
    std::vector<std::vector<uint32_t>> masks(static_cast<size_t>(n));
    std::vector<const uint32_t*> ptrs;
    for (int64_t m = 0; m < n; ++m) {
      masks[m].resize(static_cast<size_t>(words));
      for (int64_t w = 0; w < words; ++w) masks[m][w] = static_cast<uint32_t>(m * 7919 + w);
      ptrs.push_back(masks[m].data());
    }
    std::vector<uint32_t> out(static_cast<size_t>(n * words + 1), 0xdeadbeefu);
    pack_token_masks(ptrs, words, out.data());
    for (int64_t m = 0; m < n; ++m) {
      ASSERT_TRUE(std::equal(masks[m].begin(), masks[m].end(), out.begin() + m * words))
          << n << " masks, mask " << m;
    }
    EXPECT_EQ(out.back(), 0xdeadbeefu);  // nothing past the last mask
  }
}

}  // namespace
}  // namespace longctx
