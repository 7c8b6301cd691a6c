// Text through the engine with the real Qwen3 tokenizer and scripted logits: stop strings split
// across tokens are never emitted, streamed pieces are always whole UTF-8 characters, and the
// stream adds up to the final text.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "longctx/engine/executor.h"
#include "longctx/llm.h"
#include "longctx/tokenizer/tokenizer.h"

namespace longctx {
namespace {

std::string qwen3_dir() { return testing::fetched_data_dir() + "/tokenizers/qwen3"; }

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

class LLMText : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(qwen3_dir() + "/tokenizer.json"))
        << "no " << qwen3_dir() << " (run tools/fetch_test_data.sh)";
    // Loaded once for the suite: parsing the 11 MB tokenizer.json takes a while.
    static const auto shared = std::make_shared<const Tokenizer>(Tokenizer::load(qwen3_dir()));
    tokenizer_ = shared;
  }

  // An engine whose model "says" `script` token by token (greedy), then EOS-free repeats of
  // its last token.
  std::unique_ptr<LLM> scripted(std::vector<int32_t> script, size_t prompt_len,
                                std::vector<int64_t> eos = {}) {
    const auto vocab = static_cast<int64_t>(tokenizer_->vocab_size());
    auto fn = [script, prompt_len, vocab](const StepInput& in) {
      std::vector<float> l(vocab, 0.0f);
      const size_t step = in.all_tokens.size() - prompt_len;
      l[script[std::min(step, script.size() - 1)]] = 10.0f;
      return l;
    };
    return std::make_unique<LLM>(make_function_executor(vocab, fn), tokenizer_, 4096,
                                 std::move(eos));
  }

  struct Run {
    RequestOutput out;
    std::vector<std::string> pieces;
    std::string streamed;
  };
  Run run(LLM& llm, const SamplingParams& sp) {
    Run r;
    auto outs = llm.generate_stream({std::vector<int32_t>{9707}}, sp, [&](const StreamEvent& ev) {
      r.pieces.emplace_back(ev.text);
      r.streamed += ev.text;
    });
    r.out = std::move(outs[0]);
    return r;
  }

  std::shared_ptr<const Tokenizer> tokenizer_;
};

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  return sp;
}

TEST_F(LLMText, StopStringSplitAcrossTokensIsNeverEmitted) {
  const std::string text = "The answer is forty-two. Done here.";
  auto ids = tokenizer_->encode(text);
  const std::string stop = "two. Do";
  // Precondition: no single token holds the stop string (it must span tokens).
  for (int32_t id : ids) {
    ASSERT_EQ(std::string(tokenizer_->token_bytes(id)).find(stop), std::string::npos);
  }
  auto llm = scripted(ids, 1);
  auto sp = greedy(100);
  sp.stop = {stop};
  Run r = run(*llm, sp);
  EXPECT_EQ(r.out.text, "The answer is forty-");
  EXPECT_EQ(r.streamed, r.out.text);
  EXPECT_EQ(r.out.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.out.stop_reason.kind, StopReason::Kind::kStopString);
  EXPECT_EQ(r.out.stop_reason.text, stop);
  // Generation ended at the token completing the stop string.
  const std::string upto = tokenizer_->decode(r.out.token_ids);
  EXPECT_NE(upto.find(stop), std::string::npos);
  EXPECT_EQ(
      tokenizer_
          ->decode(std::span<const int32_t>(r.out.token_ids).first(r.out.token_ids.size() - 1))
          .find(stop),
      std::string::npos);
}

TEST_F(LLMText, PartialStopIsReleasedWhenItDoesNotComplete) {
  const std::string text = "abc dex abc def";
  auto ids = tokenizer_->encode(text);
  auto llm = scripted(ids, 1);
  auto sp = greedy(static_cast<int64_t>(ids.size()));
  sp.stop = {"c def"};
  Run r = run(*llm, sp);
  EXPECT_EQ(r.out.text, "abc dex ab");
  EXPECT_EQ(r.streamed, r.out.text);
  // Without the stop string the whole text comes out, also the held-back tail at max_tokens.
  sp.stop = {"c defg"};
  Run r2 = run(*llm, sp);
  EXPECT_EQ(r2.out.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r2.out.text, text);
  EXPECT_EQ(r2.streamed, text);
}

TEST_F(LLMText, StreamedPiecesAreWholeUtf8Characters) {
  const std::string text = "llama 🦙 and clef 𝄞, 漢字 ok";
  auto ids = tokenizer_->encode(text);
  // Precondition: some token holds only part of a character.
  bool split = false;
  for (int32_t id : ids) split = split || !valid_utf8(tokenizer_->token_bytes(id));
  ASSERT_TRUE(split) << "pick text whose characters span tokens";
  auto llm = scripted(ids, 1);
  Run r = run(*llm, greedy(static_cast<int64_t>(ids.size())));
  for (const auto& p : r.pieces) EXPECT_TRUE(valid_utf8(p)) << "broken piece";
  EXPECT_EQ(r.streamed, text);
  EXPECT_EQ(r.out.text, text);
}

TEST_F(LLMText, MultibyteStopStringSplitAcrossTokens) {
  const std::string text = "before 🦙 after";
  auto ids = tokenizer_->encode(text);
  auto llm = scripted(ids, 1);
  auto sp = greedy(100);
  sp.stop = {"🦙"};
  Run r = run(*llm, sp);
  EXPECT_EQ(r.out.text, "before ");
  EXPECT_EQ(r.streamed, "before ");
  for (const auto& p : r.pieces) EXPECT_TRUE(valid_utf8(p));
}

TEST_F(LLMText, EosTextIsNotInTheOutput) {
  auto eos = tokenizer_->token_to_id("<|im_end|>");
  ASSERT_TRUE(eos);
  auto ids = tokenizer_->encode("Hi there");
  ids.push_back(*eos);
  auto llm = scripted(ids, 1, {*eos});
  auto sp = greedy(50);
  sp.skip_special_tokens = false;  // even when special tokens would be printed
  Run r = run(*llm, sp);
  EXPECT_EQ(r.out.text, "Hi there");
  EXPECT_EQ(r.out.token_ids.back(), *eos);
  EXPECT_EQ(r.out.stop_reason.kind, StopReason::Kind::kEos);
}

TEST_F(LLMText, TextPromptsAreEncodedAndEmptyTextIsAnError) {
  auto llm = scripted({tokenizer_->encode("x")[0]}, 2);
  auto outs = llm->generate({"Hello world"}, greedy(1), false);
  EXPECT_EQ(outs[0].prompt_token_ids, tokenizer_->encode("Hello world", true));
  // Qwen3 adds no BOS, so empty text is an empty prompt: a clear error, as in vLLM.
  EXPECT_THROW(llm->generate({""}, greedy(1), false), Error);
}

}  // namespace
}  // namespace longctx
