// The real Qwen3 and Llama-3 tokenizer files against encodings made by Hugging Face tokenizers.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace longctx {
namespace {

class RealTokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizerTest, MatchesFixtureIdsAndDecode) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  nlohmann::json fx = testing::load_fixture(GetParam());
  ASSERT_GE(fx["cases"].size(), 10u);
  for (const auto& c : fx["cases"]) {
    std::string text = c["text"];
    auto ids = c["ids"].get<std::vector<TokenId>>();
    auto ids_special = c["ids_with_special"].get<std::vector<TokenId>>();
    EXPECT_EQ(tok->encode(text, false), ids) << "text: " << text;
    EXPECT_EQ(tok->encode(text, true), ids_special) << "text: " << text;
    EXPECT_EQ(tok->decode(ids, false), c["decoded"].get<std::string>()) << "text: " << text;
  }
}

TEST_P(RealTokenizerTest, IncrementalDetokenizationMatchesDecode) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  nlohmann::json fx = testing::load_fixture(GetParam());
  for (bool skip : {false, true}) {
    for (const auto& c : fx["cases"]) {
      auto ids = c["ids_with_special"].get<std::vector<TokenId>>();
      IncrementalDetokenizer detok(*tok, skip);
      std::string stream;
      for (TokenId id : ids) {
        std::string chunk = detok.push(id);
        EXPECT_TRUE(testing::utf8_valid(chunk)) << "broken UTF-8 chunk for id " << id;
        stream += chunk;
      }
      std::string rest = detok.flush();
      EXPECT_TRUE(testing::utf8_valid(rest));
      stream += rest;
      EXPECT_EQ(stream, tok->decode(ids, skip)) << "text: " << c["text"].get<std::string>();
    }
  }
}

TEST_P(RealTokenizerTest, SkipSpecialTokensDropsThem) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  std::string marker = GetParam() == "qwen3" ? "<|im_start|>" : "<|begin_of_text|>";
  auto ids = tok->encode(marker + "hi" + marker + " there", true);
  ASSERT_TRUE(tok->token_to_id(marker).has_value());
  EXPECT_TRUE(tok->is_special(*tok->token_to_id(marker)));
  std::string with = tok->decode(ids, false);
  EXPECT_NE(with.find(marker), std::string::npos);
  EXPECT_EQ(tok->decode(ids, true), "hi there");
}

TEST_P(RealTokenizerTest, EmptyInput) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  EXPECT_TRUE(tok->encode("", false).empty());
  auto with = tok->encode("", true);
  if (GetParam() == "llama3") {
    EXPECT_EQ(with, std::vector<TokenId>{128000});
  } else {
    EXPECT_TRUE(with.empty());
  }
  EXPECT_EQ(tok->decode(std::vector<TokenId>{}), "");
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.flush(), "");
}

TEST_P(RealTokenizerTest, EmojiAndCjkSplitAcrossTokensAreHeldBack) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  // Rare characters fall apart into byte tokens that are not valid UTF-8 on their own.
  std::string text = "x 🇺🇸😀👍🏽 鬱鬱 𠜎 ok";
  auto ids = tok->encode(text);
  ASSERT_EQ(tok->decode(ids), text);
  IncrementalDetokenizer detok(*tok);
  std::string stream;
  size_t held = 0;
  for (TokenId id : ids) {
    std::string_view bytes = tok->token_bytes(id);
    std::string chunk = detok.push(id);
    if (!testing::utf8_valid(std::string(bytes))) ++held;
    EXPECT_TRUE(testing::utf8_valid(chunk));
    stream += chunk;
  }
  EXPECT_GT(held, 0u) << "expected some token to hold part of a character";
  EXPECT_EQ(detok.pending_bytes(), 0u);
  stream += detok.flush();
  EXPECT_EQ(stream, text);
}

TEST_P(RealTokenizerTest, IncompleteCharacterDecodesToReplacement) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  // A character the vocabulary spells with several byte tokens.
  std::vector<TokenId> ids;
  for (const char* c : {"😀", "𠜎", "𓀀", "鬱", "🇺"}) {
    ids = tok->encode(c);
    if (ids.size() > 1) break;
  }
  ASSERT_GT(ids.size(), 1u);
  std::vector<TokenId> first(ids.begin(), ids.end() - 1);
  EXPECT_EQ(tok->decode(first), "\xEF\xBF\xBD");  // U+FFFD, like from_utf8_lossy
  IncrementalDetokenizer detok(*tok);
  std::string out;
  for (TokenId id : first) out += detok.push(id);
  EXPECT_EQ(out, "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
}

TEST_P(RealTokenizerTest, InvalidUtf8InputIsReplacedNotFatal) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  std::string bad = "ab\xFF\xFE cd \xE2\x82 \xC0\xAF end\xF0\x9F";
  std::string replaced =
      "ab\xEF\xBF\xBD\xEF\xBF\xBD cd \xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD end\xEF\xBF\xBD";
  EXPECT_EQ(tok->encode(bad), tok->encode(replaced));
  EXPECT_EQ(tok->decode(tok->encode(bad)), replaced);
}

TEST_P(RealTokenizerTest, NfcOrNotAsTheFileSays) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  std::string composed = "caf\xC3\xA9 \xC3\x85ngstr\xC3\xB6m";       // é, Å, ö precomposed
  std::string decomposed = "cafe\xCC\x81 A\xCC\x8Angstro\xCC\x88m";  // base + combining marks
  if (GetParam() == "qwen3") {                                       // normalizer NFC
    EXPECT_EQ(tok->encode(decomposed), tok->encode(composed));
  } else {  // no normalizer: the combining marks stay
    EXPECT_NE(tok->encode(decomposed), tok->encode(composed));
    EXPECT_EQ(tok->decode(tok->encode(decomposed)), decomposed);
  }
}

TEST_P(RealTokenizerTest, ConfigStringsAndIds) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  const TokenizerConfig& cfg = tok->config();
  EXPECT_FALSE(cfg.chat_template.empty());
  if (GetParam() == "llama3") {
    EXPECT_EQ(cfg.bos_token, "<|begin_of_text|>");
    EXPECT_EQ(tok->bos_token_id(), 128000);
    EXPECT_EQ(cfg.eos_token, "<|eot_id|>");
    EXPECT_EQ(tok->eos_token_id(), 128009);
    EXPECT_EQ(tok->vocab_size(), 128256u);
  } else {
    EXPECT_EQ(cfg.bos_token, "");
    EXPECT_FALSE(tok->bos_token_id().has_value());
    EXPECT_EQ(cfg.eos_token, "<|im_end|>");
    EXPECT_EQ(tok->eos_token_id(), 151645);
    EXPECT_EQ(tok->vocab_size(), 151669u);
  }
  EXPECT_THROW(tok->decode(std::vector<TokenId>{-1}), Error);
  EXPECT_THROW(tok->decode(std::vector<TokenId>{static_cast<TokenId>(tok->vocab_size())}), Error);
}

TEST_P(RealTokenizerTest, LongAndRepetitiveInputs) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  // Long single pre-tokens take the heap merge path; the round trip must hold.
  std::string texts[] = {std::string(5000, 'a'), std::string(3000, ' ') + "x",
                         std::string(2000, '=') + "\n", "0123456789" + std::string(300, '9')};
  for (const std::string& t : texts) {
    auto ids = tok->encode(t);
    EXPECT_EQ(tok->decode(ids), t);
    EXPECT_EQ(tok->encode(t), ids);  // second call goes through the cache
  }
}

TEST_P(RealTokenizerTest, ConcurrentEncodeSharesTheCacheSafely) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  nlohmann::json fx = testing::load_fixture(GetParam());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (const auto& c : fx["cases"])
          if (tok->encode(c["text"].get<std::string>(), true) !=
              c["ids_with_special"].get<std::vector<TokenId>>())
            ++mismatches[t];
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST_P(RealTokenizerTest, RandomTextRoundTripsAndRandomBytesDoNotCrash) {
  LONGCTX_REQUIRE_TOKENIZER(tok, GetParam());
  const char* pieces[] = {"a",
                          "Z",
                          " ",
                          "  ",
                          "\n",
                          "\r\n",
                          "\t",
                          "7",
                          "42",
                          "'s",
                          "'LL",
                          "é",
                          "e\xCC\x81",
                          "ß",
                          "中",
                          "文",
                          "😀",
                          "🏽",
                          "\xE2\x80\xA8",
                          "\xC2\xA0",
                          "<|im_end|>",
                          "<|eot_id|>",
                          "<|begin_of_text|>",
                          "ﬁ",
                          "Å",
                          "\xEA\xB0\x80",
                          "\xE1\x84\x80",
                          "\xE1\x85\xA1",
                          "-",
                          "...",
                          "{",
                          "}"};
  const char* bad[] = {"\xFF", "\xC3", "\xE2\x82", "\xF0\x9F\x98", "\x80", "\xED\xA0\x80"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    int n = 1 + rng() % 40;
    for (int k = 0; k < n; ++k) text += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    std::string expected = GetParam() == "qwen3" ? tokenizer::unicode::nfc(text) : text;
    ASSERT_EQ(tok->decode(tok->encode(text)), expected) << text;
    std::string broken = text;
    broken.insert(rng() % (broken.size() + 1), bad[rng() % 6]);
    auto ids = tok->encode(broken, true);  // must not crash; output is valid UTF-8
    EXPECT_TRUE(testing::utf8_valid(tok->decode(ids)));
  }
}

INSTANTIATE_TEST_SUITE_P(Real, RealTokenizerTest, ::testing::Values("qwen3", "llama3"));

}  // namespace
}  // namespace longctx
