// The needle model's tokenizer (models/needle, written by tools/needle_model/bpe.py): the
// project's tokenizer must reproduce the ids transformers' reference run used for the prompt.
#include <gtest/gtest.h>

#include <fstream>

#include "tokenizer_test_util.h"

namespace longctx {
namespace {

TEST(NeedleTokenizer, EncodesTheReferencePromptLikeTransformers) {
  Tokenizer tok = Tokenizer::load(testing::test_data_dir() + "/../../models/needle");
  std::ifstream f(testing::test_data_dir() + "/needle/reference.json");
  ASSERT_TRUE(f.good());
  nlohmann::json ref = nlohmann::json::parse(f);
  const std::string text = ref.at("prompt_text");
  const auto ids = ref.at("input_ids").get<std::vector<TokenId>>();  // BOS + prompt
  ASSERT_EQ(tok.bos_token_id(), std::optional<TokenId>(2045));
  ASSERT_EQ(tok.eos_token_id(), std::optional<TokenId>(2046));
  EXPECT_EQ(tok.vocab_size(), 2048u);
  EXPECT_EQ(tok.encode(text, true), ids);
  EXPECT_EQ(tok.encode(text, false), std::vector<TokenId>(ids.begin() + 1, ids.end()));
  EXPECT_EQ(tok.decode(std::vector<TokenId>(ids.begin() + 1, ids.end())), text);
}

TEST(NeedleTokenizer, DigitsAreSingleTokens) {
  // The merge table has no digit merges: a 7-digit number is a space token and seven digits.
  Tokenizer tok = Tokenizer::load(testing::test_data_dir() + "/../../models/needle");
  std::vector<TokenId> ids = tok.encode(" is: 2739187.", false);
  ASSERT_EQ(ids.size(), 11u);  // " is", ":", " ", 7 digits, "."
  for (int i = 3; i < 10; ++i) EXPECT_EQ(tok.decode(std::vector<TokenId>{ids[i]}).size(), 1u);
}

}  // namespace
}  // namespace longctx
