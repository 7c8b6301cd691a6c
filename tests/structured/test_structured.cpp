// The grammar engine: JSON Schema -> grammar (against an independent validator and an
// enumeration of finite schemas' documents), per-token masks (against a brute-force check over
// small vocabularies), the max_tokens budget (random-logit walks over the needle tokenizer always
// end in a valid document) and the refusal of unsupported keywords.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "longctx/core/error.h"
#include "longctx/tokenizer/tokenizer.h"
#include "schema_oracle.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace longctx::structured {
namespace {

using testing::enumerate;
using testing::OJson;
using testing::validate;

OJson parse(const std::string& s) { return OJson::parse(s); }

Grammar grammar_of(const std::string& schema) { return json_schema_grammar(parse(schema)); }

// ---------- random schemas ----------

OJson random_finite_schema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  const int kind = depth <= 0 ? pick(4) : pick(7);
  switch (kind) {
    case 0: {
      OJson e = OJson::array();
      const int n = 1 + pick(3);
      for (int i = 0; i < n; ++i) {
        const int k = pick(3);
        if (k == 0) e.push_back(std::string(1 + pick(3), static_cast<char>('a' + pick(3))));
        if (k == 1) e.push_back(pick(200) - 100);
        if (k == 2) e.push_back(pick(2) == 0);
      }
      return {{"enum", e}};
    }
    case 1:
      return {{"type", "boolean"}};
    case 2: {
      const int lo = pick(250) - 125;
      return {{"type", "integer"}, {"minimum", lo}, {"maximum", lo + pick(12)}};
    }
    case 3:
      return {{"type", "null"}};
    case 4: {
      OJson props = OJson::object(), req = OJson::array();
      const int n = 1 + pick(3);
      for (int i = 0; i < n; ++i) {
        const std::string name = std::string(1, static_cast<char>('z' - i * 3 - pick(2)));
        props[name] = random_finite_schema(rng, depth - 1);
        if (pick(2)) req.push_back(name);
      }
      return {{"type", "object"}, {"properties", props}, {"required", req}};
    }
    case 5: {
      const int lo = pick(2);
      return {{"type", "array"},
              {"items", random_finite_schema(rng, depth - 1)},
              {"minItems", lo},
              {"maxItems", lo + pick(2)}};
    }
    default:
      return {{"anyOf", {random_finite_schema(rng, depth - 1), random_finite_schema(rng, 0)}}};
  }
}

// Schemas whose documents may be long: free strings, unbounded arrays and numbers, nesting.
OJson random_schema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  const int kind = depth <= 0 ? pick(6) : pick(10);
  switch (kind) {
    case 0: {
      OJson s = {{"type", "string"}};
      if (pick(2)) s["minLength"] = pick(4);
      if (pick(2)) s["maxLength"] = s.value("minLength", 0) + pick(8);
      return s;
    }
    case 1: {
      OJson s = {{"type", pick(2) ? "integer" : "number"}};
      if (pick(2)) s["minimum"] = pick(2000) - 1000;
      if (pick(2)) s["maximum"] = s.value("minimum", -1000) + pick(5000);
      return s;
    }
    case 2:
      return {{"type", "boolean"}};
    case 3:
      return {{"enum", {"red", "green", 3, nullptr}}};
    case 4:
      return {{"type", {"string", "null"}}};
    case 5:
      return {{"type", "number"}, {"exclusiveMinimum", -2.5}, {"exclusiveMaximum", 7}};
    case 6:
    case 7: {
      OJson props = OJson::object(), req = OJson::array();
      const int n = 1 + pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string name = "p" + std::to_string(i) + std::string(pick(3), 'x');
        props[name] = random_schema(rng, depth - 1);
        if (pick(3)) req.push_back(name);
      }
      OJson s = {{"type", "object"}, {"properties", props}, {"required", req}};
      if (pick(2)) s["additionalProperties"] = false;
      return s;
    }
    case 8: {
      OJson s = {{"type", "array"}, {"items", random_schema(rng, depth - 1)}};
      if (pick(2)) s["minItems"] = pick(3);
      if (pick(2)) s["maxItems"] = s.value("minItems", 0) + pick(4);
      return s;
    }
    default:
      return {{"anyOf", {random_schema(rng, depth - 1), random_schema(rng, depth - 1)}}};
  }
}

// ---------- grammar against the oracles ----------

TEST(JsonSchemaGrammar, FiniteSchemasAcceptExactlyTheirDocuments) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int round = 0; round < 60; ++round) {
    const OJson schema = random_finite_schema(rng, 2);
    const auto docs = enumerate(schema, schema);
    if (docs.size() > 5000) continue;
    const Grammar g = json_schema_grammar(schema);
    const std::set<std::string> all(docs.begin(), docs.end());
    for (const std::string& d : docs) {
      ASSERT_TRUE(g.matches(d)) << schema.dump() << " rejects " << d;
      ASSERT_TRUE(validate(schema, schema, OJson::parse(d))) << d;
    }
    // Near misses: every document with one byte changed, dropped or doubled.
    for (size_t i = 0; i < docs.size() && i < 200; ++i) {
      const std::string& d = docs[i];
      for (size_t k = 0; k < d.size(); ++k) {
        for (const std::string& m :
             {d.substr(0, k) + d.substr(k + 1), d.substr(0, k) + d[k] + d.substr(k),
              d.substr(0, k) + "1" + d.substr(k + 1)}) {
          ASSERT_EQ(g.matches(m), all.count(m) > 0) << schema.dump() << " on " << m;
        }
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 40);
}

TEST(JsonSchemaGrammar, IntegerRangesAreExact) {
  std::mt19937 rng(3);
  for (int round = 0; round < 80; ++round) {
    OJson s = {{"type", "integer"}};
    const int lo = static_cast<int>(rng() % 2400) - 1200;
    const int hi = lo + static_cast<int>(rng() % 1500);
    const int shape = round % 4;  // both bounds, minimum only, maximum only, exclusive
    if (shape == 0 || shape == 1) s["minimum"] = lo;
    if (shape == 0 || shape == 2) s["maximum"] = hi;
    if (shape == 3) {
      s["exclusiveMinimum"] = lo - 0.5;
      s["exclusiveMaximum"] = hi + 1;
    }
    const Grammar g = json_schema_grammar(s);
    for (int i = -1600; i <= 1600; ++i) {
      ASSERT_EQ(g.matches(std::to_string(i)), validate(s, s, OJson(i))) << s.dump() << " " << i;
    }
    for (const char* bad : {"-0", "01", "00", "-01", "+1", "1.0", ""}) {
      ASSERT_FALSE(g.matches(bad)) << s.dump() << " " << bad;
    }
  }
}

TEST(JsonSchemaGrammar, PropertiesInSchemaOrder) {
  const Grammar g = grammar_of(
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"boolean"}},
          "required":["b","a"]})");
  EXPECT_TRUE(g.matches(R"({"b":1,"a":true})"));
  EXPECT_FALSE(g.matches(R"({"a":true,"b":1})"));
  EXPECT_FALSE(g.matches(R"({"b":1})"));
  EXPECT_FALSE(g.matches(R"({"b":1,"a":true,"c":1})"));
}

TEST(JsonSchemaGrammar, StringsCountCodePointsAndEscape) {
  const Grammar g = grammar_of(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(g.matches("\"\xc3\xa9\""));
  EXPECT_TRUE(g.matches("\"\xc3\xa9x\""));
  EXPECT_TRUE(g.matches(R"("\u00e9\n\"")"));
  EXPECT_FALSE(g.matches(R"("abcd")"));
  EXPECT_FALSE(g.matches("\"a\x01\""));          // raw control byte
  EXPECT_FALSE(g.matches(R"("\ud800x")"));       // lone surrogate escape
  EXPECT_FALSE(g.matches("\"\xed\xa0\x80x\""));  // UTF-8 surrogate
  EXPECT_FALSE(g.matches("\"\xc0\xafx\""));      // overlong
}

TEST(JsonSchemaGrammar, RecursiveRefsAndAnyJsonObject) {
  const Grammar tree = grammar_of(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"]}}})");
  EXPECT_TRUE(tree.matches(R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(tree.matches(R"({"v":1,"kids":[{"kids":[]}]})"));
  const Grammar any = any_json_object_grammar();
  EXPECT_TRUE(any.matches(R"({"a":[1,-2.5,{"b":null}],"c":"x","d":true})"));
  EXPECT_TRUE(any.matches("{}"));
  EXPECT_FALSE(any.matches("[]"));
  EXPECT_FALSE(any.matches(R"({"a":1,})"));
}

TEST(JsonSchemaGrammar, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"string","pattern":"^a+(?=b)$"})", "'pattern' (at #): lookahead"},
      {R"({"not":{"type":"null"}})", "'not'"},
      {R"({"if":{"type":"string"},"then":{"minLength":1}})", "'if'"},
      {R"({"type":"object","patternProperties":{"^x":{}}})", "'patternProperties'"},
      {R"({"type":"string","format":"date-time"})", "'format'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"array","items":[{"type":"null"}]})", "'items' as an array"},
      {R"({"type":"object","properties":{"x":{"type":"integer","multipleOf":3}}})",
       "'multipleOf' (at #/properties/x)"},
      {R"({"allOf":[{"type":"null"},{"type":"null"}]})", "'allOf'"},
      {R"({"$ref":"http://example.com/s.json"})", "'$ref'"},
      {R"({"type":"string","maxLength":100000})", "'maxLength'"},
  };
  for (const auto& [schema, needle] : cases) {
    try {
      grammar_of(schema);
      ADD_FAILURE() << schema << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << schema << ": " << e.what();
    }
  }
  // Malformed or unsatisfiable schemas are errors too.
  for (const char* bad :
       {R"({"type":"integer","minimum":5,"maximum":4})", R"({"type":"strin"})", R"({"enum":[]})",
        R"({"$ref":"#/$defs/none"})", R"({"$ref":"#"})",
        R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})"}) {
    EXPECT_THROW(grammar_of(bad), Error) << bad;
  }
}

TEST(JsonSchemaGrammar, HostileSchemasHitTheBounds) {
  // Many large counted repetitions: refused while compiling.
  OJson props = OJson::object();
  for (int i = 0; i < 60; ++i)
    props["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 10000}};
  try {
    json_schema_grammar(OJson{{"type", "object"}, {"properties", props}});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grammar elements"), std::string::npos) << e.what();
  }
  // Ambiguity that doubles the live stacks with every '[': refused when it passes the bound.
  const Grammar g = grammar_of(R"({"$ref":"#/$defs/t","$defs":{"t":{"anyOf":[
      {"type":"array","items":{"$ref":"#/$defs/t"}},
      {"type":"array","items":{"$ref":"#/$defs/t"},"maxItems":3},{"type":"null"}]}}})");
  EXPECT_TRUE(g.matches("[[null],[]]"));
  try {
    g.advance(g.initial(), std::string(16, '['));
    ADD_FAILURE() << "no bound";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ways to read"), std::string::npos) << e.what();
  }
}

// ---------- masks against brute force ----------

// Every single byte (id = the byte), random multi-byte tokens cut from `docs` and from JSON
// punctuation, then one EOS.
std::vector<std::string> small_vocab(std::mt19937& rng, const std::vector<std::string>& docs) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(1, static_cast<char>(b));
  for (int i = 0; i < 150; ++i) {
    const std::string& d = docs[rng() % docs.size()];
    const size_t at = rng() % d.size();
    v.push_back(d.substr(at, 2 + rng() % 5));
  }
  for (const char* t : {"{\"", "\":", ",\"", "}]", "]}", "}}", "true", "null", "\"}", "-1"}) {
    v.push_back(t);
  }
  return v;
}

TEST(TokenMask, MatchesBruteForceOverFiniteSchemas) {
  std::mt19937 rng(11);
  int states = 0;
  for (int round = 0; round < 40; ++round) {
    const OJson schema = random_finite_schema(rng, 2);
    const auto docs = enumerate(schema, schema);
    if (docs.size() > 3000) continue;
    std::set<std::string> prefixes;
    for (const auto& d : docs) {
      for (size_t k = 0; k <= d.size(); ++k) prefixes.insert(d.substr(0, k));
    }
    const std::set<std::string> complete(docs.begin(), docs.end());
    std::vector<std::string> tokens = small_vocab(rng, docs);
    const auto eos = static_cast<int32_t>(tokens.size());
    tokens.emplace_back();
    auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{eos},
                                                   static_cast<int64_t>(tokens.size()) + 5);
    auto compiled = std::make_shared<CompiledGrammar>(json_schema_grammar(schema), vocab);
    std::vector<uint32_t> words(vocab->mask_words());
    for (int probe = 0; probe < 12; ++probe) {
      const std::string& d = docs[rng() % docs.size()];
      const size_t k = rng() % (d.size() + 1);
      const std::string prefix = d.substr(0, k);
      GrammarMatcher m(compiled);
      for (unsigned char c : prefix) ASSERT_TRUE(m.accept(c));
      m.fill_mask(1 << 20, words);
      for (int32_t t = 0; t < vocab->num_logits(); ++t) {
        const bool allowed = (words[t >> 5] >> (t & 31)) & 1;
        bool expect = false;
        if (t == eos) {
          expect = complete.count(prefix) > 0;
        } else if (t < eos) {
          expect = prefixes.count(prefix + tokens[t]) > 0;
        }
        ASSERT_EQ(allowed, expect) << schema.dump() << " after '" << prefix << "' token " << t
                                   << " '" << (t < eos ? tokens[t] : "") << "'";
      }
      ++states;
    }
  }
  EXPECT_GT(states, 300);
}

TEST(TokenMask, RepeatedStatesComeFromTheCache) {
  auto vocab = std::make_shared<TokenVocabulary>(std::vector<std::string>{"[", "]", "1", ",", "2"},
                                                 std::vector<int32_t>{}, 5);
  auto compiled = std::make_shared<CompiledGrammar>(
      grammar_of(R"({"type":"array","items":{"enum":[1,2]}})"), vocab);
  GrammarMatcher m(compiled);
  std::vector<uint32_t> words(1);
  const std::string walk = "[1,2,1,2,1,2,1]";
  for (char c : walk) {
    m.fill_mask(100, words);
    const int32_t t = c == '[' ? 0 : c == ']' ? 1 : c == '1' ? 2 : c == ',' ? 3 : 4;
    ASSERT_TRUE((words[0] >> t) & 1) << c;
    ASSERT_TRUE(m.accept(t));
  }
  EXPECT_TRUE(m.terminated());
  const auto [computed, hits] = compiled->cache_stats();
  EXPECT_EQ(computed, 4);  // after '[', after an item, after ','; the start
  EXPECT_EQ(hits, static_cast<int64_t>(walk.size()) - 4);
}

// A short budget's mask is every token whose distance fits, or the least-distance tokens when
// none does, whether it comes from a cumulative level (a vocabulary of 12K string-body tokens
// makes levels) or from the sorted tokens past it.
TEST(TokenMask, ShortBudgetsKeepExactlyTheTokensThatFit) {
  std::mt19937 rng(5);
  std::vector<std::string> tokens;
  for (int c = 32; c < 127; ++c) tokens.emplace_back(1, static_cast<char>(c));
  const std::string letters = "abcdefghijklmnopqrstuvwxyz ,.";
  std::set<std::string> seen(tokens.begin(), tokens.end());
  while (tokens.size() < 12000) {
    std::string t(2 + rng() % 4, ' ');
    for (char& ch : t) ch = letters[rng() % letters.size()];
    if (rng() % 7 == 0) t += rng() % 2 ? "\"," : "\"]";
    if (seen.insert(t).second) tokens.push_back(t);
  }
  const auto eos = static_cast<int32_t>(tokens.size());
  tokens.emplace_back();
  auto vocab = std::make_shared<TokenVocabulary>(tokens, std::vector<int32_t>{eos},
                                                 static_cast<int64_t>(tokens.size()));
  auto compiled = std::make_shared<CompiledGrammar>(
      grammar_of(R"({"type":"object","properties":{"tags":{"type":"array","items":)"
                 R"({"type":"string"},"minItems":3}},"required":["tags"]})"),
      vocab);
  const Grammar& g = compiled->grammar();
  GrammarMatcher m(compiled);
  GrammarState state = g.initial();
  std::vector<uint32_t> words(vocab->mask_words());
  int with_levels = 0;
  for (int step = 0; step < 60 && !m.terminated(); ++step) {
    const std::shared_ptr<const TokenMask> mask = compiled->mask(state);
    with_levels += mask->levels.empty() ? 0 : 1;
    std::vector<int32_t> distance(tokens.size(), -1);  // of the state after each allowed token
    for (const auto& [d, tok] : mask->by_distance) distance[tok] = d;
    for (int64_t remaining = 1; remaining <= mask->max_distance + 2; ++remaining) {
      m.fill_mask(remaining, words);
      const int32_t least = mask->by_distance.front().first;
      const int64_t limit = std::max<int64_t>(remaining - 1, least);
      for (int32_t t = 0; t < vocab->num_logits(); ++t) {
        const bool expect = distance[t] >= 0 && distance[t] <= limit;
        ASSERT_EQ(((words[t >> 5] >> (t & 31)) & 1) != 0, expect)
            << "step " << step << " remaining " << remaining << " token " << t;
      }
    }
    // Move on by a random allowed token (EOS only at the end).
    m.fill_mask(1 << 20, words);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < eos; ++t)
      if ((words[t >> 5] >> (t & 31)) & 1) allowed.push_back(t);
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    ASSERT_TRUE(m.accept(t));
    state = g.advance(state, tokens[t]);
  }
  EXPECT_GT(with_levels, 10);
}

// ---------- the budget: random-logit walks always end in a valid document ----------

std::shared_ptr<const TokenVocabulary> needle_vocab() {
  const Tokenizer tok = Tokenizer::load(std::string(LONGCTX_SOURCE_DIR) + "/models/needle");
  std::vector<std::string> bytes(tok.vocab_size());
  for (size_t t = 0; t < bytes.size(); ++t) {
    const auto id = static_cast<TokenId>(t);
    if (tok.is_valid_id(id) && !tok.is_special(id)) bytes[t] = std::string(tok.token_bytes(id));
  }
  return std::make_shared<TokenVocabulary>(bytes, std::vector<int32_t>{*tok.eos_token_id()},
                                           static_cast<int64_t>(bytes.size()));
}

// Samples uniformly among the allowed tokens until the grammar ends or max_tokens run out.
std::string random_walk(GrammarMatcher& m, int64_t max_tokens, std::mt19937& rng,
                        const TokenVocabulary& vocab) {
  std::vector<uint32_t> words(vocab.mask_words());
  std::string text;
  for (int64_t step = 0; step < max_tokens && !m.terminated(); ++step) {
    m.fill_mask(max_tokens - step, words);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab.num_logits(); ++t) {
      if ((words[t >> 5] >> (t & 31)) & 1) allowed.push_back(t);
    }
    EXPECT_FALSE(allowed.empty());
    if (allowed.empty()) break;
    const int32_t t = allowed[rng() % allowed.size()];
    EXPECT_TRUE(m.accept(t));
    if (vocab.is_eos(t)) break;
    text += vocab.bytes(t);
  }
  return text;
}

// take() (the step's check, the walk left to settle()) answers every token as accept() does:
// taken or refused, and whether the document ends with it; after settling, the state and its
// masks are the same. Random walks over random schemas reach ends (a closing token, EOS) often.
TEST(TokenMask, TakeAnswersAsAccept) {
  const auto vocab = needle_vocab();
  std::mt19937 rng(9);
  std::vector<uint32_t> taken_words(vocab->mask_words()), accepted_words(vocab->mask_words());
  int ends = 0, refused = 0, steps = 0;
  for (int round = 0; round < 60; ++round) {
    const OJson schema = random_schema(rng, 3);
    auto compiled = std::make_shared<CompiledGrammar>(json_schema_grammar(schema), vocab);
    GrammarMatcher taken(compiled), accepted(compiled);
    const int64_t max_tokens = 48;
    for (int64_t step = 0; step < max_tokens && !accepted.terminated(); ++step) {
      taken.fill_mask(max_tokens - step, taken_words);
      accepted.fill_mask(max_tokens - step, accepted_words);
      ASSERT_EQ(taken_words, accepted_words) << schema.dump() << " step " << step;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->num_logits(); ++t)
        if ((taken_words[t >> 5] >> (t & 31)) & 1) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty());
      // Allowed tokens, and tokens drawn from the whole vocabulary, on copies.
      std::vector<int32_t> probes;
      for (int k = 0; k < 24; ++k) {
        probes.push_back(allowed[rng() % allowed.size()]);
        probes.push_back(static_cast<int32_t>(rng() % vocab->num_logits()));
      }
      for (int32_t t : probes) {
        GrammarMatcher a = taken, b = accepted;
        const bool took = a.take(t);
        ASSERT_EQ(took, b.accept(t)) << schema.dump() << " token " << t;
        ASSERT_EQ(a.terminated(), b.terminated()) << schema.dump() << " token " << t;
        ends += took && a.terminated() ? 1 : 0;
        refused += took ? 0 : 1;
      }
      const int32_t t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(taken.take(t));
      ASSERT_TRUE(accepted.accept(t));
      ASSERT_EQ(taken.terminated(), accepted.terminated());
      ++steps;
      if (vocab->is_eos(t)) break;
    }
    ASSERT_EQ(taken.accepting(), accepted.accepting()) << schema.dump();
  }
  EXPECT_GT(steps, 500);
  EXPECT_GT(ends, 500);
  EXPECT_GT(refused, 5000);
}

// prepare_masks splits each new state's walk in slices of the vocabulary over the thread pool:
// its masks give every budget the same tokens as one walk's (a grammar of its own computes
// those), one walk per distinct new state (rows in the same state share it), and fill_mask
// computes nothing after it.
TEST(TokenMask, PreparedMasksEqualOneWalk) {
  const auto vocab = needle_vocab();
  std::mt19937 rng(21);
  std::vector<uint32_t> prepared(vocab->mask_words()), walked(vocab->mask_words());
  int64_t computed_total = 0;
  for (int round = 0; round < 40; ++round) {
    const OJson schema = random_schema(rng, 3);
    auto sliced = std::make_shared<CompiledGrammar>(json_schema_grammar(schema), vocab);
    auto whole = std::make_shared<CompiledGrammar>(json_schema_grammar(schema), vocab);
    std::vector<GrammarMatcher> a, b;
    for (int r = 0; r < 6; ++r) {
      a.emplace_back(sliced);
      b.emplace_back(whole);
    }
    const int64_t max_tokens = 40;
    for (int64_t step = 0; step < max_tokens; ++step) {
      std::vector<GrammarMatcher*> rows;
      for (auto& m : a) {
        m.settle();
        if (!m.terminated()) rows.push_back(&m);  // a request ends there
      }
      prepare_masks(rows, 97 + rng() % 400);
      const auto computed = sliced->cache_stats().first;
      bool any = false;
      int32_t shared = -1;
      for (size_t r = 0; r < a.size(); ++r) {
        if (a[r].terminated()) continue;
        any = true;
        for (int64_t remaining : {max_tokens - step, int64_t{1}, int64_t{3}}) {
          a[r].fill_mask(remaining, prepared);
          b[r].fill_mask(remaining, walked);
          ASSERT_EQ(prepared, walked) << schema.dump() << " step " << step << " row " << r;
        }
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab->num_logits(); ++t)
          if ((walked[t >> 5] >> (t & 31)) & 1) allowed.push_back(t);
        ASSERT_FALSE(allowed.empty());
        // Row 1 takes row 0's token: the two stay in one state, which one walk serves.
        const int32_t t = r == 1 ? shared : allowed[rng() % allowed.size()];
        if (r == 0) shared = t;
        ASSERT_TRUE(a[r].take(t));
        ASSERT_TRUE(b[r].take(t));
      }
      EXPECT_EQ(sliced->cache_stats().first, computed) << "fill_mask walked after prepare_masks";
      if (!any) break;
    }
    EXPECT_EQ(sliced->cache_stats().first, whole->cache_stats().first) << schema.dump();
    computed_total += sliced->cache_stats().first;
  }
  EXPECT_GT(computed_total, 200);
}

TEST(TokenMask, RandomWalksWithinMaxTokensAlwaysValidate) {
  const auto vocab = needle_vocab();
  std::mt19937 rng(5);
  int walks = 0;
  for (int round = 0; round < 150; ++round) {
    const OJson schema = random_schema(rng, 3);
    auto compiled = std::make_shared<CompiledGrammar>(json_schema_grammar(schema), vocab);
    const Grammar& g = compiled->grammar();
    const int64_t least = g.distance(g.initial());
    const int64_t max_tokens = least + static_cast<int64_t>(rng() % 24);
    GrammarMatcher m(compiled);
    const std::string text = random_walk(m, max_tokens, rng, *vocab);
    ASSERT_TRUE(m.accepting()) << schema.dump() << " budget " << max_tokens << ": " << text;
    OJson doc;
    ASSERT_NO_THROW(doc = OJson::parse(text)) << schema.dump() << ": " << text;
    ASSERT_TRUE(validate(schema, schema, doc)) << schema.dump() << ": " << text;
    ++walks;
  }
  // json_object, with budgets from the least (2 bytes: "{}") up.
  for (int round = 0; round < 40; ++round) {
    auto compiled = std::make_shared<CompiledGrammar>(any_json_object_grammar(), vocab);
    GrammarMatcher m(compiled);
    const std::string text = random_walk(m, 2 + round, rng, *vocab);
    OJson doc;
    ASSERT_NO_THROW(doc = OJson::parse(text)) << text;
    ASSERT_TRUE(doc.is_object()) << text;
    ++walks;
  }
  EXPECT_EQ(walks, 190);
}

}  // namespace
}  // namespace longctx::structured
