// A small byte-level BPE tokenizer written in the test, exercising added-token flags, the GPT-2
// ByteLevel regex, add_prefix_space, ignore_merges and TemplateProcessing; and malformed files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"
#include "tokenizer/byte_level.h"

namespace longctx {
namespace {

using nlohmann::json;

json toy_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s(1, static_cast<char>(b));
    vocab[tokenizer::byte_level_encode(s)] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab
      ["\xC4\xA0"
       "a"] = 258;     // "Ġa"
  vocab["xyz"] = 259;  // no merge produces it
  json j;
  j["version"] = "1.0";
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["post_processor"] = nullptr;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"ignore_merges", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", json::array({"a b", "ab c", "\xC4\xA0 a"})}};
  auto added = [](int id, const char* content, bool lstrip, bool rstrip, bool single_word,
                  bool special) {
    return json{{"id", id},          {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", false},
                {"special", special}};
  };
  j["added_tokens"] = json::array({added(300, "<x>", true, false, false, true),
                                   added(301, "<y>", false, true, false, false),
                                   added(302, "<z>", false, false, true, false),
                                   added(303, "<xx>", false, false, false, true)});
  return j;
}

Tokenizer toy(const json& j) { return Tokenizer::from_json(j.dump(), "toy.json"); }

using Ids = std::vector<TokenId>;

TEST(ToyTokenizer, MergesByRankAndGpt2Regex) {
  Tokenizer t = toy(toy_json());
  EXPECT_EQ(t.encode("ab c"), (Ids{256, 32, 99}));
  EXPECT_EQ(t.encode("abc"), (Ids{257}));
  EXPECT_EQ(t.encode(" a"), (Ids{258}));
  EXPECT_EQ(t.encode("xyz"), (Ids{120, 121, 122}));
  EXPECT_EQ(t.decode(t.encode("ab c \n\t x")), "ab c \n\t x");
  EXPECT_EQ(t.id_to_token(258),
            "\xC4\xA0"
            "a");
}

TEST(ToyTokenizer, AddedTokenFlags) {
  Tokenizer t = toy(toy_json());
  // lstrip: the space before <x> is absorbed by it.
  EXPECT_EQ(t.encode(" a <x> b"), (Ids{258, 300, 32, 98}));
  // rstrip: the spaces after <y> are absorbed.
  EXPECT_EQ(t.encode("a<y>  b"), (Ids{97, 301, 98}));
  // single_word: <z> inside a word is plain text, between spaces it is the token.
  EXPECT_EQ(t.encode("a<z>b"), (Ids{97, 60, 122, 62, 98}));
  EXPECT_EQ(t.encode(" <z> "), (Ids{32, 302, 32}));
  // Leftmost-longest: <xx> wins over <x> at the same start.
  EXPECT_EQ(t.encode("<xx>"), (Ids{303}));
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(301));
  EXPECT_EQ(t.decode(Ids{97, 300, 301, 98}, false), "a<x><y>b");
  EXPECT_EQ(t.decode(Ids{97, 300, 301, 98}, true), "a<y>b");
}

TEST(ToyTokenizer, AddPrefixSpaceAndIgnoreMerges) {
  json j = toy_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(toy(j).encode("ab"), (Ids{32, 256}));  // " ab": "a b" (rank 0) beats "Ġ a"
  j = toy_json();
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(toy(j).encode("xyz"), (Ids{259}));
  EXPECT_EQ(toy(j).encode("ab c"), (Ids{256, 32, 99}));
}

TEST(ToyTokenizer, TemplateProcessingAndSplitBehaviors) {
  json j = toy_json();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({json{{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}},
                              json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              json{{"SpecialToken", {{"id", "<xx>"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens",
       {{"<x>", {{"id", "<x>"}, {"ids", {300}}, {"tokens", {"<x>"}}}},
        {"<xx>", {{"id", "<xx>"}, {"ids", {303}}, {"tokens", {"<xx>"}}}}}}};
  Tokenizer t = toy(j);
  EXPECT_EQ(t.encode("abc", true), (Ids{300, 257, 303}));
  EXPECT_EQ(t.encode("abc", false), (Ids{257}));
  // Split on a literal with Removed drops the delimiter.
  j = toy_json();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {json{{"type", "Split"},
                 {"pattern", {{"String", "-"}}},
                 {"behavior", "Removed"},
                 {"invert", false}},
            json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  EXPECT_EQ(toy(j).encode("ab-c"), (Ids{256, 99}));
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  EXPECT_EQ(toy(j).encode("ab-c"), (Ids{256, 45, 99}));
}

// Malformed or unsupported files: the error names the problem.
void expect_error(const std::string& text, const std::string& needle) {
  try {
    Tokenizer::from_json(text, "bad.json");
    ADD_FAILURE() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "error \"" << e.what() << "\" does not mention " << needle;
  }
}

TEST(ToyTokenizer, MalformedAndUnsupportedFiles) {
  expect_error("{\"model\": ", "malformed JSON");
  expect_error("[1, 2]", "top level");
  json j = toy_json();
  j.erase("model");
  expect_error(j.dump(), "\"model\"");
  j = toy_json();
  j["model"].erase("merges");
  expect_error(j.dump(), "merges");
  j = toy_json();
  j["model"]["type"] = "WordPiece";
  expect_error(j.dump(), "WordPiece");
  j = toy_json();
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j.dump(), "NFKC");
  j = toy_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j.dump(), "Whitespace");
  j = toy_json();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "[a-"}}}, {"behavior", "Isolated"}};
  expect_error(j.dump(), "cannot compile regex");
  j = toy_json();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j.dump(), "WordPiece");
  j = toy_json();
  j["post_processor"] = {{"type", "Unknown"}};
  expect_error(j.dump(), "Unknown");
  j = toy_json();
  j["model"]["merges"].push_back("q zz");
  expect_error(j.dump(), "model.merges[3]");
  j = toy_json();
  j["model"]["vocab"]["bad"] = "seven";
  expect_error(j.dump(), "model.vocab[\"bad\"]");
  j = toy_json();
  j["added_tokens"][0].erase("content");
  expect_error(j.dump(), "added_tokens[0]");
}

TEST(ToyTokenizer, FilesAndFolders) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("longctx_tok_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_THROW(Tokenizer::load(dir.string()), Error);  // no tokenizer.json
  { std::ofstream(dir / "tokenizer.json") << "{ not json"; }
  try {
    Tokenizer::load(dir.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos) << e.what();
  }
  {
    std::ofstream(dir / "tokenizer.json") << toy_json().dump();
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"bos_token": {"content": "<x>"}, "eos_token": "<y>",
              "chat_template": [{"name": "tool_use", "template": "T"},
                                {"name": "default", "template": "D"}]})";
  }
  Tokenizer t = Tokenizer::load(dir.string());
  EXPECT_EQ(t.config().bos_token, "<x>");
  EXPECT_EQ(t.bos_token_id(), 300);
  EXPECT_EQ(t.eos_token_id(), 301);
  EXPECT_EQ(t.config().chat_template, "D");
  EXPECT_EQ(Tokenizer::from_file((dir / "tokenizer.json").string()).config().bos_token, "");
  fs::remove_all(dir);
  EXPECT_THROW(Tokenizer::from_file((dir / "tokenizer.json").string()), Error);
}

}  // namespace
}  // namespace longctx
