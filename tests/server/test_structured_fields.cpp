// vLLM's structured-output request fields (structured_outputs.{regex,choice,json,json_object},
// guided_regex / guided_choice / guided_json) and JSON Schema `pattern` through the request
// parser: what they set, and the 400s (status, param, message) for bad or combined constraints.
#include <gtest/gtest.h>

#include <tuple>

#include "server/openai_protocol.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace longctx::server {
namespace {

GenerationRequest parse(const std::string& extra, Endpoint e = Endpoint::kChat) {
  const std::string body =
      (e == Endpoint::kChat ? std::string(R"({"messages":[{"role":"user","content":"hi"}])")
                            : std::string(R"({"prompt":"hi")")) +
      extra + "}";
  return parse_generation_request(Json::parse(body), e);
}

TEST(StructuredFields, RegexAndChoiceFromEitherSpelling) {
  for (Endpoint e : {Endpoint::kChat, Endpoint::kCompletions}) {
    for (const char* f : {R"(,"structured_outputs":{"regex":"\\d{3}-[a-z]+"})",
                          R"(,"guided_regex":"\\d{3}-[a-z]+")"}) {
      const StructuredOutput so = parse(f, e).params.structured;
      ASSERT_EQ(so.kind, StructuredOutput::Kind::kRegex) << f;
      EXPECT_EQ(so.regex, "\\d{3}-[a-z]+");
      EXPECT_TRUE(structured::regex_grammar(so.regex).matches("123-abc"));
    }
    for (const char* f :
         {R"(,"structured_outputs":{"choice":["yes","no"]})", R"(,"guided_choice":["yes","no"])"}) {
      const StructuredOutput so = parse(f, e).params.structured;
      ASSERT_EQ(so.kind, StructuredOutput::Kind::kChoice) << f;
      EXPECT_EQ(so.choices, (std::vector<std::string>{"yes", "no"}));
    }
  }
  const StructuredOutput json =
      parse(R"(,"structured_outputs":{"json":{"type":"object","properties":{"b":{},"a":{}}}})")
          .params.structured;
  ASSERT_EQ(json.kind, StructuredOutput::Kind::kJsonSchema);
  EXPECT_LT(json.json_schema.find("\"b\""), json.json_schema.find("\"a\""));
  EXPECT_EQ(parse(R"(,"guided_json":"{\"type\":\"string\"}")").params.structured.kind,
            StructuredOutput::Kind::kJsonSchema);
  EXPECT_EQ(parse(R"(,"structured_outputs":{"json_object":true})").params.structured.kind,
            StructuredOutput::Kind::kJsonObject);
  // Nulls and vLLM's backend switches change nothing.
  EXPECT_FALSE(parse(R"(,"structured_outputs":{"regex":null,"disable_any_whitespace":true})")
                   .params.structured.enabled());
  // Constrained chat output has no reasoning to split off.
  OutputParsers qwen;
  qwen.reasoning = ReasoningParserKind::kQwen3;
  const auto chat = [&](const char* extra) {
    return parse_generation_request(
        Json::parse(std::string(R"({"messages":[{"role":"user","content":"hi"}])") + extra + "}"),
        Endpoint::kChat, qwen);
  };
  EXPECT_EQ(chat("").parsing.reasoning, ReasoningParserKind::kQwen3);
  EXPECT_EQ(chat(R"(,"guided_choice":["a"])").parsing.reasoning, ReasoningParserKind::kNone);
}

TEST(StructuredFields, SchemaPatternEndToEnd) {
  const GenerationRequest r = parse(
      R"(,"response_format":{"type":"json_schema","json_schema":{"name":"id","schema":{
          "type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-\\d{4}$"},
          "note":{"type":"string","pattern":"ok"}},"required":["id","note"]}}})");
  ASSERT_EQ(r.params.structured.kind, StructuredOutput::Kind::kJsonSchema);
  const structured::Grammar g =
      structured::json_schema_grammar(Json::parse(r.params.structured.json_schema));
  EXPECT_TRUE(g.matches(R"({"id":"AB-1234","note":"it is ok!"})"));
  EXPECT_FALSE(g.matches(R"({"id":"AB-12345","note":"ok"})"));
  EXPECT_FALSE(g.matches(R"({"id":"AB-1234","note":"o k"})"));
}

TEST(StructuredFields, ErrorsNameTheFieldAndTheConstruct) {
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {R"x(,"guided_regex":"a(?=b)")x", "guided_regex", "lookahead '(?=' at offset 1"},
      {R"(,"guided_regex":"(a)\\1")", "guided_regex", "backreference"},
      {R"(,"structured_outputs":{"regex":"a*?"})", "structured_outputs.regex", "lazy quantifier"},
      {R"(,"structured_outputs":{"regex":"a{5000}"})", "structured_outputs.regex",
       "repetition count over 1000"},
      {R"(,"structured_outputs":{"regex":"(ab"})", "structured_outputs.regex", "without its ')'"},
      {R"(,"guided_regex":7)", "guided_regex", "must be a string"},
      {R"(,"guided_choice":[])", "guided_choice", "non-empty array of strings"},
      {R"(,"guided_choice":["a",1])", "guided_choice", "non-empty array of strings"},
      {R"(,"structured_outputs":{"grammar":"root ::= \"a\""})", "structured_outputs.grammar",
       "not supported"},
      {R"(,"structured_outputs":"regex")", "structured_outputs", "must be an object"},
      {R"(,"guided_grammar":"root ::= \"a\"")", "guided_grammar", "not supported"},
      {R"(,"guided_regex":"a","guided_choice":["a"])", "guided_choice", "cannot be combined"},
      {R"(,"structured_outputs":{"regex":"a","choice":["a"]})", "structured_outputs.choice",
       "cannot be combined"},
      {R"(,"response_format":{"type":"json_object"},"guided_regex":"a")", "guided_regex",
       "'response_format' and 'guided_regex' cannot be combined"},
      {R"(,"structured_outputs":{"choice":["a"]},"guided_choice":["a"])", "guided_choice",
       "cannot be combined"},
      {R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"properties":{
          "x":{"type":"string","pattern":"(?<=a)b"}}}}})",
       "response_format", "'pattern' (at #/properties/x): lookbehind '(?<=' at offset 0"},
      {R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{
          "type":"string","pattern":"a","maxLength":3}}})",
       "response_format", "'maxLength' beside 'pattern'"},
      {R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required",
          "guided_choice":["a"])",
       "tool_choice", "cannot be combined"},
  };
  for (const auto& [extra, param, needle] : bad) {
    try {
      parse(extra);
      ADD_FAILURE() << extra << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << extra << ": " << e.what();
      EXPECT_EQ(e.param(), param) << extra << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << extra << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace longctx::server
