// Speculative decoding on the GPU engine (docs/engine.md, "Speculative decoding"): greedy outputs
// with prompt-lookup drafts equal the non-speculative engine's, resident (CUDA graphs for plain
// decode steps, eager verifying steps), batched with prefix caching and preemption, and with the
// KV offloaded; the needle model's answer (copied from its haystack) is accepted from drafts.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine/llm_internal.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

// A verifying step runs its k + 1 positions through the paged prefill kernel, a plain decode
// step through the split-KV decode: bf16 sums in another order move near-ties (the needle model
// is sensitive to rounding: tests/common/test_data.h). The other GPU model tests hold 0.05 too.
constexpr double kTieMargin = 0.05;

struct NeedleCase {
  std::vector<int32_t> input_ids, greedy_new_tokens;
};

NeedleCase needle_case() {
  std::ifstream f(test_data_dir() + "/needle/reference.json");
  EXPECT_TRUE(f.good()) << "missing tests/data/needle/reference.json";
  const nlohmann::json j = nlohmann::json::parse(f);
  return {j.at("input_ids").get<std::vector<int32_t>>(),
          j.at("greedy_new_tokens").get<std::vector<int32_t>>()};
}

EngineConfig config(int64_t k, int64_t num_gpu_blocks = 0, bool offload = false) {
  EngineConfig c;
  c.model = test_data_dir() + "/../../models/needle";
  c.device = "cuda";
  // The longest prompt (988 tokens) and its answer fit; 80 blocks of 16 tokens a sequence.
  c.max_model_len = 1280;
  c.block_size = 16;
  c.max_num_batched_tokens = 512;
  c.max_num_seqs = 16;
  c.num_gpu_blocks = num_gpu_blocks;
  c.kv_offload = offload;
  if (offload) {
    c.host_kv_budget = 256ll << 20;
    c.gpu_kv_budget = 64ll << 20;
  }
  if (k > 0) c.speculative = {SpeculativeMethod::kNgram, k, 1, 3};
  return c;
}

SamplingParams greedy(int64_t n) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = n;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  return sp;
}

// Tokens equal up to a step where the reference's top two were within kTieMargin.
void expect_same(const RequestOutput& ref, const RequestOutput& got, const char* what) {
  ASSERT_EQ(ref.token_ids.size(), got.token_ids.size()) << what;
  for (size_t i = 0; i < ref.token_ids.size(); ++i) {
    if (ref.token_ids[i] == got.token_ids[i]) continue;
    const auto& top = ref.logprobs.at(i).top;
    ASSERT_GE(top.size(), 2u);
    EXPECT_LT(top[0].second - top[1].second, kTieMargin) << what << ": token " << i << " differs";
    return;
  }
}

std::vector<std::vector<int32_t>> needle_prompts() {
  const NeedleCase c = needle_case();
  std::vector<std::vector<int32_t>> out = {c.input_ids};
  // The haystack cut after the needle (at 197-206), then the question: shares its prefix.
  for (size_t head : {224, 400, 640}) {
    std::vector<int32_t> p(c.input_ids.begin(), c.input_ids.begin() + head);
    p.insert(p.end(), c.input_ids.end() - 40, c.input_ids.end());
    out.push_back(p);
  }
  std::mt19937 rng(9);  // and random prompts: drafts rarely accepted
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p(100 + 50 * i);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 2000);
    out.push_back(p);
  }
  return out;
}

std::vector<RequestOutput> run(const EngineConfig& c, const std::vector<std::vector<int32_t>>& ps,
                               int64_t n, EngineStats* stats) {
  LLM llm(c);
  std::vector<Prompt> prompts(ps.begin(), ps.end());
  std::vector<RequestOutput> outs = llm.generate(prompts, greedy(n), false);
  *stats = engine_core(llm).stats();
  EXPECT_EQ(stats->kv_blocks_used, 0);
  return outs;
}

TEST(GpuSpeculative, NeedleGreedyEqualsNonSpeculative) {
  const NeedleCase c = needle_case();
  EngineStats plain_stats, spec_stats;
  const auto n = static_cast<int64_t>(c.greedy_new_tokens.size());
  const auto plain = run(config(0), {c.input_ids}, n, &plain_stats);
  const auto spec = run(config(4), {c.input_ids}, n, &spec_stats);
  EXPECT_EQ(plain[0].token_ids, c.greedy_new_tokens);
  expect_same(plain[0], spec[0], "needle");
  EXPECT_GT(spec_stats.spec_decode.num_accepted_tokens, 0);
  std::printf("needle: %lld drafts, %lld of %lld draft tokens accepted, mean acceptance %.2f\n",
              static_cast<long long>(spec_stats.spec_decode.num_drafts),
              static_cast<long long>(spec_stats.spec_decode.num_accepted_tokens),
              static_cast<long long>(spec_stats.spec_decode.num_draft_tokens),
              spec_stats.spec_decode.mean_acceptance_length());
}

TEST(GpuSpeculative, BatchedPrefixCachedPreemptedEqualsNonSpeculative) {
  const auto prompts = needle_prompts();
  EngineStats plain_stats, spec_stats;
  const auto plain = run(config(0), prompts, 24, &plain_stats);
  // 90 blocks of 16 tokens: the batch holds ~115 at once with its shared prefixes cached (the
  // longest sequence needs 64), so sequences are preempted.
  const auto spec = run(config(3, 90), prompts, 24, &spec_stats);
  EXPECT_GT(spec_stats.num_preemptions, 0);
  EXPECT_GT(spec_stats.prefix_cache_hits, 0);
  EXPECT_GT(spec_stats.spec_decode.num_accepted_tokens, 0);
  for (size_t i = 0; i < prompts.size(); ++i) expect_same(plain[i], spec[i], "batched");
}

TEST(GpuSpeculative, OffloadedGreedyEqualsNonSpeculative) {
  const auto prompts = needle_prompts();
  EngineStats plain_stats, spec_stats;
  const auto plain = run(config(0, 0, /*offload=*/true), prompts, 16, &plain_stats);
  const auto spec = run(config(4, 0, /*offload=*/true), prompts, 16, &spec_stats);
  EXPECT_GT(spec_stats.spec_decode.num_accepted_tokens, 0);
  for (size_t i = 0; i < prompts.size(); ++i) expect_same(plain[i], spec[i], "offloaded");
}

}  // namespace
}  // namespace longctx::testing
