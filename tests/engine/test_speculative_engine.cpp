// Speculative decoding through the engine on the CPU: greedy outputs equal the non-speculative
// engine's token for token (drafts accepted or not, batched with sequences that have no draft,
// with prefix caching, under preemption, through the simulated KV offload: the bodies of
// common/engine_properties.h, which tests/gpu_models runs on the GPU), stops inside an accepted
// draft drop what follows, the KV blocks all come back, and the acceptance counters count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine_test_util.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"

namespace longctx {
namespace {

using testing::greedy;
using testing::tiny_model;

struct SpecRun {
  std::vector<RequestOutput> outs;  // by request index
  EngineStats stats;
};

EngineCoreOptions spec_options(int64_t batched_tokens, int64_t max_seqs, bool caching, int64_t k) {
  EngineCoreOptions o = testing::core_options(batched_tokens, max_seqs, caching);
  o.max_model_len = 2048;
  if (k > 0) o.speculative = {SpeculativeMethod::kNgram, k, 1, 3};
  return o;
}

SpecRun run(std::unique_ptr<Executor> exec, const EngineCoreOptions& o,
            const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& sp) {
  EngineCore core(std::move(exec), nullptr, o);
  for (size_t i = 0; i < prompts.size(); ++i) core.add_request(i, prompts[i], sp, 0);
  SpecRun r;
  r.outs.resize(prompts.size());
  while (core.has_unfinished()) {
    core.step();
    core.check_consistency();
    for (RequestOutput& o : core.take_finished()) r.outs[o.index] = std::move(o);
  }
  r.stats = core.stats();
  EXPECT_EQ(r.stats.kv_blocks_used, 0);  // every block came back
  return r;
}

SpecRun run_model(const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens, int64_t k,
                  int64_t num_blocks = 512, bool caching = false, int64_t batched_tokens = 256,
                  int64_t max_seqs = 8) {
  CpuExecutorOptions x;
  x.block_size = 4;
  x.num_blocks = num_blocks;
  SamplingParams sp = greedy(max_tokens);
  sp.logprobs = 2;
  return run(make_cpu_executor(tiny_model(), x), spec_options(batched_tokens, max_seqs, caching, k),
             prompts, sp);
}

// Token for token, up to a step whose top-2 logprobs are within 1e-4 (a verifying step computes
// several positions in one forward, so near-ties may order differently; none occur here).
void expect_same(const RequestOutput& ref, const RequestOutput& got, const char* what) {
  ASSERT_EQ(ref.token_ids.size(), got.token_ids.size()) << what;
  ASSERT_EQ(got.logprobs.size(), got.token_ids.size()) << what;
  for (size_t i = 0; i < ref.token_ids.size(); ++i) {
    EXPECT_EQ(got.logprobs[i].token, got.token_ids[i]) << what;
    if (ref.token_ids[i] == got.token_ids[i]) {
      EXPECT_NEAR(ref.logprobs[i].logprob, got.logprobs[i].logprob, 1e-4) << what << " " << i;
      continue;
    }
    const auto& top = ref.logprobs.at(i).top;
    ASSERT_GE(top.size(), 2u);
    EXPECT_LT(top[0].second - top[1].second, 1e-4) << what << ": token " << i << " differs";
    return;
  }
  EXPECT_EQ(ref.finish_reason, got.finish_reason) << what;
}

// A random stretch repeated: the model's continuation tends to copy it, so drafts get accepted.
std::vector<int32_t> copy_heavy_prompt(uint32_t seed, int64_t stretch, int repeats) {
  std::mt19937 rng(seed);
  std::vector<int32_t> s(static_cast<size_t>(stretch));
  for (auto& t : s) t = static_cast<int32_t>(3 + rng() % 200);
  std::vector<int32_t> p;
  for (int r = 0; r < repeats; ++r) p.insert(p.end(), s.begin(), s.end());
  return p;
}

std::vector<int32_t> random_prompt(uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 250);
  return p;
}

// The fp32 CPU engine: a verifying step computes several positions in one forward, so only
// near-ties may order differently (none occur here).
constexpr testing::GreedyTolerance kExact{1e-4, 1e-4};

TEST(SpeculativeEngine, GreedyNeedleAnswerEqualsNonSpeculativeAndTransformers) {
  testing::check_speculative_needle_equals_plain(testing::cpu_executor, kExact);
}

TEST(SpeculativeEngine, GreedyNeedleThroughKvOffloadEqualsNonSpeculative) {
  testing::check_speculative_offloaded_equals_plain(testing::cpu_executor, kExact);
}

TEST(SpeculativeEngine, BatchedWithDraftlessSequencesPrefixCachedAndPreempted) {
  testing::check_speculative_batched_cached_preempted_equals_alone(testing::cpu_executor, kExact);
}

TEST(SpeculativeEngine, GreedyRandomModelEqualsNonSpeculative) {
  // The tiny random model does not copy: drafts are proposed and (almost) all rejected.
  const std::vector<std::vector<int32_t>> prompts = {copy_heavy_prompt(1, 24, 4)};
  const SpecRun plain = run_model(prompts, 40, 0);
  const SpecRun spec = run_model(prompts, 40, 4);
  expect_same(plain.outs[0], spec.outs[0], "tiny model");
  EXPECT_GT(spec.stats.spec_decode.num_drafts, 0);
}

// Small steps: drafts are trimmed to the token budget (max_num_batched_tokens 2: one draft token
// at most beside the sequence's own).
TEST(SpeculativeEngine, DraftsAreTrimmedToTheStepsTokenBudget) {
  const std::vector<std::vector<int32_t>> prompts = {testing::short_needle_prompt(224)};
  testing::EngineSpec s = testing::needle_spec();
  const SamplingParams sp = testing::greedy_with_logprobs(12);
  const testing::EngineRun ref = testing::run_engine(testing::cpu_executor, s, prompts, sp);
  s.num_speculative_tokens = 3;
  s.max_num_batched_tokens = 2;
  s.max_num_seqs = 1;
  const testing::EngineRun tight = testing::run_engine(testing::cpu_executor, s, prompts, sp);
  expect_same(ref.outs[0], tight.outs[0], "budget-trimmed drafts");
  EXPECT_EQ(tight.stats.spec_decode.num_draft_tokens, tight.stats.spec_decode.num_drafts);
  EXPECT_GT(tight.stats.spec_decode.num_accepted_tokens, 0);
}

// Scripted model: the next token is (last + 1) mod 64. The prompt is a permutation where each
// token t is followed by anything but t + 1, so every draft (looked up in the prompt) is wrong
// until the generated run wraps around.
std::unique_ptr<Executor> successor_executor() {
  return make_function_executor(64, [](const StepInput& in) {
    std::vector<float> row(64, 0.0f);
    row[(in.all_tokens.back() + 1) % 64] = 5.0f;
    return row;
  });
}

std::vector<int32_t> no_successor_prompt() {
  std::vector<int32_t> p;
  for (int32_t t = 0; t < 64; ++t) p.push_back((t * 5) % 64);  // t -> t + 5
  return p;
}

TEST(SpeculativeEngine, NothingAcceptedStillEqualsNonSpeculative) {
  SamplingParams sp = greedy(40);
  sp.logprobs = 1;
  const std::vector<std::vector<int32_t>> prompts = {no_successor_prompt()};
  const SpecRun plain = run(successor_executor(), spec_options(256, 4, true, 0), prompts, sp);
  const SpecRun spec = run(successor_executor(), spec_options(256, 4, true, 4), prompts, sp);
  EXPECT_EQ(spec.outs[0].token_ids, plain.outs[0].token_ids);
  ASSERT_EQ(spec.outs[0].token_ids.size(), 40u);
  EXPECT_EQ(spec.outs[0].token_ids[0], (no_successor_prompt().back() + 1) % 64);
  const SpecDecodeStats& s = spec.stats.spec_decode;
  EXPECT_GT(s.num_drafts, 30);  // every token is in the prompt: a draft every step
  EXPECT_GT(s.num_draft_tokens, s.num_drafts);
  EXPECT_EQ(s.num_accepted_tokens, 0);
  EXPECT_DOUBLE_EQ(s.mean_acceptance_length(), 1.0);
}

TEST(SpeculativeEngine, AcceptedDraftsThenStopsAndLength) {
  // The successor model on a prompt that holds the run 10 11 ... 40: drafts are right.
  std::vector<int32_t> prompt;
  for (int32_t t = 10; t <= 40; ++t) prompt.push_back(t);
  prompt.push_back(9);  // then 9: the model continues 10 11 ..., which the prompt holds
  const std::vector<std::vector<int32_t>> prompts = {prompt};
  auto check = [&](const SamplingParams& sp, const char* what) {
    const SpecRun plain = run(successor_executor(), spec_options(256, 4, true, 0), prompts, sp);
    const SpecRun spec = run(successor_executor(), spec_options(256, 4, true, 5), prompts, sp);
    EXPECT_EQ(spec.outs[0].token_ids, plain.outs[0].token_ids) << what;
    EXPECT_EQ(spec.outs[0].finish_reason, plain.outs[0].finish_reason) << what;
    EXPECT_EQ(spec.outs[0].stop_reason.kind, plain.outs[0].stop_reason.kind) << what;
    EXPECT_GT(spec.stats.spec_decode.num_accepted_tokens, 0) << what;
    return spec.outs[0];
  };
  // max_tokens inside an accepted draft: exactly 13 tokens.
  EXPECT_EQ(check(greedy(13), "max_tokens").token_ids.size(), 13u);
  // A stop token inside an accepted draft: generation ends on it (10 .. 17).
  SamplingParams stop = greedy(30);
  stop.stop_token_ids = {17};
  const RequestOutput out = check(stop, "stop token");
  EXPECT_EQ(out.token_ids.back(), 17);
  EXPECT_EQ(out.token_ids.size(), 8u);
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  // EOS likewise (the engine's EOS ids; ignore_eos off).
  EngineCoreOptions o = spec_options(256, 4, true, 5);
  o.eos_token_ids = {20};
  SamplingParams eos = greedy(30);
  eos.ignore_eos = false;
  const SpecRun r = run(successor_executor(), o, prompts, eos);
  EXPECT_EQ(r.outs[0].token_ids.back(), 20);
  EXPECT_EQ(r.outs[0].token_ids.size(), 11u);
}

TEST(SpeculativeEngine, SampledRequestsRunAndKeepTheirLogprobs) {
  const std::vector<std::vector<int32_t>> prompts = {copy_heavy_prompt(6, 16, 4),
                                                     random_prompt(7, 20)};
  CpuExecutorOptions x;
  x.block_size = 4;
  x.num_blocks = 256;
  SamplingParams sp;
  sp.temperature = 0.7;
  sp.top_k = 20;
  sp.max_tokens = 20;
  sp.ignore_eos = true;
  sp.logprobs = 3;
  sp.seed = 5;
  const SpecRun a =
      run(make_cpu_executor(tiny_model(), x), spec_options(256, 4, false, 3), prompts, sp);
  const SpecRun b =
      run(make_cpu_executor(tiny_model(), x), spec_options(256, 4, false, 3), prompts, sp);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a.outs[i].token_ids, b.outs[i].token_ids);  // a seed reproduces it
    ASSERT_EQ(a.outs[i].token_ids.size(), 20u);
    ASSERT_EQ(a.outs[i].logprobs.size(), 20u);
    for (size_t t = 0; t < 20; ++t) {
      EXPECT_EQ(a.outs[i].logprobs[t].token, a.outs[i].token_ids[t]);
      EXPECT_LE(a.outs[i].logprobs[t].logprob, 0.0f);
    }
  }
  EXPECT_GT(a.stats.spec_decode.num_drafts, 0);
}

// Sampled requests through the engine: a scripted model whose next-token distribution p ignores
// the context (so every generated token is an independent draw from p), a prompt holding every
// token (so drafts are proposed every step, accepted or not), 4000 seeded requests of 4 tokens.
// Each position's tokens must be distributed as p: Pearson's chi-square against the p = 0.001
// critical value (df = 5: 20.52), fixed seeds, so deterministic. Position 0 is the plain sampler's,
// 1..3 come out of verifications (accepted drafts, residual draws, bonus tokens).
TEST(SpeculativeEngine, SampledTokensKeepTheTargetDistribution) {
  const std::vector<float> logits = {0.5f, 1.5f, -0.2f, 1.0f, 0.1f, 0.8f};
  auto exec = make_function_executor(6, [&](const StepInput&) { return logits; });
  std::vector<double> p(6);
  double z = 0;
  for (size_t t = 0; t < 6; ++t) z += p[t] = std::exp(static_cast<double>(logits[t]));
  for (double& x : p) x /= z;
  EngineCore core(std::move(exec), nullptr, spec_options(4096, 256, true, 3));
  constexpr int kRequests = 4000;
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  for (int i = 0; i < kRequests; ++i) {
    sp.seed = 100 + i;
    core.add_request(i, {0, 1, 2, 3, 4, 5, 1, 3, 5}, sp, 0);
  }
  std::vector<std::vector<int64_t>> counts(4, std::vector<int64_t>(6, 0));
  while (core.has_unfinished()) {
    core.step();
    for (const RequestOutput& o : core.take_finished()) {
      ASSERT_EQ(o.token_ids.size(), 4u);
      for (size_t pos = 0; pos < 4; ++pos) ++counts[pos][o.token_ids[pos]];
    }
  }
  const EngineStats s = core.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_GT(s.spec_decode.num_accepted_tokens, 0);
  EXPECT_LT(s.spec_decode.num_accepted_tokens, s.spec_decode.num_draft_tokens);
  constexpr double kChiSquareCritical = 20.52;
  for (size_t pos = 0; pos < 4; ++pos) {
    double chi2 = 0;
    for (size_t t = 0; t < 6; ++t) {
      const double e = p[t] * kRequests;
      chi2 += (counts[pos][t] - e) * (counts[pos][t] - e) / e;
    }
    EXPECT_LT(chi2, kChiSquareCritical) << "position " << pos;
  }
}

TEST(SpeculativeEngine, RefusesBadConfigurations) {
  EngineCoreOptions o = testing::core_options(64, 4);
  o.speculative = {SpeculativeMethod::kNgram, 0, 1, 2};
  EXPECT_THROW(EngineCore(successor_executor(), nullptr, o), Error);
  o.speculative = {SpeculativeMethod::kNgram, 2, 3, 2};
  EXPECT_THROW(EngineCore(successor_executor(), nullptr, o), Error);
  o.speculative = {SpeculativeMethod::kNone, 2, 0, 0};
  EXPECT_THROW(EngineCore(successor_executor(), nullptr, o), Error);
}

}  // namespace
}  // namespace longctx
