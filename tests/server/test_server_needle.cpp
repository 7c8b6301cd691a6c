// The server on the CPU backend with the real needle model (models/needle): chat through the
// tokenizer_config.json template, greedy outputs equal to the offline LLM's on the same prompt,
// streamed text equal to the non-streamed text, seeds reproducing, logprobs, and a load of
// concurrent streams with random cancels that leaves no KV block in use.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "common/test_data.h"
#include "http_client.h"
#include "longctx/llm.h"
#include "server/load_client.h"
#include "server/server.h"

namespace longctx {
namespace {

using nlohmann::json;
using testing::http_request;
using testing::post_json;
using testing::SseStream;

EngineConfig needle_config() {
  EngineConfig c;
  c.model = testing::test_data_dir() + "/../../models/needle";
  c.device = "cpu";
  c.max_model_len = 4096;
  return c;
}

class ServerNeedle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    llm_ = new LLM(needle_config());
    reference_ = new LLM(needle_config());
    server::ServeOptions o;
    o.transport.port = 0;
    o.api.served_model_names = {"needle"};
    o.close_grace_s = 0.5;
    srv_ = new server::Server(*llm_, o);
  }
  static void TearDownTestSuite() {
    delete srv_;
    delete reference_;
    delete llm_;
  }
  static int port() { return srv_->port(); }

  static LLM* llm_;
  static LLM* reference_;  // the offline API on its own copy of the model
  static server::Server* srv_;
};
LLM* ServerNeedle::llm_ = nullptr;
LLM* ServerNeedle::reference_ = nullptr;
server::Server* ServerNeedle::srv_ = nullptr;

const json kMessages = json::array(
    {{{"role", "user"},
      {"content", "The special magic number is 4821. What is the special magic number?"}}});

TEST_F(ServerNeedle, ChatMatchesTheOfflineEngine) {
  auto r = post_json(
      port(), "/v1/chat/completions",
      {{"model", "needle"}, {"messages", kMessages}, {"temperature", 0}, {"max_tokens", 12}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  // The same prompt through the offline API: the template, encoded without extra specials.
  Prompt p(reference_->render_chat(kMessages.dump()));
  p.add_special_tokens = false;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 12;
  RequestOutput ref = reference_->generate({p}, sp, false).at(0);
  EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], finish_reason_name(ref.finish_reason));
  EXPECT_EQ(j["usage"]["prompt_tokens"], ref.prompt_token_ids.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], ref.token_ids.size());

  // Streamed: a role chunk first, then deltas that add up to the same text.
  SseStream st(port(), "/v1/chat/completions",
               {{"messages", kMessages},
                {"temperature", 0},
                {"max_tokens", 12},
                {"stream", true},
                {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(st.status(), 200);
  auto events = st.rest();
  ASSERT_GE(events.size(), 4u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    if (c["choices"][0]["delta"].contains("content"))
      text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, ref.text);
  EXPECT_EQ(json::parse(events[events.size() - 2])["usage"]["completion_tokens"],
            ref.token_ids.size());
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST_F(ServerNeedle, CompletionsMatchTheOfflineEngine) {
  const std::string prompt = "The special magic number is 7710. The special magic number is";
  auto r = post_json(port(), "/v1/completions",
                     {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 8}});
  ASSERT_EQ(r.status, 200) << r.body;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 8;
  RequestOutput ref = reference_->generate({Prompt(prompt)}, sp, false).at(0);
  EXPECT_EQ(r.json()["choices"][0]["text"], ref.text);
}

TEST_F(ServerNeedle, SeedsReproduce) {
  json body = {{"prompt", "The special magic number is"},
               {"temperature", 1.0},
               {"max_tokens", 16},
               {"seed", 1234}};
  auto a = post_json(port(), "/v1/completions", body);
  auto b = post_json(port(), "/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]);
  // And equal to the offline engine with the same seed.
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.max_tokens = 16;
  sp.seed = 1234;
  RequestOutput ref =
      reference_->generate({Prompt("The special magic number is")}, sp, false).at(0);
  EXPECT_EQ(a.json()["choices"][0]["text"], ref.text);
}

TEST_F(ServerNeedle, ChatLogprobs) {
  auto r = post_json(port(), "/v1/chat/completions",
                     {{"messages", kMessages},
                      {"temperature", 0},
                      {"max_tokens", 4},
                      {"logprobs", true},
                      {"top_logprobs", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  json content = r.json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), r.json()["usage"]["completion_tokens"].get<size_t>());
  for (const json& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
    EXPECT_FLOAT_EQ(t["logprob"].get<float>(), t["top_logprobs"][0]["logprob"].get<float>());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(t["bytes"].is_array());
  }
  // top_logprobs without logprobs is refused.
  auto bad =
      post_json(port(), "/v1/chat/completions", {{"messages", kMessages}, {"top_logprobs", 3}});
  EXPECT_EQ(bad.status, 400) << bad.body;
}

TEST_F(ServerNeedle, TokenizeMessagesAsTheTemplateRendersThem) {
  auto r = post_json(port(), "/tokenize", {{"messages", kMessages}});
  ASSERT_EQ(r.status, 200) << r.body;
  Prompt p(reference_->render_chat(kMessages.dump()));
  p.add_special_tokens = false;
  EXPECT_EQ(r.json()["tokens"].get<std::vector<int32_t>>(), reference_->encode(p));
}

// 200 concurrent streams, 1,000 in all, a fifth closed mid-stream; then nothing is left in the
// engine and no KV block is in use (read from /metrics).
TEST_F(ServerNeedle, LoadWithRandomCancels) {
  server::LoadOptions o;
  o.port = port();
  o.path = "/v1/chat/completions";
  o.concurrency = 200;
  o.total = 1000;
  o.cancel_fraction = 0.2;
  o.seed = 7;
  o.timeout_s = 600;
  o.body = [](int i) {
    return json{
        {"messages", json::array({{{"role", "user"},
                                   {"content", "The special magic number is " +
                                                   std::to_string(1000 + i) + ". What is it?"}}})},
        {"max_tokens", 8},
        {"temperature", 0},
        {"stream", true}}
        .dump();
  };
  server::LoadResult r = server::run_sse_load(o);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.completed + r.cancelled, 1000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (srv_->loop().stats().num_in_flight > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string m = http_request(port(), "GET", "/metrics").body;
  auto metric = [&](const std::string& name) {
    const size_t p = m.find("\n" + name + " ");
    return p == std::string::npos ? -1.0 : std::stod(m.substr(p + name.size() + 2));
  };
  EXPECT_EQ(metric("longctx:kv_blocks_used{model_name=\"needle\",engine=\"0\"}"), 0);
  EXPECT_GT(metric("longctx:kv_blocks_total{model_name=\"needle\",engine=\"0\"}"), 0);
  EXPECT_EQ(metric("vllm:num_requests_running{model_name=\"needle\",engine=\"0\"}"), 0);
  EXPECT_EQ(metric("vllm:num_requests_waiting{model_name=\"needle\",engine=\"0\"}"), 0);
  std::printf(
      "load (needle, CPU): %d completed, %d cancelled in %.2f s (%.1f req/s, %.0f "
      "generated chars/s); TTFT p50 %.1f ms p99 %.1f ms\n",
      r.completed, r.cancelled, r.wall_s, r.requests_per_s(),
      static_cast<double>(r.text_bytes) / r.wall_s,
      1e3 * server::LoadResult::percentile(r.ttft_s, 0.5),
      1e3 * server::LoadResult::percentile(r.ttft_s, 0.99));
}

}  // namespace
}  // namespace longctx
