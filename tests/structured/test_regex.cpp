// Regular expressions -> grammar: full matches against std::regex_match (ECMAScript) and JSON
// Schema `pattern` (unanchored, inside a JSON string) against std::regex_search, over random
// strings and over strings drawn from the grammar; UTF-8 for `.` and classes; per-token masks
// against brute force; choices; the refusal of unsupported constructs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

#include "longctx/core/error.h"
#include "structured/json_schema.h"
#include "structured/regex.h"
#include "structured/token_mask.h"

namespace longctx::structured {
namespace {

const char* kPatterns[] = {
    "abc",
    "a|b|cd",
    "a*",
    "(ab)+",
    "a?b?c?",
    "[a-c]+x",
    "[^a]b",
    "\\d{2,3}",
    "\\w+@\\w+\\.com",
    "(a|b)*abb",
    "(?:ab|a)(?:bc|c)?",
    "x{3}",
    "x{2,}",
    "(a*)*b",
    "(a?b?)*c",
    "[\\d_]+",
    "\\s*",
    ".+",
    "a.c",
    "[-a]+",
    "[a-]",
    "\\.\\*\\+",
    "^ab$",
    "^a|b$",
    "(|a)+",
    "()",
    "a{0}",
    "a{0,2}b",
    "[\\]]",
    "\\x41\\u0042",
    "\\D\\W\\S",
    "[^\\d\\s]*",

    "(a|ab)(c|bcd)",
    "[\\w.-]+",
    "((a|b){1,3}c){2}",
    "\\\\",

};

// Bytes random strings are made of: the patterns' characters and a few others.
const std::string kAlphabet = "abcdx01_ .@\n-*+]ABe\\\t,";

std::string random_string(std::mt19937& rng, size_t max_len) {
  std::string s(rng() % (max_len + 1), ' ');
  for (char& c : s) c = kAlphabet[rng() % kAlphabet.size()];
  return s;
}

// A string the grammar accepts: random live bytes (ASCII), every other step one that brings
// the end closest, so the walk always finishes.
std::string random_document(const Grammar& g, std::mt19937& rng) {
  GrammarState s = g.initial();
  std::string out;
  for (int step = 0; step < 200; ++step) {
    if (g.accepting(s) && (rng() % 3 == 0 || g.terminated(s))) return out;
    std::vector<std::pair<int32_t, uint8_t>> live;  // (distance after, byte)
    for (int b = 1; b < 128; ++b) {
      const GrammarState n = g.advance(s, static_cast<uint8_t>(b));
      if (!n.dead()) live.emplace_back(g.distance(n), static_cast<uint8_t>(b));
    }
    if (live.empty()) break;
    uint8_t b = live[rng() % live.size()].second;
    if (step >= 8 || rng() % 2 == 0) b = std::min_element(live.begin(), live.end())->second;
    out.push_back(static_cast<char>(b));
    s = g.advance(s, b);
  }
  EXPECT_TRUE(g.accepting(s)) << out;
  return out;
}

TEST(RegexGrammar, FullMatchAgreesWithStdRegex) {
  std::mt19937 rng(5);
  int positives = 0;
  for (const char* p : kPatterns) {
    SCOPED_TRACE(p);
    const std::regex re(p, std::regex::ECMAScript);
    const Grammar g = regex_grammar(p);
    for (int i = 0; i < 400; ++i) {
      const std::string s = random_string(rng, 8);
      ASSERT_EQ(g.matches(s), std::regex_match(s, re)) << "'" << s << "'";
    }
    for (int i = 0; i < 60; ++i) {
      const std::string s = random_document(g, rng);
      ASSERT_TRUE(g.matches(s));
      ASSERT_TRUE(std::regex_match(s, re)) << "grammar produced '" << s << "'";
      ++positives;
    }
  }
  EXPECT_GT(positives, 1000);
}

TEST(RegexGrammar, SchemaPatternIsASearchInsideAJsonString) {
  std::mt19937 rng(6);
  for (const char* p : kPatterns) {
    SCOPED_TRACE(p);
    const std::regex re(p, std::regex::ECMAScript);
    const Grammar g = json_schema_grammar({{"type", "string"}, {"pattern", p}});
    for (int i = 0; i < 300; ++i) {
      const std::string s = random_string(rng, 8);
      // nlohmann writes the escapes the grammar generates (\" \\ \n \t, \u00XX otherwise).
      const std::string doc = nlohmann::json(s).dump();
      ASSERT_EQ(g.matches(doc), std::regex_search(s, re)) << doc;
    }
    for (int i = 0; i < 40; ++i) {
      const std::string doc = random_document(g, rng);
      const std::string s = nlohmann::json::parse(doc).get<std::string>();
      ASSERT_TRUE(std::regex_search(s, re)) << "grammar produced " << doc;
    }
  }
}

TEST(RegexGrammar, AnchorsPerAlternativeInSearchMode) {
  const Grammar g = json_schema_grammar({{"type", "string"}, {"pattern", "^ab|cd$"}});
  EXPECT_TRUE(g.matches("\"abzz\""));
  EXPECT_TRUE(g.matches("\"zzcd\""));
  EXPECT_FALSE(g.matches("\"zab\""));
  EXPECT_FALSE(g.matches("\"cdz\""));
  const Grammar exact = json_schema_grammar({{"type", "string"}, {"pattern", "^[0-9]{3}$"}});
  EXPECT_TRUE(exact.matches("\"123\""));
  EXPECT_FALSE(exact.matches("\"1234\""));
  // Characters JSON must escape are generated escaped, and only so.
  const Grammar quote = json_schema_grammar({{"type", "string"}, {"pattern", "^\"\\\\\\n$"}});
  EXPECT_TRUE(quote.matches(R"("\"\\\n")"));
  EXPECT_FALSE(quote.matches("\"\"\\\n\""));
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

TEST(RegexGrammar, DotAndClassesMatchCodePoints) {
  // Every code point against three sets, in steps that hit each UTF-8 length and boundary.
  const Grammar dot = regex_grammar(".");
  const Grammar cls = regex_grammar("[\\u00e0-\\u00ff\\u4e00-\\u9fff\\u0100]");
  const Grammar neg = regex_grammar("[^\\u0800-\\uffff]");
  std::vector<uint32_t> cps;
  for (uint32_t cp = 0; cp <= 0x10ffff; cp += cp < 0x1000 ? 1 : 61) cps.push_back(cp);
  for (uint32_t cp : {0x7fu, 0x80u, 0x7ffu, 0x800u, 0xd7ffu, 0xe000u, 0xffffu, 0x10000u, 0x10ffffu,
                      0x4e00u, 0x9fffu, 0xa000u, 0x2028u, 0x2029u})
    cps.push_back(cp);
  for (uint32_t cp : cps) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const std::string s = utf8(cp);
    const bool line_end = cp == '\n' || cp == '\r' || cp == 0x2028 || cp == 0x2029;
    ASSERT_EQ(dot.matches(s), !line_end) << std::hex << cp;
    const bool in = (cp >= 0xe0 && cp <= 0xff) || (cp >= 0x4e00 && cp <= 0x9fff) || cp == 0x100;
    ASSERT_EQ(cls.matches(s), in) << std::hex << cp;
    ASSERT_EQ(neg.matches(s), cp < 0x800 || cp > 0xffff) << std::hex << cp;
  }
  // Surrogates, overlongs and a cut sequence are no character.
  for (const char* bad : {"\xed\xa0\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xc3", "\xf4\x90\x80\x80"})
    EXPECT_FALSE(dot.matches(bad)) << bad;
  const Grammar two = regex_grammar("a.b");
  EXPECT_TRUE(
      two.matches("a\xc3\xa9"
                  "b"));
  EXPECT_TRUE(
      two.matches("a\xf0\x9f\x98\x80"
                  "b"));
  EXPECT_FALSE(
      two.matches("a\xc3\xa9\xc3\xa9"
                  "b"));
  EXPECT_TRUE(regex_grammar("[é-ü]+").matches("éü"));
}

TEST(RegexGrammar, NamedGroupsAreGroups) {
  const Grammar g = regex_grammar("(?<n>ab)+|c");
  EXPECT_TRUE(g.matches("abab"));
  EXPECT_TRUE(g.matches("c"));
  EXPECT_FALSE(g.matches("abc"));
}

TEST(RegexGrammar, ChoiceIsExactlyTheChoices) {
  const Grammar g = choice_grammar({"yes", "no", "not sure", ""});
  for (const char* s : {"yes", "no", "not sure", ""}) EXPECT_TRUE(g.matches(s)) << s;
  for (const char* s : {"ye", "yes ", "not", "No"}) EXPECT_FALSE(g.matches(s)) << s;
  EXPECT_THROW(choice_grammar({}), Error);
  // Thousands of choices sharing a prefix stay one reading (a trie), under the stack bound.
  std::vector<std::string> many;
  for (int i = 0; i < 3000; ++i) many.push_back("item-" + std::to_string(100000 + i));
  const Grammar big = choice_grammar(many);
  EXPECT_TRUE(big.matches("item-101234"));
  EXPECT_FALSE(big.matches("item-10123"));
  EXPECT_FALSE(big.matches("item-103000"));
}

TEST(RegexGrammar, UnsupportedConstructsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreference '\\1'"},
      {"(?<x>a)\\k<x>", "backreference '\\k'"},
      {"a(?=b)", "lookahead '(?='"},
      {"a(?!b)", "lookahead '(?!'"},
      {"(?<=a)b", "lookbehind '(?<='"},
      {"(?<!a)b", "lookbehind '(?<!'"},
      {"a+?", "lazy quantifier ('+?')"},
      {"a{2,3}?", "lazy quantifier ('{2,3}?')"},
      {"\\bword", "word boundary '\\b'"},
      {"a^b", "anchor '^'"},
      {"a$b", "anchor '$'"},
      {"(^a)", "anchor '^'"},
      {"\\p{L}", "Unicode property escape"},
      {"(?i)abc", "'(?i'"},
      {"a{1001}", "repetition count over 1000"},
      {"a{2,5000}", "repetition count over 1000"},
      {"[^\\s\\S]", "matches no character"},
      {"\\012", "octal escape"},
      {std::string(101, '(') + "a" + std::string(101, ')'), "nesting deeper than 100"},
  };
  for (const auto& [p, needle] : cases) {
    try {
      regex_grammar(p);
      ADD_FAILURE() << p << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << p << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << p << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("at offset"), std::string::npos) << e.what();
    }
  }
  for (const char* p : {"(ab", "ab)", "[ab", "*a", "a**", "a{2", "a{3,1}", "[z-a]", "\\", "\\q",
                        "\\xZZ", "a{,3}", "a{2}{3}", "a?*"}) {
    try {
      regex_grammar(p);
      ADD_FAILURE() << p << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << p << ": " << e.what();
    }
  }
  // A schema's pattern error names the keyword and where it is.
  try {
    json_schema_grammar(nlohmann::ordered_json::parse(
        R"j({"type":"object","properties":{"id":{"type":"string","pattern":"a(?=b)"}}})j"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'pattern' (at #/properties/id)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("lookahead"), std::string::npos) << e.what();
  }
  EXPECT_THROW(json_schema_grammar({{"type", "string"}, {"pattern", "a"}, {"maxLength", 3}}),
               Error);
}

// Masks of regex grammars against brute force: a token is allowed exactly when the prefix with
// it extends to a string std::regex_match accepts (all of them enumerated: finite patterns over
// a small alphabet).
TEST(RegexGrammar, MasksMatchBruteForce) {
  const std::string alphabet = "abcx1-";
  std::mt19937 rng(9);
  int states = 0;
  for (const char* p :
       {"(ab|c){1,2}x?", "[a-c]{2}-?1?", "a?b?c?x", "(a|b)(a|b)?-[c1]", "(?:x|ab){0,3}"}) {
    SCOPED_TRACE(p);
    const std::regex re(p, std::regex::ECMAScript);
    std::set<std::string> complete, prefixes;
    std::vector<std::string> all{""};
    for (size_t len = 0; len <= 6; ++len) {
      std::vector<std::string> next;
      for (const std::string& s : all) {
        if (std::regex_match(s, re)) complete.insert(s);
        if (len < 6)
          for (char c : alphabet) next.push_back(s + c);
      }
      if (len < 6) all = std::move(next);
    }
    for (const std::string& d : complete)
      for (size_t k = 0; k <= d.size(); ++k) prefixes.insert(d.substr(0, k));
    std::vector<std::string> tokens;
    for (int b = 0; b < 128; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (int i = 0; i < 120; ++i) {
      std::string t(2 + rng() % 3, ' ');
      for (char& c : t) c = alphabet[rng() % alphabet.size()];
      tokens.push_back(t);
    }
    const auto eos = static_cast<int32_t>(tokens.size());
    tokens.emplace_back();
    auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{eos},
                                                   static_cast<int64_t>(tokens.size()));
    auto compiled = std::make_shared<CompiledGrammar>(regex_grammar(p), vocab);
    std::vector<uint32_t> words(vocab->mask_words());
    for (const std::string& prefix : prefixes) {
      GrammarMatcher m(compiled);
      for (unsigned char c : prefix) ASSERT_TRUE(m.accept(c));
      m.fill_mask(1 << 20, words);
      for (int32_t t = 0; t <= eos; ++t) {
        const bool allowed = (words[t >> 5] >> (t & 31)) & 1;
        const bool expect =
            t == eos ? complete.count(prefix) > 0 : prefixes.count(prefix + tokens[t]) > 0;
        ASSERT_EQ(allowed, expect) << "after '" << prefix << "' token '" << tokens[t] << "'";
      }
      ++states;
    }
  }
  EXPECT_GT(states, 40);
}

}  // namespace
}  // namespace longctx::structured
