// The serving engine's scheduling on the CPU: continuous batching, chunked prefill, prefix
// caching (with copy-on-write), preemption by recompute and aborts.
//
// Two harnesses. TokenKvExecutor keeps a "KV cache" of token ids in the engine's blocks and
// checks, for every sequence it computes logits for, that its block table reads back exactly
// the sequence's tokens: any wrong table, stale block, bad copy-on-write or prefix hit shows up
// as an error, and the logits (a peak at a hash of the tokens read) make outputs depend on the
// blocks' contents. Then the CPU reference model (tiny fixture) for outputs: batched, preempted,
// cached and chunked runs equal runs of each request alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_map>

#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine/engine_test_util.h"
#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

using testing::greedy;
using testing::next_token_of;
using testing::tiny_model;
constexpr int64_t kVocab = testing::kTokenVocab;

EngineCoreOptions options(int64_t batched_tokens, int64_t max_seqs, bool caching = true) {
  return testing::core_options(batched_tokens, max_seqs, caching);
}

class TokenKvExecutor final : public Executor {
 public:
  TokenKvExecutor(int64_t num_blocks, int64_t block_size)
      : layout_{num_blocks, block_size}, kv_(num_blocks * block_size, -1) {}
  int64_t vocab_size() const override { return kVocab; }
  KVBlockLayout kv_layout() const override { return layout_; }

  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    const int64_t bs = layout_.block_size;
    for (const KVBlockCopy& c : copies)
      std::copy_n(kv_.begin() + c.src * bs, bs, kv_.begin() + c.dst * bs);
    std::unordered_map<int64_t, uint64_t> written;  // slot -> sequence, within this step
    auto slot = [&](const StepInput& in, int64_t j) {
      return in.block_table[j / bs] * bs + j % bs;
    };
    for (const StepInput& in : inputs) {
      for (int64_t j = in.num_computed; j < in.num_computed + in.num_new; ++j) {
        const int64_t s = slot(in, j);
        LONGCTX_CHECK(written.emplace(s, in.seq_id).second, ErrorCode::kInternal,
                      "slot {} written twice in one step", s);
        kv_[s] = in.all_tokens[j];
      }
    }
    int64_t rows = 0;
    for (const StepInput& in : inputs) rows += in.want_logits ? 1 : 0;
    Tensor out = Tensor::zeros({rows, kVocab}, DType::kF32);
    int64_t r = 0;
    for (const StepInput& in : inputs) {
      const int64_t end = in.num_computed + in.num_new;
      std::vector<int32_t> read(end);
      for (int64_t j = 0; j < end; ++j) read[j] = kv_[slot(in, j)];
      for (int64_t j = 0; j < end; ++j) {
        LONGCTX_CHECK(read[j] == in.all_tokens[j], ErrorCode::kInternal,
                      "sequence {}: its blocks hold token {} at position {}, expected {}",
                      in.seq_id, read[j], j, in.all_tokens[j]);
      }
      max_tokens_in_step = std::max<int64_t>(max_tokens_in_step, in.num_new);
      if (!in.want_logits) continue;
      out.data<float>()[r++ * kVocab + next_token_of(read)] = 10.0f;
    }
    ++steps;
    max_seqs_in_step = std::max<int64_t>(max_seqs_in_step, static_cast<int64_t>(inputs.size()));
    return out;
  }

  int64_t steps = 0, max_seqs_in_step = 0, max_tokens_in_step = 0;

 private:
  KVBlockLayout layout_;
  std::vector<int32_t> kv_;  // [num_blocks * block_size] token id per slot
};

std::vector<int32_t> expected_tokens(std::vector<int32_t> tokens, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(next_token_of(tokens));
    tokens.push_back(out.back());
  }
  return out;
}

// 1,000 requests arriving over time with random lengths and shared prefixes, random aborts, a
// pool far too small for all of them: everything finishes or is aborted, outputs are right,
// nothing leaks.
TEST(Scheduler, ThousandRandomRequestsFinishWithoutLeaks) {
  std::mt19937_64 rng(11);
  auto exec = std::make_unique<TokenKvExecutor>(40, 4);  // 160 tokens of KV
  TokenKvExecutor* e = exec.get();
  EngineCore core(std::move(exec), nullptr, options(24, 6));
  std::vector<std::vector<int32_t>> families;
  for (int f = 0; f < 8; ++f) {
    std::vector<int32_t> p(12 + rng() % 20);
    for (auto& t : p) t = static_cast<int32_t>(rng() % kVocab);
    families.push_back(p);
  }
  struct Want {
    std::vector<int32_t> prompt;
    int64_t max_tokens;
  };
  std::vector<Want> want(1000);  // by request index
  std::vector<uint64_t> live;
  int64_t added = 0, aborted = 0, finished = 0;
  while (added < 1000 || core.has_unfinished()) {
    for (int k = static_cast<int>(rng() % 4); k > 0 && added < 1000; --k, ++added) {
      std::vector<int32_t> prompt = families[rng() % families.size()];
      prompt.resize(1 + rng() % prompt.size());
      for (int t = static_cast<int>(rng() % 10); t > 0; --t)
        prompt.push_back(static_cast<int32_t>(rng() % kVocab));
      const int64_t max_tokens = 1 + static_cast<int64_t>(rng() % 30);
      const uint64_t id = core.add_request(static_cast<size_t>(added), prompt, greedy(max_tokens),
                                           static_cast<double>(added));
      want[added] = {prompt, max_tokens};
      live.push_back(id);
    }
    if (!live.empty() && rng() % 20 == 0) {
      const size_t i = rng() % live.size();
      if (core.abort(live[i])) ++aborted;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    core.step();
    for (RequestOutput& out : core.take_finished()) {
      if (out.finish_reason == FinishReason::kAbort) continue;
      ++finished;
      const Want& w = want.at(out.index);
      EXPECT_EQ(out.prompt_token_ids, w.prompt);
      EXPECT_EQ(out.token_ids, expected_tokens(w.prompt, w.max_tokens));
      EXPECT_EQ(out.finish_reason, FinishReason::kLength);
    }
    if (e->steps % 50 == 0) core.check_consistency();
  }
  core.check_consistency();
  const EngineStats st = core.stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.num_running + st.num_waiting, 0);
  EXPECT_EQ(finished + aborted, 1000);
  EXPECT_GT(aborted, 0);
  EXPECT_GT(st.num_preemptions, 0) << "the pool was meant to be too small";
  EXPECT_GT(st.prefix_cache_hits, 0);
  EXPECT_LE(e->max_seqs_in_step, 6);
  EXPECT_GT(e->max_seqs_in_step, 1) << "no step batched several sequences";
  std::printf("1000 requests: %lld steps, %lld preemptions, prefix hits %lld of %lld tokens\n",
              static_cast<long long>(e->steps), static_cast<long long>(st.num_preemptions),
              static_cast<long long>(st.prefix_cache_hits),
              static_cast<long long>(st.prefix_cache_queries));
}

// A held sequence (its blocks loading from the KV store) stays waiting and is skipped: the
// sequences behind it run; released, it is scheduled.
TEST(Scheduler, HeldSequencesAreSkippedUntilReleased) {
  BlockManager blocks(64, 4, true);
  Scheduler sched({64, 8}, blocks);
  Sequence a, b;
  a.id = 1;
  b.id = 2;
  a.tokens = std::vector<int32_t>(10, 5);
  b.tokens = std::vector<int32_t>(6, 7);
  a.num_prompt_tokens = 10;
  b.num_prompt_tokens = 6;
  sched.add(&a);
  sched.add(&b);
  sched.hold(&a);
  EXPECT_TRUE(sched.held(&a));
  for (int step = 0; step < 3; ++step) {
    SchedulerOutput out = sched.schedule();
    ASSERT_EQ(out.seqs.size(), 1u);
    EXPECT_EQ(out.seqs[0].seq, &b);
    sched.complete(out);
    b.tokens.push_back(9);  // its sampled token
    EXPECT_EQ(a.status, SequenceStatus::kWaiting);
    EXPECT_FALSE(blocks.holds(a.id));
    EXPECT_EQ(sched.num_waiting(), 1);
  }
  sched.release(&a);
  EXPECT_EQ(sched.num_held(), 0);
  SchedulerOutput out = sched.schedule();
  ASSERT_EQ(out.seqs.size(), 2u);
  EXPECT_EQ(out.seqs[0].seq, &b);  // the decode first
  EXPECT_EQ(out.seqs[1].seq, &a);
  EXPECT_EQ(out.seqs[1].num_new, 10);
  sched.complete(out);
  EXPECT_THROW(sched.hold(&a), Error);  // running, not waiting
  // Removing a held sequence forgets it.
  Sequence c;
  c.id = 3;
  c.tokens = std::vector<int32_t>(4, 1);
  c.num_prompt_tokens = 4;
  sched.add(&c);
  sched.hold(&c);
  sched.remove(&c);
  EXPECT_EQ(sched.num_held(), 0);
  sched.remove(&a);
  sched.remove(&b);
  EXPECT_TRUE(sched.empty());
  blocks.check_consistency();
}

TEST(Scheduler, StepRespectsTheTokenBudgetAndChunksLongPrompts) {
  auto exec = std::make_unique<TokenKvExecutor>(256, 16);
  TokenKvExecutor* e = exec.get();
  EngineCore core(std::move(exec), nullptr, options(10, 4));
  std::vector<int32_t> prompt(47);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % kVocab);
  core.add_request(0, prompt, greedy(3), 0);
  core.add_request(1, {1, 2, 3}, greedy(3), 0);
  while (core.has_unfinished()) core.step();
  auto outs = core.take_finished();
  ASSERT_EQ(outs.size(), 2u);
  for (const auto& o : outs) EXPECT_EQ(o.token_ids, expected_tokens(o.prompt_token_ids, 3));
  EXPECT_LE(e->max_tokens_in_step, 10);
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
}

TEST(Scheduler, RequestThatCanNeverFitIsAnError) {
  EngineCore core(std::make_unique<TokenKvExecutor>(4, 4), nullptr, options(64, 4));
  try {
    core.add_request(0, std::vector<int32_t>(10, 1), greedy(20), 0);  // 30 tokens > 16
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("KV cache"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(core.has_unfinished());
  core.add_request(0, std::vector<int32_t>(10, 1), greedy(6), 0);  // 16 tokens fit exactly
  while (core.has_unfinished()) core.step();
  EXPECT_EQ(core.take_finished().at(0).token_ids.size(), 6u);
}

TEST(Scheduler, AbortFreesBlocksAtOnce) {
  EngineCore core(std::make_unique<TokenKvExecutor>(64, 4), nullptr, options(64, 4));
  const uint64_t a = core.add_request(0, std::vector<int32_t>(20, 3), greedy(30), 0);
  const uint64_t b = core.add_request(1, std::vector<int32_t>(5, 4), greedy(30), 0);
  core.step();
  core.step();
  EXPECT_GT(core.stats().kv_blocks_used, 0);
  EXPECT_TRUE(core.abort(a));
  EXPECT_FALSE(core.abort(a));
  EXPECT_FALSE(core.abort(12345));
  core.step();
  EXPECT_TRUE(core.abort(b));
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  EXPECT_FALSE(core.has_unfinished());
  auto outs = core.take_finished();
  ASSERT_EQ(outs.size(), 2u);
  for (const auto& o : outs) {
    EXPECT_EQ(o.finish_reason, FinishReason::kAbort);
    EXPECT_STREQ(finish_reason_name(o.finish_reason), "abort");
    EXPECT_FALSE(o.token_ids.empty());
  }
  core.check_consistency();
}

TEST(Scheduler, FailedStepLeavesTheEngineUsable) {
  bool fail = true;
  auto fn = [&](const StepInput& in) {
    if (fail) throw Error(ErrorCode::kOutOfMemory, "scripted out of memory");
    std::vector<float> l(kVocab, 0.f);
    l[next_token_of(in.all_tokens.first(in.num_computed + in.num_new))] = 10.f;
    return l;
  };
  EngineCore core(make_function_executor(kVocab, fn, {32, 4}), nullptr, options(64, 4));
  core.add_request(0, {1, 2, 3, 4, 5}, greedy(4), 0);
  EXPECT_THROW(core.step(), Error);
  core.abort_all();
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  core.check_consistency();
  fail = false;
  core.add_request(0, {1, 2, 3, 4, 5}, greedy(4), 0);
  while (core.has_unfinished()) core.step();
  EXPECT_EQ(core.take_finished().at(0).token_ids, expected_tokens({1, 2, 3, 4, 5}, 4));
}

// ---- The CPU reference model --------------------------------------------------------------

struct EngineRun {
  std::vector<RequestOutput> outs;  // by request index
  EngineStats stats;
};

// Runs the prompts through one engine (all submitted at once) and returns outputs by index.
EngineRun run_all(const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                  int64_t num_blocks, int64_t batched_tokens, bool caching, int64_t max_seqs = 8) {
  CpuExecutorOptions x;
  x.block_size = 4;
  x.num_blocks = num_blocks;
  EngineCore core(make_cpu_executor(tiny_model(), x), nullptr,
                  options(batched_tokens, max_seqs, caching));
  SamplingParams sp = greedy(max_tokens);
  sp.logprobs = 2;  // the top-2 margin says where greedy ties may legitimately flip
  for (size_t i = 0; i < prompts.size(); ++i) core.add_request(i, prompts[i], sp, 0);
  EngineRun r;
  r.outs.resize(prompts.size());
  while (core.has_unfinished()) {
    core.step();
    for (RequestOutput& o : core.take_finished()) r.outs[o.index] = std::move(o);
  }
  core.check_consistency();
  r.stats = core.stats();
  EXPECT_EQ(r.stats.kv_blocks_used, 0);
  return r;
}

// Greedy tokens equal up to a step where the reference's top-2 logprobs were within 1e-4.
void expect_same_tokens(const RequestOutput& ref, const RequestOutput& got, const char* what) {
  ASSERT_EQ(ref.token_ids.size(), got.token_ids.size()) << what;
  for (size_t i = 0; i < ref.token_ids.size(); ++i) {
    if (ref.token_ids[i] == got.token_ids[i]) continue;
    const auto& top = ref.logprobs.at(i).top;
    ASSERT_GE(top.size(), 2u);
    EXPECT_LT(top[0].second - top[1].second, 1e-4) << what << ": token " << i << " differs";
    return;
  }
}

std::vector<std::vector<int32_t>> prompts_with_shared_prefix(int n, int64_t prefix_len) {
  std::mt19937 rng(3);
  std::vector<int32_t> prefix(prefix_len);
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % 1000);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    auto p = prefix;
    for (int k = 0; k < 3 + i; ++k) p.push_back(static_cast<int32_t>(rng() % 1000));
    out.push_back(p);
  }
  return out;
}

TEST(EngineCpuModel, BatchedPreemptedRunsEqualEachRequestAlone) {
  auto prompts = prompts_with_shared_prefix(6, 17);
  // 6 requests of up to 17 + 8 + 12 tokens need ~60 blocks of 4 at once; 24 forces preemption.
  EngineRun batched = run_all(prompts, 12, 24, 64, /*caching=*/false);
  EXPECT_GT(batched.stats.num_preemptions, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRun alone = run_all({prompts[i]}, 12, 24, 64, false);
    expect_same_tokens(alone.outs[0], batched.outs[i], "batched + preempted vs alone");
  }
}

TEST(EngineCpuModel, PrefixCacheHitsGiveTheSameOutputs) {
  auto prompts = prompts_with_shared_prefix(5, 23);
  prompts.push_back(std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + 24));  // 6 blocks
  EngineRun cached = run_all(prompts, 10, 256, 4096, /*caching=*/true, /*max_seqs=*/1);
  EngineRun plain = run_all(prompts, 10, 256, 4096, /*caching=*/false, 1);
  EXPECT_GT(cached.stats.prefix_cache_hits, 0);
  EXPECT_EQ(plain.stats.prefix_cache_hits, 0);
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_same_tokens(plain.outs[i], cached.outs[i], "prefix cache vs none");
  // The last prompt is whole blocks of the first's: all of it hits, its last token is
  // recomputed into a copy of the shared block.
  EXPECT_EQ(cached.outs.back().metrics.num_cached_tokens, 23);
}

// Preemption and prefix caching together keep the outputs of a roomy engine without the cache:
// common/engine_properties.h's body (tests/gpu_models/test_gpu_serving.cpp runs it on the GPU).
TEST(EngineCpuModel, PreemptionAndPrefixCacheKeepOutputs) {
  // 8 prompts sharing 32 tokens (8 blocks of 4), up to 108 tokens with the 16 generated: 27
  // blocks each (8 of them shared), ~160 for the batch at once against a pool of 48.
  const auto prompts = testing::shared_prefix_prompts(8, 32, 32, 0, 60, 1000, 2);
  testing::EngineSpec tight;
  tight.checkpoint = testing::checkpoint_of(testing::test_data_dir() + "/fixtures/tiny-llama3");
  tight.model_options.rope_inv_freq_dtype = DType::kBF16;
  tight.max_model_len = 512;
  tight.block_size = 4;
  tight.num_blocks = 48;
  tight.max_num_batched_tokens = 64;
  tight.max_num_seqs = 8;
  testing::EngineSpec roomy = tight;
  roomy.num_blocks = 1024;
  roomy.enable_prefix_caching = false;
  // fp32: a recomputed prefill only reorders sums.
  testing::check_preemption_and_prefix_cache_keep_outputs(testing::cpu_executor, tight, roomy,
                                                          prompts, 16, {1e-4, 1e-4});
}

TEST(EngineCpuModel, ChunkedPrefillEqualsOneShot) {
  auto prompts = prompts_with_shared_prefix(2, 61);
  EngineRun chunked = run_all(prompts, 8, 256, 7, false);
  EngineRun whole = run_all(prompts, 8, 256, 4096, false);
  for (size_t i = 0; i < prompts.size(); ++i) {
    expect_same_tokens(whole.outs[i], chunked.outs[i], "chunked vs one-shot prefill");
    for (size_t t = 0; t < whole.outs[i].logprobs.size(); ++t)
      EXPECT_NEAR(whole.outs[i].logprobs[t].logprob, chunked.outs[i].logprobs[t].logprob, 1e-4);
  }
}

}  // namespace
}  // namespace longctx
