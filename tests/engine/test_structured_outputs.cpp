// Structured outputs through the offline API on models/needle (CPU): every constrained output
// parses and validates within its max_tokens, unconstrained requests batched beside them come out
// exactly as in a run without them, and a bad schema is refused before anything runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "longctx/core/error.h"
#include "longctx/llm.h"
#include "longctx/tokenizer/tokenizer.h"
#include "structured/json_schema.h"
#include "structured/regex.h"
#include "structured/schema_oracle.h"
#include "structured/token_mask.h"

namespace longctx {
namespace {

using structured::testing::OJson;

std::string needle_dir() { return std::string(LONGCTX_SOURCE_DIR) + "/models/needle"; }

LLM& needle() {
  static LLM llm([] {
    EngineConfig c;
    c.model = needle_dir();
    c.device = "cpu";
    c.max_model_len = 2048;
    c.cpu_kv_cache_bytes = 64ll << 20;
    return c;
  }());
  return llm;
}

SamplingParams sampled(uint64_t seed, int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

SamplingParams with_schema(SamplingParams p, const std::string& schema) {
  p.structured.kind = StructuredOutput::Kind::kJsonSchema;
  p.structured.json_schema = schema;
  return p;
}

const char* kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
        "age":{"type":"integer","minimum":0,"maximum":120},
        "tags":{"type":"array","items":{"enum":["a","b","c"]},"minItems":1,"maxItems":3}},
        "required":["name","age","tags"],"additionalProperties":false})",
    R"({"type":"array","items":{"type":"object","properties":{"x":{"type":"number"},
        "ok":{"type":"boolean"}},"required":["x"]},"maxItems":4})",
    R"({"anyOf":[{"type":"string","minLength":3},{"type":"null"},
        {"type":"integer","exclusiveMinimum":-50,"maximum":-7}]})",
};

TEST(StructuredOutputs, MixedBatchValidatesAndLeavesUnconstrainedUnchanged) {
  LLM& llm = needle();
  const std::vector<Prompt> prompts = {"The key is", "Answer in JSON:", "Once upon a time",
                                       "List:",      "Numbers 1 2 3",   "{\"a\":"};
  std::vector<SamplingParams> mixed = {
      sampled(1, 24),
      with_schema(sampled(2, 48), kSchemas[0]),
      sampled(3, 24),
      with_schema(sampled(4, 40), kSchemas[1]),
      with_schema(sampled(5, 16), kSchemas[2]),
      sampled(6, 24),
  };
  mixed.push_back(sampled(7, 30));
  mixed.back().structured.kind = StructuredOutput::Kind::kJsonObject;
  std::vector<Prompt> all = prompts;
  all.emplace_back("Object:");
  const std::vector<RequestOutput> out = llm.generate(all, mixed, false);
  ASSERT_EQ(out.size(), all.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const StructuredOutput& so = mixed[i].structured;
    if (!so.enabled()) continue;
    OJson doc;
    ASSERT_NO_THROW(doc = OJson::parse(out[i].text)) << i << ": " << out[i].text;
    if (so.kind == StructuredOutput::Kind::kJsonObject) {
      EXPECT_TRUE(doc.is_object()) << out[i].text;
    } else {
      const OJson schema = OJson::parse(so.json_schema);
      EXPECT_TRUE(structured::testing::validate(schema, schema, doc)) << i << ": " << out[i].text;
    }
    EXPECT_LE(static_cast<int64_t>(out[i].token_ids.size()), mixed[i].max_tokens);
  }
  // The unconstrained requests alone: the same tokens.
  std::vector<Prompt> plain_prompts;
  std::vector<SamplingParams> plain;
  std::vector<size_t> where;
  for (size_t i = 0; i < mixed.size(); ++i) {
    if (mixed[i].structured.enabled()) continue;
    plain_prompts.push_back(all[i]);
    plain.push_back(mixed[i]);
    where.push_back(i);
  }
  const std::vector<RequestOutput> alone = llm.generate(plain_prompts, plain, false);
  for (size_t k = 0; k < where.size(); ++k) {
    EXPECT_EQ(alone[k].token_ids, out[where[k]].token_ids) << "request " << where[k];
    EXPECT_EQ(alone[k].text, out[where[k]].text);
  }
}

TEST(StructuredOutputs, ManySeedsAlwaysParseWithinMaxTokens) {
  LLM& llm = needle();
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (uint64_t seed = 0; seed < 24; ++seed) {
    prompts.emplace_back("JSON " + std::to_string(seed));
    // max_tokens down to the shortest document's bytes.
    const char* schema = kSchemas[seed % 3];
    const structured::Grammar g = structured::json_schema_grammar(OJson::parse(schema));
    const int64_t max_tokens = g.distance(g.initial()) + static_cast<int64_t>(seed % 6) * 3;
    SamplingParams p = with_schema(sampled(100 + seed, max_tokens), schema);
    p.temperature = 1.5;  // wander
    params.push_back(p);
  }
  const std::vector<RequestOutput> out = llm.generate(prompts, params, false);
  for (size_t i = 0; i < out.size(); ++i) {
    const OJson schema = OJson::parse(params[i].structured.json_schema);
    OJson doc;
    ASSERT_NO_THROW(doc = OJson::parse(out[i].text)) << i << ": " << out[i].text;
    EXPECT_TRUE(structured::testing::validate(schema, schema, doc)) << i << ": " << out[i].text;
    // A complete document ends the request (stop) unless max_tokens came first (length, with a
    // document that may end there, such as a number that could go on).
    EXPECT_TRUE(out[i].finish_reason == FinishReason::kStop ||
                static_cast<int64_t>(out[i].token_ids.size()) == params[i].max_tokens)
        << i;
  }
}

// A step learns whether a sampled token ends its document from the mask and leaves the grammar's
// walk over the token to the next step's mask fill: replayed through a grammar that walks every
// token at once, each request's tokens are all taken, and it stops exactly at the first token
// after which its document must end (finish_reason stop), or runs to max_tokens without one.
TEST(StructuredOutputs, EachRequestEndsWhereItsDocumentDoes) {
  LLM& llm = needle();
  const Tokenizer tok = Tokenizer::load(needle_dir());
  std::vector<std::string> bytes(tok.vocab_size());
  for (size_t t = 0; t < bytes.size(); ++t) {
    const auto id = static_cast<TokenId>(t);
    if (tok.is_valid_id(id) && !tok.is_special(id)) bytes[t] = std::string(tok.token_bytes(id));
  }
  auto vocab = std::make_shared<structured::TokenVocabulary>(
      bytes, std::vector<int32_t>{static_cast<int32_t>(*tok.eos_token_id())},
      static_cast<int64_t>(bytes.size()));
  const std::vector<std::string> choices = {"pos", "positive", "n/a", "neg"};
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  std::vector<std::shared_ptr<const structured::CompiledGrammar>> grammars;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    prompts.emplace_back("Doc " + std::to_string(seed));
    SamplingParams p = sampled(700 + seed, 12 + static_cast<int64_t>(seed % 5) * 10);
    p.temperature = 1.5;
    structured::Grammar g;
    if (seed % 3 == 2) {
      p.structured.kind = StructuredOutput::Kind::kChoice;
      p.structured.choices = choices;
      g = structured::choice_grammar(choices);
    } else {
      p = with_schema(p, kSchemas[seed % 3]);
      g = structured::json_schema_grammar(OJson::parse(kSchemas[seed % 3]));
    }
    grammars.push_back(std::make_shared<const structured::CompiledGrammar>(std::move(g), vocab));
    params.push_back(p);
  }
  const std::vector<RequestOutput> out = llm.generate(prompts, params, false);
  int stopped = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<int32_t>& ids = out[i].token_ids;
    ASSERT_FALSE(ids.empty()) << i;
    structured::GrammarMatcher m(grammars[i]);
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSERT_TRUE(m.accept(ids[k])) << i << ": token " << k << " (" << ids[k] << ")";
      if (k + 1 < ids.size()) ASSERT_FALSE(m.terminated()) << i << ": ended at token " << k;
    }
    if (out[i].finish_reason == FinishReason::kStop) {
      EXPECT_TRUE(m.terminated()) << i << ": '" << out[i].text << "'";
      ++stopped;
    } else {
      EXPECT_EQ(out[i].finish_reason, FinishReason::kLength) << i;
      EXPECT_EQ(static_cast<int64_t>(ids.size()), params[i].max_tokens) << i;
      EXPECT_FALSE(m.terminated()) << i;
    }
  }
  EXPECT_GE(stopped, 10);
}

TEST(StructuredOutputs, ChoiceAndRegexOutputsHold) {
  LLM& llm = needle();
  const std::vector<std::string> choices = {"positive", "negative", "neutral", "pos", "n/a"};
  const std::string pattern = "[A-Z][a-z]{1,6}-\\d{2,4}( ok| no)?";
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (uint64_t seed = 0; seed < 32; ++seed) {
    prompts.emplace_back("Sentiment " + std::to_string(seed));
    SamplingParams p = sampled(300 + seed, 24);
    p.temperature = 1.5;
    if (seed % 2 == 0) {
      p.structured.kind = StructuredOutput::Kind::kChoice;
      p.structured.choices = choices;
    } else {
      p.structured.kind = StructuredOutput::Kind::kRegex;
      p.structured.regex = pattern;
    }
    params.push_back(p);
  }
  const std::vector<RequestOutput> out = llm.generate(prompts, params, false);
  const std::regex re(pattern, std::regex::ECMAScript);
  std::set<std::string> seen;
  for (size_t i = 0; i < out.size(); ++i) {
    if (i % 2 == 0) {
      EXPECT_NE(std::find(choices.begin(), choices.end(), out[i].text), choices.end())
          << i << ": '" << out[i].text << "'";
      EXPECT_EQ(out[i].finish_reason, FinishReason::kStop) << i;
      seen.insert(out[i].text);
    } else {
      EXPECT_TRUE(std::regex_match(out[i].text, re)) << i << ": '" << out[i].text << "'";
    }
  }
  EXPECT_GE(seen.size(), 2u);  // sampled, not one forced string
}

TEST(StructuredOutputs, UnsupportedSchemaIsRefusedBeforeAnythingRuns) {
  LLM& llm = needle();
  std::vector<SamplingParams> params = {sampled(1, 4), with_schema(sampled(2, 8), R"({"not":{}})")};
  try {
    llm.generate({"a", "b"}, params, false);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'not'"), std::string::npos) << e.what();
  }
  params[1] = with_schema(sampled(2, 8), "{\"type\":");
  EXPECT_THROW(llm.generate({"a", "b"}, params, false), Error);
  params[1] = sampled(2, 8);
  params[1].structured.kind = StructuredOutput::Kind::kRegex;
  params[1].structured.regex = "a(?=b)";
  EXPECT_THROW(llm.generate({"a", "b"}, params, false), Error);
  params[1].structured.kind = StructuredOutput::Kind::kChoice;
  EXPECT_THROW(llm.generate({"a", "b"}, params, false), Error);  // no choices
}

TEST(StructuredOutputs, AGrammarPastItsBoundsAbortsOnlyItsRequest) {
  LLM& llm = needle();
  // 1,500 values sharing a prefix: after '"' every one is a live reading, past the 1,024 bound.
  OJson values = OJson::array();
  for (int i = 0; i < 1500; ++i) values.push_back("v" + std::to_string(10000 + i));
  const std::vector<SamplingParams> params = {
      with_schema(sampled(1, 12), OJson{{"enum", values}}.dump()), sampled(2, 12)};
  const std::vector<RequestOutput> out = llm.generate({"a", "b"}, params, false);
  EXPECT_EQ(out[0].finish_reason, FinishReason::kAbort);
  EXPECT_EQ(out[1].finish_reason, FinishReason::kLength);
  EXPECT_EQ(out[1].token_ids.size(), 12u);
}

// Constrained requests draft too: each verified position is sampled under the grammar's mask after
// the draft tokens accepted before it. The needle's answer is copied from the haystack, so prompt
// lookup drafts it and the drafts are accepted; the greedy constrained output is the
// non-speculative one, and sampled JSON under speculation still validates.
TEST(StructuredOutputs, SpeculativeDraftsUnderTheGrammarGiveTheConstrainedOutput) {
  static LLM spec_llm([] {
    EngineConfig c;
    c.model = needle_dir();
    c.device = "cpu";
    c.max_model_len = 2048;
    c.cpu_kv_cache_bytes = 64ll << 20;
    c.speculative = {SpeculativeMethod::kNgram, 4, 1, 3};
    return c;
  }());
  std::ifstream f(testing::test_data_dir() + "/needle/reference.json");
  ASSERT_TRUE(f.good());
  const auto ref = nlohmann::json::parse(f);
  Prompt needle_prompt(ref.at("input_ids").get<std::vector<int32_t>>());
  needle_prompt.add_special_tokens = false;  // the reference's ids hold them
  SamplingParams greedy;
  greedy.temperature = 0.0;
  greedy.max_tokens = 16;
  greedy.structured.kind = StructuredOutput::Kind::kRegex;
  greedy.structured.regex = " [0-9]{7}[.]";
  SamplingParams json = with_schema(sampled(9, 48), kSchemas[0]);
  const std::vector<Prompt> prompts = {needle_prompt, needle_prompt, "Answer in JSON:"};
  const std::vector<SamplingParams> params = {greedy, sampled(3, 12), json};
  const std::vector<RequestOutput> plain = needle().generate(prompts, params, false);
  const std::vector<RequestOutput> drafted = spec_llm.generate(prompts, params, false);
  EXPECT_EQ(plain[0].text, ref.at("greedy_text").get<std::string>());
  EXPECT_EQ(drafted[0].token_ids, plain[0].token_ids);
  EXPECT_EQ(drafted[0].finish_reason, FinishReason::kStop);
  EXPECT_GT(drafted[0].metrics.num_accepted_tokens, 0);
  EXPECT_EQ(plain[0].metrics.num_drafts, 0);
  const OJson doc = OJson::parse(drafted[2].text);
  const OJson schema = OJson::parse(kSchemas[0]);
  EXPECT_TRUE(structured::testing::validate(schema, schema, doc)) << drafted[2].text;
  EXPECT_GT(drafted[2].metrics.num_drafts + drafted[1].metrics.num_drafts, 0);
}

}  // namespace
}  // namespace longctx
