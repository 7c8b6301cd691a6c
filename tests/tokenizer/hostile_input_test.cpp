// Hostile tokenizer files (issue 15): nested Sequences, huge ids and catastrophic regexes end in
// an Error naming the problem, not a stack overflow, a huge allocation or an internal error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"
#include "tokenizer/byte_level.h"

namespace longctx {
namespace {

using nlohmann::json;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// A byte-level BPE over the 256 byte tokens, with the given pre-tokenizer.
json byte_tokenizer(const json& pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer::byte_level_encode(std::string(1, char(b)))] = b;
  return {{"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"post_processor", nullptr},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
          {"added_tokens", json::array()}};
}

const json kByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};

std::string load_error(const std::string& text) {
  try {
    Tokenizer::from_json(text, "hostile.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

// Sequence(Sequence(...(ByteLevel))) `depth` levels deep, written as text: building it as a
// json value and dumping it would recurse `depth` times in the test itself.
std::string nested_sequence(int depth) {
  std::string head, tail;
  for (int i = 0; i < depth; ++i) {
    head += "{\"type\": \"Sequence\", \"pretokenizers\": [";
    tail += "]}";
  }
  return head + kByteLevel.dump() + tail;
}

std::string with_pre_tokenizer(const std::string& pre) {
  std::string text = byte_tokenizer(nullptr).dump();
  const std::string key = "\"pre_tokenizer\":null";
  size_t at = text.find(key);
  EXPECT_NE(at, std::string::npos);
  return text.replace(at, key.size(), "\"pre_tokenizer\":" + pre);
}

TEST(TokenizerHostile, NestedSequences) {
  EXPECT_EQ(load_error(with_pre_tokenizer(nested_sequence(3))), "");
  EXPECT_CONTAINS(load_error(with_pre_tokenizer(nested_sequence(20))),
                  "Sequences nested deeper than 16 levels");
  EXPECT_CONTAINS(load_error(with_pre_tokenizer(nested_sequence(100000))),
                  "hostile.json: JSON nested deeper than");
  // The other component kinds have the same limit.
  json j = byte_tokenizer(kByteLevel);
  json dec = {{"type", "ByteLevel"}};
  for (int i = 0; i < 20; ++i) dec = {{"type", "Sequence"}, {"decoders", json::array({dec})}};
  j["decoder"] = dec;
  EXPECT_CONTAINS(load_error(j.dump()), "Sequences nested deeper than");
  j = byte_tokenizer(kByteLevel);
  json norm = {{"type", "NFC"}};
  for (int i = 0; i < 20; ++i) norm = {{"type", "Sequence"}, {"normalizers", json::array({norm})}};
  j["normalizer"] = norm;
  EXPECT_CONTAINS(load_error(j.dump()), "Sequences nested deeper than");
  j = byte_tokenizer(kByteLevel);
  json post = {{"type", "ByteLevel"}};
  for (int i = 0; i < 20; ++i) post = {{"type", "Sequence"}, {"processors", json::array({post})}};
  j["post_processor"] = post;
  EXPECT_CONTAINS(load_error(j.dump()), "Sequences nested deeper than");
}

TEST(TokenizerHostile, IdsFarPastTheTokenCount) {
  json j = byte_tokenizer(kByteLevel);
  j["model"]["vocab"]["far"] = (1 << 30) - 1;
  EXPECT_CONTAINS(load_error(j.dump()), "model.vocab[\"far\"] id 1073741823 is out of range");
  j = byte_tokenizer(kByteLevel);
  j["added_tokens"] = json::array({{{"id", 1 << 29}, {"content", "<x>"}, {"special", true}}});
  EXPECT_CONTAINS(load_error(j.dump()), "added_tokens[0] id 536870912 is out of range");
  // Added tokens numbered right after the vocabulary, with a moderate gap, are fine.
  j["added_tokens"] = json::array({{{"id", 1000}, {"content", "<x>"}, {"special", true}}});
  EXPECT_EQ(load_error(j.dump()), "");
}

TEST(TokenizerHostile, RegexMatchLimitIsAClearError) {
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", "(a|aa)+$"}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json j =
      byte_tokenizer({{"type", "Sequence"}, {"pretokenizers", json::array({split, kByteLevel})}});
  Tokenizer t = Tokenizer::from_json(j.dump(), "backtrack.json");
  try {
    t.encode(std::string(40, 'a') + "!");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_CONTAINS(e.what(), "regex gave up on a 41-byte piece of text");
    EXPECT_CONTAINS(e.what(), "backtracks too much");
  }
}

}  // namespace
}  // namespace longctx
