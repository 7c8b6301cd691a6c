// The LLM loop driven by scripted logits (no model, no tokenizer): stop rules, length limits,
// prompt checks, seeds, streaming, and what the executor is asked to run.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/llm.h"

namespace longctx {
namespace {

constexpr int64_t kVocab = 16;
constexpr int32_t kEos = 2;

// Greedy-friendly logits: the scripted token gets 10, the rest 0. After the script ends it
// keeps returning its last token.
std::vector<float> peak(int32_t token) {
  std::vector<float> l(kVocab, 0.0f);
  l[token] = 10.0f;
  return l;
}

// Records every call so tests can check what the engine asked for.
class ScriptExecutor : public Executor {
 public:
  ScriptExecutor(size_t prompt_len, std::vector<int32_t> script)
      : prompt_len_(prompt_len), script_(std::move(script)) {}
  int64_t vocab_size() const override { return kVocab; }
  KVBlockLayout kv_layout() const override { return {64, 4}; }
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy>) override {
    Tensor out = Tensor::empty({static_cast<int64_t>(inputs.size()), kVocab}, DType::kF32);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const StepInput& in = inputs[i];
      calls.push_back({in.seq_id, static_cast<int64_t>(in.all_tokens.size()), in.num_computed,
                       in.num_new, static_cast<int64_t>(in.block_table.size())});
      const size_t step = in.all_tokens.size() - prompt_len_;
      auto l = peak(script_[std::min(step, script_.size() - 1)]);
      std::copy(l.begin(), l.end(), out.data<float>() + i * kVocab);
    }
    return out;
  }

  struct Call {
    uint64_t seq_id;
    int64_t total;
    int64_t computed;
    int64_t num_new;
    int64_t blocks;
  };
  std::vector<Call> calls;

 private:
  size_t prompt_len_;
  std::vector<int32_t> script_;
};

struct Harness {
  Harness(size_t prompt_len, std::vector<int32_t> script, int64_t max_model_len = 64) {
    auto exec = std::make_unique<ScriptExecutor>(prompt_len, std::move(script));
    executor = exec.get();
    llm =
        std::make_unique<LLM>(std::move(exec), nullptr, max_model_len, std::vector<int64_t>{kEos});
  }
  ScriptExecutor* executor;
  std::unique_ptr<LLM> llm;
};

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

const std::vector<int32_t> kPrompt = {1, 3, 4};

TEST(LLMScripted, MaxTokensEndsWithLength) {
  Harness h(3, {5, 6, 7});
  auto outs = h.llm->generate({kPrompt}, greedy(5), false);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].token_ids, (std::vector<int32_t>{5, 6, 7, 7, 7}));
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kLength);
  EXPECT_STREQ(finish_reason_name(outs[0].finish_reason), "length");
  EXPECT_EQ(outs[0].prompt_token_ids, kPrompt);
  EXPECT_EQ(outs[0].metrics.num_prompt_tokens, 3);
  EXPECT_EQ(outs[0].metrics.num_generated_tokens, 5);
  EXPECT_GE(outs[0].metrics.ttft(), 0.0);
  EXPECT_GE(outs[0].metrics.finished, outs[0].metrics.first_token);
}

TEST(LLMScripted, ExecutorGetsThePromptOnceThenOneTokenPerStep) {
  Harness h(3, {5, 6, 7});
  h.llm->generate({kPrompt}, greedy(4), false);
  const auto& c = h.executor->calls;
  ASSERT_EQ(c.size(), 4u);  // the 4th token comes from the 3rd decode step
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].total, 3 + static_cast<int64_t>(i));
    EXPECT_EQ(c[i].computed, i == 0 ? 0 : 3 + static_cast<int64_t>(i) - 1);
    EXPECT_EQ(c[i].num_new, i == 0 ? 3 : 1);
    EXPECT_EQ(c[i].blocks, (c[i].computed + c[i].num_new + 3) / 4);  // blocks of 4 tokens
    EXPECT_EQ(c[i].seq_id, c[0].seq_id);
  }
}

TEST(LLMScripted, EosStopsAndIsKeptInTokens) {
  Harness h(3, {5, 6, kEos, 7});
  auto out = h.llm->generate({kPrompt}, greedy(10), false)[0];
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5, 6, kEos}));
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(out.stop_reason.kind, StopReason::Kind::kEos);
  EXPECT_EQ(out.stop_reason.token, kEos);
}

TEST(LLMScripted, IgnoreEosKeepsGoing) {
  Harness h(3, {5, kEos, 7});
  auto p = greedy(4);
  p.ignore_eos = true;
  auto out = h.llm->generate({kPrompt}, p, false)[0];
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5, kEos, 7, 7}));
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
}

TEST(LLMScripted, StopTokenIdsStopEvenWithIgnoreEos) {
  Harness h(3, {5, kEos, 9, 7});
  auto p = greedy(10);
  p.ignore_eos = true;
  p.stop_token_ids = {9};
  auto out = h.llm->generate({kPrompt}, p, false)[0];
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5, kEos, 9}));
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(out.stop_reason.kind, StopReason::Kind::kStopToken);
  EXPECT_EQ(out.stop_reason.token, 9);
}

TEST(LLMScripted, EosOnTheLastAllowedTokenIsAStop) {
  Harness h(3, {5, kEos});
  auto out = h.llm->generate({kPrompt}, greedy(2), false)[0];
  EXPECT_EQ(out.finish_reason, FinishReason::kStop);
}

TEST(LLMScripted, MaxTokensIsClippedToTheContext) {
  Harness h(5, {5, 6, 7}, /*max_model_len=*/8);
  auto out = h.llm->generate({std::vector<int32_t>{1, 1, 1, 1, 1}}, greedy(100), false)[0];
  EXPECT_EQ(out.token_ids.size(), 3u);  // 5 + 3 = max_model_len
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  for (const auto& c : h.executor->calls) {
    EXPECT_LE(c.total, 8);
    EXPECT_LE(c.blocks, 2);  // 8 tokens in blocks of 4
  }
}

TEST(LLMScripted, PromptFillingTheContextStillGetsOneToken) {
  // As vLLM: the last prompt position's logits give one token, then the length limit ends it.
  Harness h(8, {5}, /*max_model_len=*/8);
  auto out = h.llm->generate({std::vector<int32_t>(8, 1)}, greedy(10), false)[0];
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5}));
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
}

TEST(LLMScripted, PromptLongerThanTheContextIsAClearError) {
  Harness h(9, {5}, /*max_model_len=*/8);
  try {
    h.llm->generate({std::vector<int32_t>(9, 1)}, greedy(4), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("9 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("8 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_model_len"), std::string::npos) << msg;
  }
  EXPECT_TRUE(h.executor->calls.empty());
}

TEST(LLMScripted, EmptyPromptIsAClearError) {
  Harness h(0, {5});
  try {
    h.llm->generate({std::vector<int32_t>{}}, greedy(4), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
}

TEST(LLMScripted, ABadPromptInABatchRunsNothing) {
  Harness h(3, {5});
  try {
    h.llm->generate({kPrompt, std::vector<int32_t>{1, 99}}, greedy(4), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("prompt 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("99"), std::string::npos) << msg;
  }
  EXPECT_TRUE(h.executor->calls.empty());
  // The engine is still usable afterwards.
  EXPECT_EQ(h.llm->generate({kPrompt}, greedy(2), false)[0].token_ids.size(), 2u);
}

TEST(LLMScripted, InvalidParamsAndTextWithoutTokenizerAreErrors) {
  Harness h(3, {5});
  EXPECT_THROW(h.llm->generate({kPrompt}, greedy(0), false), Error);
  EXPECT_THROW(h.llm->generate({"hello"}, greedy(2), false), Error);
  auto p = greedy(2);
  p.stop = {"x"};  // stop strings need text
  EXPECT_THROW(h.llm->generate({kPrompt}, p, false), Error);
  p = greedy(2);
  p.stop_token_ids = {kVocab};
  EXPECT_THROW(h.llm->generate({kPrompt}, p, false), Error);
}

TEST(LLMScripted, OutputsComeBackInPromptOrder) {
  Harness h(3, {5, 6});
  auto outs = h.llm->generate({kPrompt, kPrompt, kPrompt}, greedy(2), false);
  ASSERT_EQ(outs.size(), 3u);
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_EQ(outs[i].index, i);
    EXPECT_EQ(outs[i].token_ids, (std::vector<int32_t>{5, 6}));
  }
}

TEST(LLMScripted, StreamingDeliversEveryTokenThenTheFinalOutput) {
  Harness h(3, {5, 6, kEos});
  std::vector<int32_t> streamed;
  int finished_events = 0;
  auto outs = h.llm->generate_stream({kPrompt}, greedy(10), [&](const StreamEvent& ev) {
    EXPECT_EQ(finished_events, 0) << "event after the finished one";
    streamed.insert(streamed.end(), ev.new_token_ids.begin(), ev.new_token_ids.end());
    if (ev.finished) {
      ++finished_events;
      ASSERT_NE(ev.output, nullptr);
      EXPECT_EQ(ev.output->token_ids, streamed);
    }
  });
  EXPECT_EQ(finished_events, 1);
  EXPECT_EQ(streamed, outs[0].token_ids);
}

TEST(LLMScripted, CancelAbortsAtTheNextStepKeepingTheTokensSoFar) {
  // Two requests; the flag is set from the callback after the third token of request 0 (as a
  // SIGINT handler would between steps): both finish with abort, their tokens so far kept,
  // each with one final event, and the engine takes new requests afterwards.
  Harness h(3, {5, 6, 7, 8, 9});
  std::atomic<bool> cancel{false};
  std::vector<int32_t> streamed0;
  int finished_events = 0;
  auto outs = h.llm->generate_stream(
      {kPrompt, kPrompt}, greedy(50),
      [&](const StreamEvent& ev) {
        if (ev.index == 0)
          streamed0.insert(streamed0.end(), ev.new_token_ids.begin(), ev.new_token_ids.end());
        if (streamed0.size() == 3) cancel = true;
        if (ev.finished) {
          ++finished_events;
          ASSERT_NE(ev.output, nullptr);
          EXPECT_EQ(ev.output->finish_reason, FinishReason::kAbort);
        }
      },
      StreamOptions{.cancel = &cancel});
  EXPECT_EQ(finished_events, 2);
  ASSERT_EQ(outs.size(), 2u);
  for (const RequestOutput& out : outs) {
    EXPECT_EQ(out.finish_reason, FinishReason::kAbort);
    EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5, 6, 7}));
  }
  // A flag already set aborts before any step: no tokens.
  auto none = h.llm->generate_stream(
      {kPrompt}, greedy(5), [](const StreamEvent&) {}, StreamOptions{.cancel = &cancel});
  EXPECT_EQ(none[0].finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(none[0].token_ids.empty());
  cancel = false;
  auto again = h.llm->generate_stream(
      {kPrompt}, greedy(2), [](const StreamEvent&) {}, StreamOptions{.cancel = &cancel});
  EXPECT_EQ(again[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(again[0].token_ids, (std::vector<int32_t>{5, 6}));
}

TEST(LLMScripted, LogprobsOnePerToken) {
  Harness h(3, {5, 6});
  auto p = greedy(3);
  p.logprobs = 2;
  auto out = h.llm->generate({kPrompt}, p, false)[0];
  ASSERT_EQ(out.logprobs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out.logprobs[i].token, out.token_ids[i]);
    EXPECT_EQ(out.logprobs[i].rank, 1);
    EXPECT_EQ(out.logprobs[i].top.size(), 2u);
    // 10 vs fifteen 0s: log(e^10 / (e^10 + 15)).
    EXPECT_NEAR(out.logprobs[i].logprob, 10.0 - std::log(std::exp(10.0) + 15.0), 1e-5);
  }
}

TEST(LLMScripted, PenaltiesSeeTheTokensGeneratedSoFar) {
  // Token 5 leads token 6 by 0.5; a frequency penalty of 1 per occurrence makes greedy alternate.
  auto fn = [](const StepInput&) {
    std::vector<float> l(kVocab, -5.0f);
    l[5] = 1.0f;
    l[6] = 0.5f;
    return l;
  };
  LLM llm(make_function_executor(kVocab, fn), nullptr, 64, std::vector<int64_t>{});
  auto p = greedy(5);
  p.frequency_penalty = 1.0;
  EXPECT_EQ(llm.generate({kPrompt}, p, false)[0].token_ids, (std::vector<int32_t>{5, 6, 5, 6, 5}));
  // repetition_penalty also counts the prompt: with 5 in the prompt, 6 wins from the start.
  p = greedy(1);
  p.repetition_penalty = 3.0;
  EXPECT_EQ(llm.generate({std::vector<int32_t>{5}}, p, false)[0].token_ids,
            (std::vector<int32_t>{6}));
}

// A fixed, flat-ish distribution: sampled runs depend on the seed only.
std::unique_ptr<LLM> flat_llm(uint64_t engine_seed) {
  auto fn = [](const StepInput& in) {
    std::vector<float> l(kVocab);
    for (int64_t i = 0; i < kVocab; ++i) l[i] = 0.1f * static_cast<float>(i % 5);
    return l;
  };
  return std::make_unique<LLM>(make_function_executor(kVocab, fn), nullptr, 256,
                               std::vector<int64_t>{}, engine_seed);
}

TEST(LLMScripted, SeedsReproduceRuns) {
  SamplingParams p;
  p.max_tokens = 32;
  p.seed = 7;
  auto a = flat_llm(0)->generate({kPrompt, kPrompt}, p, false);
  auto b = flat_llm(1)->generate({kPrompt}, p, false);
  EXPECT_EQ(a[0].token_ids, a[1].token_ids);  // same seed, same tokens
  EXPECT_EQ(a[0].token_ids, b[0].token_ids);  // whatever the engine seed
  p.seed = 8;
  EXPECT_NE(flat_llm(0)->generate({kPrompt}, p, false)[0].token_ids, a[0].token_ids);
  // Without a request seed: the engine seed makes the run reproducible, requests still differ.
  p.seed.reset();
  auto c = flat_llm(3)->generate({kPrompt, kPrompt}, p, false);
  auto d = flat_llm(3)->generate({kPrompt, kPrompt}, p, false);
  EXPECT_EQ(c[0].token_ids, d[0].token_ids);
  EXPECT_EQ(c[1].token_ids, d[1].token_ids);
  EXPECT_NE(c[0].token_ids, c[1].token_ids);
}

}  // namespace
}  // namespace longctx
