// The real Qwen3 and Llama-3 chat templates must reproduce transformers' apply_chat_template
// renderings (tests/data/fixtures/tokenizers/*.json, field "chat") byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/test_data.h"
#include "longctx/template/chat_template.h"

namespace longctx {
namespace {

using Json = nlohmann::ordered_json;

Json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return Json::parse(in);
}

Json tokenizer_config(const std::string& name) {
  std::string path = testing::fetched_data_dir() + "/tokenizers/" + name + "/tokenizer_config.json";
  if (!std::filesystem::exists(path))
    throw std::runtime_error(path + " is missing: run `bash tools/fetch_test_data.sh`");
  return load_json(path);
}

void check_fixture(const std::string& name) {
  Json config = tokenizer_config(name);
  Json fixture = load_json(testing::test_data_dir() + "/fixtures/tokenizers/" + name + ".json");
  ASSERT_TRUE(fixture.contains("chat"));
  ASSERT_GE(fixture["chat"].size(), 4u);
  for (const Json& c : fixture["chat"]) {
    Json extra = Json::object();
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (it.key() != "messages" && it.key() != "add_generation_prompt" && it.key() != "rendered")
        extra[it.key()] = it.value();
    }
    std::string got =
        render_chat(config, c["messages"], c["add_generation_prompt"].get<bool>(), extra);
    EXPECT_EQ(got, c["rendered"].get<std::string>()) << name << " case: " << c.dump();
  }
}

TEST(ChatFixtures, Qwen3MatchesTransformers) { check_fixture("qwen3"); }

TEST(ChatFixtures, Llama3MatchesTransformers) { check_fixture("llama3"); }

// Beyond the fixtures: Qwen3's tool path (tools block with tojson of the schema, a tool call
// whose arguments are a dict, consecutive tool responses merged into one user turn).
TEST(ChatFixtures, Qwen3ToolCallRendering) {
  Json config = tokenizer_config("qwen3");
  Json messages = Json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp\": 20}"}
  ])");
  Json tools = Json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
  std::string got = render_chat(config, messages, true, Json{{"tools", tools}});
  std::string expected =
      "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
      "<tools>\n"
      R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})"
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
      "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"location\": \"Paris\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp\": 20}\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(got, expected);
}

// Qwen3 keeps the reasoning of assistant turns after the last user query and drops it before.
TEST(ChatFixtures, Qwen3ReasoningContent) {
  Json config = tokenizer_config("qwen3");
  Json messages = Json::parse(R"([
    {"role": "user", "content": "A"},
    {"role": "assistant", "content": "<think>\nold\n</think>\n\nB"},
    {"role": "user", "content": "C"},
    {"role": "assistant", "content": "D", "reasoning_content": "new"}
  ])");
  EXPECT_EQ(render_chat(config, messages, false),
            "<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n"
            "<|im_start|>user\nC<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nnew\n</think>\n\nD<|im_end|>\n");
}

}  // namespace
}  // namespace longctx
