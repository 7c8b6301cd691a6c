// The tool-call and reasoning parsers on outputs in each model family's format, whole and in
// every chunking: a streamed reply must parse as the whole one does.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_parsers.h"

namespace longctx::server {
namespace {

const std::vector<std::string> kTools = {"get_weather", "search_repo"};

// Fed in pieces of `chunk` bytes.
ToolParseDelta parse_chunked(ToolParserKind kind, const std::string& text, size_t chunk) {
  ToolCallStreamParser p(kind, kTools);
  ToolParseDelta all;
  auto add = [&](ToolParseDelta d) {
    all.content += d.content;
    for (auto& c : d.calls) all.calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += chunk) add(p.feed(text.substr(i, chunk)));
  add(p.finish());
  return all;
}

void expect_every_chunking(ToolParserKind kind, const std::string& text) {
  const ToolParseDelta whole = parse_tool_calls(kind, text, kTools);
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    const ToolParseDelta part = parse_chunked(kind, text, chunk);
    ASSERT_EQ(part.content, whole.content) << "chunk " << chunk;
    ASSERT_EQ(part.calls, whole.calls) << "chunk " << chunk;
  }
}

// Qwen2.5 / Qwen3 / Hermes: text, then calls in tags, one per line.
const std::string kHermesTwo =
    "Let me look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
    "\"search_repo\", \"arguments\": {\"query\": \"fn main() { println!(\\\"}\\\"); }\", "
    "\"paths\": [\"src/\", \"tests/\"]}}\n</tool_call>";

TEST(ToolParsers, HermesTwoCallsAfterText) {
  const ToolParseDelta r = parse_tool_calls(ToolParserKind::kHermes, kHermesTwo, kTools);
  EXPECT_EQ(r.content, "Let me look that up.\n\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].index, 0);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris","unit":"celsius"})");
  EXPECT_EQ(r.calls[1].index, 1);
  EXPECT_EQ(r.calls[1].name, "search_repo");
  EXPECT_EQ(r.calls[1].arguments,
            R"({"query":"fn main() { println!(\"}\"); }","paths":["src/","tests/"]})");
  expect_every_chunking(ToolParserKind::kHermes, kHermesTwo);
}

TEST(ToolParsers, HermesMalformedCallsStayText) {
  // Bad JSON, an undeclared tool, and an unterminated call with incomplete JSON.
  const std::string bad =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>\n"
      "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
  const ToolParseDelta r = parse_tool_calls(ToolParserKind::kHermes, bad, kTools);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, bad);
  expect_every_chunking(ToolParserKind::kHermes, bad);
  const std::string cut = "ok <tool_call>{\"name\": \"get_weather\", \"argu";
  EXPECT_EQ(parse_tool_calls(ToolParserKind::kHermes, cut, kTools).content, cut);
  expect_every_chunking(ToolParserKind::kHermes, cut);
  // A complete call whose closing tag was cut off by a stop string is still a call.
  const std::string unclosed = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n";
  const ToolParseDelta u = parse_tool_calls(ToolParserKind::kHermes, unclosed, kTools);
  ASSERT_EQ(u.calls.size(), 1u);
  EXPECT_EQ(u.content, "");
  expect_every_chunking(ToolParserKind::kHermes, unclosed);
}

TEST(ToolParsers, HermesPlainTextAndLookalikes) {
  const std::string text = "Use <tool to call things; a <tool_c is not a tag. 3 < 4.";
  const ToolParseDelta r = parse_tool_calls(ToolParserKind::kHermes, text, kTools);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
  expect_every_chunking(ToolParserKind::kHermes, text);
  // Text after a call stays content; whitespace between calls does not.
  const std::string mixed =
      "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>\n"
      "\nDone.";
  const ToolParseDelta m = parse_tool_calls(ToolParserKind::kHermes, mixed, kTools);
  EXPECT_EQ(m.content, "\n\nDone.");
  ASSERT_EQ(m.calls.size(), 1u);
  expect_every_chunking(ToolParserKind::kHermes, mixed);
}

TEST(ToolParsers, Llama3Json) {
  // Llama 3.1/3.2 with JSON tool calling: the whole reply, `parameters` as the arguments.
  const std::string one =
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\"}}";
  const ToolParseDelta r = parse_tool_calls(ToolParserKind::kLlama3Json, one, kTools);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"San Francisco, CA"})");
  expect_every_chunking(ToolParserKind::kLlama3Json, one);
  const std::string tagged =
      "<|python_tag|>{\"name\": \"search_repo\", \"parameters\": {\"query\": \"a{b\"}}; "
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
  const ToolParseDelta t = parse_tool_calls(ToolParserKind::kLlama3Json, tagged, kTools);
  EXPECT_EQ(t.content, "");
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_EQ(t.calls[0].name, "search_repo");
  EXPECT_EQ(t.calls[1].name, "get_weather");
  expect_every_chunking(ToolParserKind::kLlama3Json, tagged);
  // Prose, or JSON that is not a call, is content.
  for (const std::string text :
       {std::string("The weather in Paris is {\"sunny\"}."), std::string("{\"answer\": 42}"),
        std::string("  <|python_tag|>brave_search.call(q=1)"),
        std::string("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"X\"")}) {
    const ToolParseDelta p = parse_tool_calls(ToolParserKind::kLlama3Json, text, kTools);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.calls.empty());
    expect_every_chunking(ToolParserKind::kLlama3Json, text);
  }
}

TEST(ToolParsers, Mistral) {
  const std::string two =
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}, "
      "{\"name\": \"search_repo\", \"arguments\": {\"query\": \"[x]\"}}]";
  const ToolParseDelta r = parse_tool_calls(ToolParserKind::kMistral, two, kTools);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Lyon"})");
  EXPECT_EQ(r.calls[1].arguments, R"({"query":"[x]"})");
  EXPECT_EQ(r.calls[1].index, 1);
  expect_every_chunking(ToolParserKind::kMistral, two);
  // One undeclared tool in the list: the list stays text.
  const std::string bad =
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {}}, {\"name\": \"nope\"}]";
  EXPECT_EQ(parse_tool_calls(ToolParserKind::kMistral, bad, kTools).content, bad);
  expect_every_chunking(ToolParserKind::kMistral, bad);
  const std::string not_json = "[TOOL_CALLS] sorry";
  EXPECT_EQ(parse_tool_calls(ToolParserKind::kMistral, not_json, kTools).content, not_json);
  expect_every_chunking(ToolParserKind::kMistral, not_json);
}

TEST(ToolParsers, NamesAndTemplateDetection) {
  EXPECT_EQ(tool_parser_from_name("hermes"), ToolParserKind::kHermes);
  EXPECT_EQ(tool_parser_from_name("llama3_json"), ToolParserKind::kLlama3Json);
  EXPECT_EQ(tool_parser_from_name("mistral"), ToolParserKind::kMistral);
  EXPECT_FALSE(tool_parser_from_name("Hermes").has_value());
  EXPECT_EQ(detect_tool_parser("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolParserKind::kHermes);
  EXPECT_EQ(detect_tool_parser("{{- '<|python_tag|>' + tool_call.name }}"),
            ToolParserKind::kLlama3Json);
  EXPECT_EQ(detect_tool_parser("{{- '[TOOL_CALLS][' }}"), ToolParserKind::kMistral);
  EXPECT_EQ(detect_tool_parser("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolParserKind::kNone);
}

// Reasoning, fed in two pieces at every split point.
void expect_every_split(ReasoningParserKind kind, const std::string& text,
                        const std::string& reasoning, const std::string& content) {
  const ReasoningDelta whole = parse_reasoning(kind, text);
  EXPECT_EQ(whole.reasoning, reasoning);
  EXPECT_EQ(whole.content, content);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ReasoningStreamParser p(kind);
    ReasoningDelta a = p.feed(text.substr(0, cut)), b = p.feed(text.substr(cut)), c = p.finish();
    ASSERT_EQ(a.reasoning + b.reasoning + c.reasoning, reasoning) << "cut " << cut;
    ASSERT_EQ(a.content + b.content + c.content, content) << "cut " << cut;
  }
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    ReasoningStreamParser p(kind);
    std::string r, t;
    for (size_t i = 0; i < text.size(); i += chunk) {
      ReasoningDelta d = p.feed(text.substr(i, chunk));
      r += d.reasoning;
      t += d.content;
    }
    ReasoningDelta d = p.finish();
    ASSERT_EQ(r + d.reasoning, reasoning) << "chunk " << chunk;
    ASSERT_EQ(t + d.content, content) << "chunk " << chunk;
  }
}

TEST(ReasoningParser, Qwen3) {
  expect_every_split(ReasoningParserKind::kQwen3,
                     "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is 4.",
                     "\nThe user wants 2+2. That is 4.\n", "The answer is 4.");
  // enable_thinking false: no tags in the output, all content.
  expect_every_split(ReasoningParserKind::kQwen3, "Hello! <b>4</b>", "", "Hello! <b>4</b>");
  // Cut by max_tokens inside the reasoning.
  expect_every_split(ReasoningParserKind::kQwen3, "<think>\nLet me count: 1, 2, </th",
                     "\nLet me count: 1, 2, </th", "");
  expect_every_split(ReasoningParserKind::kQwen3, "<thi", "", "<thi");
}

TEST(ReasoningParser, DeepSeekR1) {
  // The template opened <think> in the prompt: the output starts inside the reasoning.
  expect_every_split(ReasoningParserKind::kDeepSeekR1, "Okay, so 7 * 6 = 42.\n</think>\n\n**42**",
                     "Okay, so 7 * 6 = 42.\n", "**42**");
  expect_every_split(ReasoningParserKind::kDeepSeekR1, "<think>\nhm\n</think>ok", "\nhm\n", "ok");
  expect_every_split(ReasoningParserKind::kDeepSeekR1, "still thinking <", "still thinking <", "");
  EXPECT_EQ(reasoning_parser_from_name("deepseek_r1"), ReasoningParserKind::kDeepSeekR1);
  EXPECT_EQ(reasoning_parser_from_name("qwen3"), ReasoningParserKind::kQwen3);
  EXPECT_FALSE(reasoning_parser_from_name("r1").has_value());
}

}  // namespace
}  // namespace longctx::server
