// Speculative decoding's parts against references: the n-gram drafter against a brute-force
// scan, and the verification op (kernels/cpu/speculative_cpu.h) for greedy exactness and for the
// distribution of the token it yields (it must be the target's, whatever the draft).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/ngram_drafter.h"
#include "kernels/cpu/sampling_cpu.h"
#include "kernels/cpu/speculative_cpu.h"
#include "longctx/core/error.h"
#include "longctx/engine/speculative_config.h"

namespace longctx {
namespace {

// The definition: for n from max_n down to min_n, the most recent e < len with
// tokens[e - n, e) == the last n tokens; the draft is tokens[e, min(e + k, len)).
std::vector<int32_t> brute_force_draft(const std::vector<int32_t>& tokens, int64_t min_n,
                                       int64_t max_n, int64_t k) {
  const auto len = static_cast<int64_t>(tokens.size());
  for (int64_t n = std::min(max_n, len - 1); n >= min_n; --n) {
    for (int64_t e = len - 1; e >= n; --e) {
      if (std::equal(tokens.begin() + (e - n), tokens.begin() + e, tokens.end() - n))
        return {tokens.begin() + e, tokens.begin() + std::min(len, e + k)};
    }
  }
  return {};
}

TEST(NgramDrafter, MatchesBruteForceOnRandomStringsWithRepeats) {
  std::mt19937 rng(7);
  int64_t proposals = 0, non_empty = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t min_n = 1 + static_cast<int64_t>(rng() % 3);
    const int64_t max_n = min_n + static_cast<int64_t>(rng() % 4);
    const int32_t alphabet = 2 + static_cast<int32_t>(rng() % 6);  // small: many repeats
    NgramDrafter drafter(min_n, max_n);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 300; ++i) {
      // Grow by a random token, or by copying a stretch from earlier (as generation does).
      if (!tokens.empty() && rng() % 3 == 0) {
        const size_t from = rng() % tokens.size();
        const size_t n = 1 + rng() % 6;
        for (size_t j = 0; j < n && from + j < tokens.size(); ++j)
          tokens.push_back(tokens[from + j]);
      } else {
        tokens.push_back(static_cast<int32_t>(rng() % alphabet));
      }
      if (rng() % 4 != 0) continue;  // the drafter must catch up over several appends
      const int64_t k = 1 + static_cast<int64_t>(rng() % 8);
      const std::vector<int32_t> got = drafter.propose(tokens, k);
      ASSERT_EQ(got, brute_force_draft(tokens, min_n, max_n, k))
          << "trial " << trial << " len " << tokens.size() << " n " << min_n << ".." << max_n;
      ++proposals;
      non_empty += got.empty() ? 0 : 1;
    }
  }
  EXPECT_GT(non_empty, proposals / 2);  // the strings do repeat: most proposals find something
}

TEST(NgramDrafter, PrefersTheLongestThenTheMostRecentMatch) {
  NgramDrafter d(1, 3);
  // "1 2 3 9" then "5 2 3 7" then "1 2 3": the 3-gram 1 2 3 matched at the start wins over the
  // more recent 2-gram 2 3 (followed by 7).
  const std::vector<int32_t> t = {1, 2, 3, 9, 8, 5, 2, 3, 7, 6, 1, 2, 3};
  EXPECT_EQ(d.propose(t, 3), (std::vector<int32_t>{9, 8, 5}));
  NgramDrafter d2(1, 2);  // now 2-grams at most: "2 3" most recently followed by 7
  EXPECT_EQ(d2.propose(t, 2), (std::vector<int32_t>{7, 6}));
  // Nothing matches: no draft; k caps the draft, and it stops at the end of the tokens.
  EXPECT_TRUE(NgramDrafter(1, 2).propose(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());
  EXPECT_EQ(NgramDrafter(1, 1).propose(std::vector<int32_t>{4, 5, 4}, 4),
            (std::vector<int32_t>{5, 4}));
  // A sequence that is not an extension of the previous one starts the index over.
  NgramDrafter d3(1, 1);
  EXPECT_EQ(d3.propose(std::vector<int32_t>{1, 2, 1}, 1), (std::vector<int32_t>{2}));
  EXPECT_EQ(d3.propose(std::vector<int32_t>{3, 1}, 1), (std::vector<int32_t>{}));
}

TEST(SpeculativeConfig, ResolvesDefaultsAndRefusesBadCombinations) {
  EXPECT_EQ(parse_speculative_method("ngram"), SpeculativeMethod::kNgram);
  EXPECT_EQ(parse_speculative_method("none"), SpeculativeMethod::kNone);
  EXPECT_THROW(parse_speculative_method("eagle"), Error);
  SpeculativeConfig c{SpeculativeMethod::kNgram, 4, 0, 0};
  EXPECT_EQ(c.resolved().prompt_lookup_min, 5);
  EXPECT_EQ(c.resolved().prompt_lookup_max, 5);
  c.prompt_lookup_max = 3;
  EXPECT_EQ(c.resolved().prompt_lookup_min, 3);
  c.prompt_lookup_min = 2;
  EXPECT_EQ(c.resolved().prompt_lookup_min, 2);
  c.prompt_lookup_min = 4;  // min > max
  EXPECT_THROW(c.resolved(), Error);
  EXPECT_THROW((SpeculativeConfig{SpeculativeMethod::kNgram, 0, 1, 2}.resolved()), Error);
  EXPECT_THROW((SpeculativeConfig{SpeculativeMethod::kNgram, 2, -1, 2}.resolved()), Error);
  EXPECT_THROW((SpeculativeConfig{SpeculativeMethod::kNone, 2, 0, 0}.resolved()), Error);
  EXPECT_NO_THROW(SpeculativeConfig{}.resolved());
}

// ---- Verification ----------------------------------------------------------------------------

kernels::SamplingRowParams row_params(double temperature, int32_t top_k, uint64_t seed,
                                      uint64_t step) {
  kernels::SamplingRowParams p;
  p.seed = seed;
  p.step = step;
  p.greedy = temperature == 0 ? 1 : 0;
  p.inv_temperature = temperature == 0 ? 1.0f : static_cast<float>(1.0 / temperature);
  p.top_k = top_k;
  return p;
}

kernels::cpu::SpeculativeRowResult verify(const std::vector<float>& logits,
                                          const kernels::SamplingRowParams& p, int32_t draft) {
  return kernels::cpu::verify_draft_row(logits, p, {}, nullptr, draft);
}

TEST(SpeculativeVerify, GreedyAcceptsExactlyTheArgmax) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(50);
    for (float& x : logits) x = normal(rng);
    const auto best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const auto draft = static_cast<int32_t>(rng() % 50);
    const auto r = verify(logits, row_params(0, 0, trial, 0), draft);
    EXPECT_EQ(r.sample.status, kernels::kSamplingOk);
    EXPECT_EQ(r.sample.token, best);  // the greedy token whatever the draft
    EXPECT_EQ(r.accepted, draft == best);
    EXPECT_TRUE(verify(logits, row_params(0, 0, trial, 0), best).accepted);
    // No draft (the bonus position): the greedy token.
    const auto bonus = verify(logits, row_params(0, 0, trial, 0), -1);
    EXPECT_FALSE(bonus.accepted);
    EXPECT_EQ(bonus.sample.token, best);
  }
}

TEST(SpeculativeVerify, BonusPositionDrawsAsTheSampler) {
  std::vector<float> logits = {0.1f, 1.5f, -0.3f, 0.9f, 2.0f, -1.0f};
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const auto p = row_params(0.8, 0, seed, 3);
    kernels::SamplingRowResult plain;
    kernels::SamplingBatch b;
    b.logits = logits.data();
    b.logits_stride = b.vocab = static_cast<int32_t>(logits.size());
    b.num_rows = 1;
    b.rows = &p;
    b.results = &plain;
    kernels::cpu::sample_rows(b);
    EXPECT_EQ(verify(logits, p, -1).sample.token, plain.token) << seed;
  }
}

// The target distribution, computed here from its definition: softmax(logits / T) over the top k.
std::vector<double> target_distribution(const std::vector<float>& logits, double t, int top_k) {
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const float kth = sorted[top_k - 1];
  std::vector<double> p(logits.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= kth) z += p[i] = std::exp(logits[i] / t);
  }
  for (double& x : p) x /= z;
  return p;
}

// The token a verified position yields is distributed as the target p for every draft: the
// draft's own token (accepted with p(x)), a likely one, an unlikely one and one top_k removed
// (p(x) = 0: always rejected). Pearson's chi-square over N = 40000 seeded trials per draft against
// the critical value of p = 0.001 (df = 6: 22.46); the seeds are fixed, so the test is
// deterministic, and a verifier that took the draft's token too often (or drew from p instead of
// the residual after a rejection) is off by chi-square values in the thousands.
TEST(SpeculativeVerify, FirstTokenDistributionEqualsTheTarget) {
  const std::vector<float> logits = {1.2f, 0.3f, 2.1f, -0.5f, 0.9f, 1.7f, -1.4f, 0.0f};
  const double temperature = 0.9;
  const int top_k = 7;  // token 6 is dropped
  const std::vector<double> p = target_distribution(logits, temperature, top_k);
  constexpr int kTrials = 40000;
  constexpr double kChiSquareCritical = 22.46;  // df = 6 (7 tokens with mass), p = 0.001
  for (const int32_t draft : {2, 5, 3, 6}) {
    std::vector<int64_t> counts(logits.size(), 0);
    int64_t accepted = 0;
    for (int i = 0; i < kTrials; ++i) {
      const auto r = verify(logits, row_params(temperature, top_k, 1000 + i, 5), draft);
      ASSERT_EQ(r.sample.status, kernels::kSamplingOk);
      ++counts[r.sample.token];
      accepted += r.accepted ? 1 : 0;
      ASSERT_EQ(r.accepted, r.sample.token == draft);
    }
    double chi2 = 0;
    for (size_t t = 0; t < p.size(); ++t) {
      if (p[t] == 0) {
        EXPECT_EQ(counts[t], 0) << "draft " << draft << ": token " << t << " has no mass";
        continue;
      }
      const double expected = p[t] * kTrials;
      chi2 += (counts[t] - expected) * (counts[t] - expected) / expected;
    }
    EXPECT_LT(chi2, kChiSquareCritical) << "draft " << draft;
    // Acceptance itself happens with probability p(draft): within 5 standard deviations.
    const double pa = p[draft];
    EXPECT_NEAR(static_cast<double>(accepted) / kTrials, pa,
                5 * std::sqrt(pa * (1 - pa) / kTrials) + 1e-9)
        << "draft " << draft;
  }
}

TEST(SpeculativeVerify, ReportsRowsThatCannotBeSampled) {
  std::vector<float> logits = {0.0f, std::nanf(""), 1.0f};
  const auto r = verify(logits, row_params(1.0, 0, 1, 0), 0);
  EXPECT_EQ(r.sample.status, kernels::kSamplingNaN);
  EXPECT_FALSE(r.accepted);
  // A draft outside the vocabulary is rejected, not read.
  const std::vector<float> ok = {0.0f, 3.0f, 1.0f};
  const auto out = verify(ok, row_params(0, 0, 1, 0), 7);
  EXPECT_FALSE(out.accepted);
  EXPECT_EQ(out.sample.token, 1);
}

}  // namespace
}  // namespace longctx
