// The server over scripted logits and the needle model's tokenizer, in process on an ephemeral
// port, through a Beast client: every endpoint, streaming framing, the error statuses and
// bodies, the API key, a client that disconnects mid-stream (its request aborted, nothing
// left in the engine), shutdown, and a load of concurrent streams with random cancels.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "common/test_data.h"
#include "engine/text_stream.h"
#include "http_client.h"
#include "longctx/llm.h"
#include "longctx/tokenizer/tokenizer.h"
#include "scripted_server.h"
#include "server/load_client.h"
#include "server/server.h"

namespace longctx {
namespace {

using nlohmann::json;
using testing::http_request;
using testing::post_json;
using testing::SseStream;

// /metrics once `name_and_labels` reads `want`, or after 5 s: a finish is counted by the request's
// event handler, which may run just after the engine goes idle.
std::string metrics_when(int port, const std::string& name_and_labels, double want) {
  std::string m = http_request(port, "GET", "/metrics").body;
  for (int i = 0; i < 500 && metric(m, name_and_labels) != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = http_request(port, "GET", "/metrics").body;
  }
  return m;
}

void expect_error(const testing::HttpResult& r, int status, const std::string& type,
                  const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
  EXPECT_EQ(e["type"], type);
  ASSERT_TRUE(e.contains("param") && e.contains("code")) << r.body;
  if (!param.empty()) EXPECT_EQ(e["param"], param) << r.body;
}

TEST(ServerScripted, CompletionNonStreamed) {
  ScriptedServer s;
  const auto prompt = s.tok->encode("hello there", true);
  auto r = post_json(
      s.port(), "/v1/completions",
      {{"model", "scripted"}, {"prompt", "hello there"}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  json j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(j["model"], "scripted");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], s.expected_text(prompt.size(), 5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt.size() + 5);
  // The alias works too; a prompt of token ids is used as it is.
  r = post_json(s.port(), "/v1/completions",
                {{"model", "alias"}, {"prompt", json::array({5, 6, 7})}, {"max_tokens", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["text"], s.expected_text(3, 3));
  EXPECT_EQ(r.json()["usage"]["prompt_tokens"], 3);
}

TEST(ServerScripted, CompletionStreamedWithUsage) {
  ScriptedServer s;
  const auto prompt = s.tok->encode("hello there", true);
  SseStream st(s.port(), "/v1/completions",
               {{"prompt", "hello there"},
                {"max_tokens", 6},
                {"stream", true},
                {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(st.status(), 200);
  EXPECT_EQ(st.header("Content-Type"), "text/event-stream");
  auto events = st.rest();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  int finish = 0;
  std::string id;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id);  // one id for every chunk
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) {
      ++finish;
      EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
    }
  }
  EXPECT_EQ(finish, 1);
  EXPECT_EQ(text, s.expected_text(prompt.size(), 6));
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt.size());
}

TEST(ServerScripted, StopStringCutsTheText) {
  ScriptedServer s;
  for (bool stream : {false, true}) {
    json body = {{"prompt", json::array({1, 2, 3, 4})}, {"max_tokens", 40}, {"stop", "fox"}};
    std::string text;
    std::string finish;
    if (stream) {
      body["stream"] = true;
      SseStream st(s.port(), "/v1/completions", body);
      for (const std::string& ev : st.rest()) {
        if (ev == "[DONE]") continue;
        json c = json::parse(ev);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      }
    } else {
      auto r = post_json(s.port(), "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      text = r.json()["choices"][0]["text"];
      finish = r.json()["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(finish, "stop");
    const std::string full = s.expected_text(4, 40);
    EXPECT_EQ(text, full.substr(0, full.find("fox"))) << "stream " << stream;
  }
}

TEST(ServerScripted, ChatWithoutTemplateIsAClearError) {
  ScriptedServer s;  // an LLM over a bare executor has no tokenizer_config.json
  auto r = post_json(s.port(), "/v1/chat/completions",
                     {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  expect_error(r, 400, "invalid_request_error", "messages");
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("chat template"),
            std::string::npos);
}

TEST(ServerScripted, ErrorsHaveOpenAIStatusesAndBodies) {
  ScriptedServer s;
  const int port = s.port();
  // Malformed JSON, and JSON nested past the limit.
  expect_error(http_request(port, "POST", "/v1/completions", "{\"prompt\": "), 400,
               "invalid_request_error");
  expect_error(
      http_request(port, "POST", "/v1/completions", std::string(100, '[') + std::string(100, ']')),
      400, "invalid_request_error");
  // Wrong types and missing fields: 400 naming the field (OpenAI's and vLLM's status).
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}}), 400,
               "invalid_request_error", "temperature");
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2.5}}), 400,
               "invalid_request_error", "max_tokens");
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"stream", 1}}), 400,
               "invalid_request_error", "stream");
  expect_error(post_json(port, "/v1/completions", {{"max_tokens", 3}}), 400,
               "invalid_request_error", "prompt");
  expect_error(post_json(port, "/v1/completions", json::array({1})), 400, "invalid_request_error");
  // Out of range: 400 naming the field.
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"top_p", 1.5}}), 400,
               "invalid_request_error", "top_p");
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"temperature", -1}}), 400,
               "invalid_request_error", "temperature");
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 0}}), 400,
               "invalid_request_error", "max_tokens");
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"logprobs", 21}}), 400,
               "invalid_request_error", "logprobs");
  expect_error(post_json(port, "/v1/completions", {{"prompt", "x"}, {"n", 2}}), 400,
               "invalid_request_error", "n");
  expect_error(post_json(port, "/v1/completions",
                         {{"prompt", json::array({1, static_cast<int>(s.tok->vocab_size())})}}),
               400, "invalid_request_error");
  // Unknown model: 404.
  auto r = post_json(port, "/v1/completions", {{"model", "gpt-4"}, {"prompt", "x"}});
  expect_error(r, 404, "invalid_request_error", "model");
  EXPECT_EQ(r.json()["error"]["code"], "model_not_found");
  // A prompt longer than the context, and one that leaves no room for max_tokens.
  r = post_json(port, "/v1/completions", {{"prompt", std::vector<int>(kMaxModelLen + 5, 7)}});
  expect_error(r, 400, "invalid_request_error", "prompt");
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  r = post_json(port, "/v1/completions",
                {{"prompt", std::vector<int>(kMaxModelLen - 10, 7)}, {"max_tokens", 20}});
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  // An oversized body: 413 (the limit here is 1 MiB).
  const std::string big = json{{"prompt", std::string(2 << 20, 'a')}}.dump();
  expect_error(http_request(port, "POST", "/v1/completions", big), 413, "invalid_request_error");
  // Unknown endpoint, wrong method.
  expect_error(http_request(port, "GET", "/v1/nothing"), 404, "invalid_request_error");
  expect_error(http_request(port, "GET", "/v1/completions"), 405, "invalid_request_error");
  // The server still serves after all of that.
  EXPECT_EQ(post_json(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
  EXPECT_TRUE(s.wait_idle());
}

TEST(ServerScripted, ApiKey) {
  ScriptedServer s({}, "sekret");
  const int port = s.port();
  json body = {{"prompt", "x"}, {"max_tokens", 2}};
  expect_error(post_json(port, "/v1/completions", body), 401, "authentication_error");
  expect_error(post_json(port, "/v1/completions", body, {{"Authorization", "Bearer nope"}}), 401,
               "authentication_error");
  expect_error(http_request(port, "GET", "/v1/models"), 401, "authentication_error");
  expect_error(post_json(port, "/tokenize", {{"prompt", "x"}}), 401, "authentication_error");
  EXPECT_EQ(post_json(port, "/v1/completions", body, {{"Authorization", "Bearer sekret"}}).status,
            200);
  // Health, metrics and the page stay open (as vLLM).
  EXPECT_EQ(http_request(port, "GET", "/health").status, 200);
  EXPECT_EQ(http_request(port, "GET", "/metrics").status, 200);
  EXPECT_EQ(http_request(port, "GET", "/").status, 200);
}

TEST(ServerScripted, ModelsHealthTokenizePage) {
  ScriptedServer s;
  const int port = s.port();
  auto r = http_request(port, "GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  json m = r.json();
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 2u);
  EXPECT_EQ(m["data"][0]["id"], "scripted");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["root"], "scripted-root");
  EXPECT_EQ(m["data"][0]["max_model_len"], kMaxModelLen);
  EXPECT_EQ(http_request(port, "GET", "/health").status, 200);

  r = post_json(port, "/tokenize", {{"prompt", "hello world"}, {"return_token_strs", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const auto ids = s.tok->encode("hello world", true);
  EXPECT_EQ(r.json()["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(r.json()["count"], ids.size());
  EXPECT_EQ(r.json()["max_model_len"], kMaxModelLen);
  EXPECT_EQ(r.json()["token_strs"].size(), ids.size());
  r = post_json(port, "/tokenize", {{"prompt", "hello world"}, {"add_special_tokens", false}});
  EXPECT_EQ(r.json()["tokens"].get<std::vector<int32_t>>(), s.tok->encode("hello world", false));
  r = post_json(port, "/detokenize", {{"tokens", s.tok->encode("hello world", false)}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["prompt"], "hello world");
  expect_error(post_json(port, "/detokenize", {{"tokens", json::array({-1})}}), 400,
               "invalid_request_error", "tokens");
  expect_error(post_json(port, "/detokenize", {{"tokens", "abc"}}), 400, "invalid_request_error",
               "tokens");

  r = http_request(port, "GET", "/");
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(r.headers["content-type"].starts_with("text/html"));
  EXPECT_NE(r.body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(r.body.find("</html>"), std::string::npos);
}

TEST(ServerScripted, LogprobsInCompletions) {
  ScriptedServer s;
  auto r = post_json(
      s.port(), "/v1/completions",
      {{"prompt", json::array({1, 2})}, {"max_tokens", 3}, {"logprobs", 2}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = r.json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 3u);
  ASSERT_EQ(lp["token_logprobs"].size(), 3u);
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  ASSERT_EQ(lp["text_offset"].size(), 3u);
  std::string joined;
  for (size_t i = 0; i < 3; ++i) {
    // The scripted token has logit 20 against 0 elsewhere: log p = -log(1 + (V-1) e^-20).
    const double expected = -std::log1p((s.tok->vocab_size() - 1) * std::exp(-20.0));
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), expected, 1e-4);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, r.json()["choices"][0]["text"]);
}

TEST(ServerScripted, DisconnectMidStreamAbortsAndFrees) {
  ScriptedServer s(std::chrono::milliseconds(5));
  {
    SseStream st(s.port(), "/v1/completions",
                 {{"prompt", "a long one"}, {"max_tokens", 200}, {"stream", true}});
    ASSERT_EQ(st.status(), 200);
    ASSERT_TRUE(st.next().has_value());
    ASSERT_TRUE(st.next().has_value());
    st.close();
  }
  ASSERT_TRUE(s.wait_idle()) << "the aborted request still holds the engine";
  // It stopped long before its 200 tokens (5 ms each): the abort, not the length, ended it.
  EXPECT_LT(s.steps.load(), 150);
  const std::string aborted =
      "vllm:request_success_total{model_name=\"scripted\",engine=\"0\",finished_reason=\"abort\"}";
  const std::string m = metrics_when(s.port(), aborted, 1);
  EXPECT_EQ(metric(m, aborted), 1);
  EXPECT_EQ(metric(m, "longctx:kv_blocks_used{model_name=\"scripted\",engine=\"0\"}"), 0);
  // A non-streamed request whose client leaves is aborted too.
  {
    testing::net::io_context ioc;
    testing::tcp::socket sock(ioc);
    sock.connect({testing::net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(s.port())});
    auto req = testing::make_request(s.port(), "POST", "/v1/completions",
                                     json{{"prompt", "x"}, {"max_tokens", 200}}.dump(), {});
    testing::http::write(sock, req);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    sock.close();
  }
  ASSERT_TRUE(s.wait_idle());
  EXPECT_EQ(metric(metrics_when(s.port(), aborted, 2), aborted), 2);
}

TEST(ServerScripted, SpeculativeDecodingCountersInMetrics) {
  // The script cycles, so prompt lookup finds what comes next: drafts are accepted.
  ScriptedServer s({}, "", 1 << 20, {}, SpeculativeConfig{SpeculativeMethod::kNgram, 3, 1, 2});
  json prompt = json::array();
  for (int r = 0; r < 2; ++r)
    for (int32_t t : s.script) prompt.push_back(t);
  const auto r = post_json(s.port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 20}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], s.expected_text(prompt.size(), 20));
  const std::string m = http_request(s.port(), "GET", "/metrics").body;
  const std::string l = "{model_name=\"scripted\",engine=\"0\"}";
  const double drafts = metric(m, "vllm:spec_decode_num_drafts_total" + l);
  const double draft_tokens = metric(m, "vllm:spec_decode_num_draft_tokens_total" + l);
  const double accepted = metric(m, "vllm:spec_decode_num_accepted_tokens_total" + l);
  EXPECT_GT(drafts, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, draft_tokens);
  EXPECT_LE(draft_tokens, 3 * drafts);
  // Fewer steps than tokens: each verifying step yielded 1 + its accepted tokens.
  EXPECT_EQ(metric(m, "vllm:generation_tokens_total" + l), 20);
  double per_pos = 0;
  for (int pos = 0; pos < 3; ++pos)
    per_pos += metric(m,
                      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="
                      "\"scripted\",engine=\"0\",position=\"" +
                          std::to_string(pos) + "\"}");
  EXPECT_EQ(per_pos, accepted);
  // Without speculative decoding the series are absent, as in vLLM.
  ScriptedServer plain;
  EXPECT_EQ(http_request(plain.port(), "GET", "/metrics").body.find("spec_decode"),
            std::string::npos);
}

TEST(ServerScripted, MetricsCountRequestsAndTokens) {
  ScriptedServer s;
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_json(s.port(), "/v1/completions",
                        {{"prompt", json::array({1, 2, 3})}, {"max_tokens", 4}})
                  .status,
              200);
  const std::string m = http_request(s.port(), "GET", "/metrics").body;
  const std::string l = "{model_name=\"scripted\",engine=\"0\"}";
  EXPECT_EQ(metric(m, "vllm:num_requests_running" + l), 0);
  EXPECT_EQ(metric(m, "vllm:num_requests_waiting" + l), 0);
  EXPECT_EQ(metric(m, "vllm:generation_tokens_total" + l), 12);
  EXPECT_EQ(metric(m, "vllm:time_to_first_token_seconds_count" + l), 3);
  EXPECT_EQ(metric(m, "vllm:e2e_request_latency_seconds_count" + l), 3);
  // One inter-token interval per token after the first, as vLLM.
  EXPECT_EQ(metric(m, "vllm:time_per_output_token_seconds_count" + l), 9);
  EXPECT_EQ(metric(m, "vllm:inter_token_latency_seconds_count" + l), 9);
  EXPECT_EQ(metric(m, "vllm:prompt_tokens_total" + l), 9);
  EXPECT_EQ(metric(m,
                   "vllm:request_success_total{model_name=\"scripted\",engine=\"0\",finished_"
                   "reason=\"length\"}"),
            3);
  EXPECT_GE(metric(m, "longctx:kv_blocks_total" + l), 0);
  // Offload, sparse prefill, KV store and state snapshot series exist at 0 without them.
  for (const char* name :
       {"longctx:offload_host_loaded_bytes_total", "longctx:offload_host_written_bytes_total",
        "longctx:sparse_prefill_blocks_kept_total", "longctx:sparse_prefill_blocks_causal_total",
        "longctx:kv_store_hits_total", "longctx:kv_store_misses_total",
        "longctx:kv_store_errors_total", "longctx:kv_store_read_bytes_total",
        "longctx:kv_store_written_bytes_total", "longctx:kv_store_dropped_writes_total",
        "longctx:state_snapshots_saved_total", "longctx:state_snapshots_restored_total",
        "longctx:state_snapshot_bytes_total"}) {
    EXPECT_EQ(metric(m, name + l), 0) << name;
    EXPECT_NE(m.find(std::string("# TYPE ") + name + " counter"), std::string::npos) << name;
  }
  EXPECT_NE(m.find("# TYPE vllm:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(m.find("vllm:time_to_first_token_seconds_bucket{model_name=\"scripted\",engine=\"0\","
                   "le=\"+Inf\"} 3"),
            std::string::npos);
}

TEST(ServerScripted, ShutdownRefusesNewRequests) {
  ScriptedServer s;
  s.srv->loop().shutdown(EngineLoop::ShutdownMode::kDrain);
  expect_error(post_json(s.port(), "/v1/completions", {{"prompt", "x"}}), 503,
               "service_unavailable");
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 503);
}

TEST(ServerScripted, ShutdownDrainsStreamsInFlight) {
  ScriptedServer s(std::chrono::milliseconds(10));
  SseStream st(s.port(), "/v1/completions",
               {{"prompt", "x"}, {"max_tokens", 30}, {"stream", true}});
  ASSERT_TRUE(st.next().has_value());
  std::thread stopper([&] { s.srv->shutdown(EngineLoop::ShutdownMode::kDrain, 30); });
  // While the drain runs the listener stays open and readiness probes read 503.
  int health = 200;
  for (int i = 0; i < 200 && health == 200; ++i) {
    health = http_request(s.port(), "GET", "/health").status;
    if (health == 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(health, 503);
  EXPECT_EQ(http_request(s.port(), "GET", "/ping").status, 503);
  auto events = st.rest();
  stopper.join();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");  // it finished, not aborted
}

// 200 concurrent streams, 1,000 in all, a fifth of them closed by the client mid-stream.
TEST(ServerScripted, LoadWithRandomCancels) {
  ScriptedServer s;
  server::LoadOptions o;
  o.port = s.port();
  o.concurrency = 200;
  o.total = 1000;
  o.cancel_fraction = 0.2;
  o.body = [](int i) {
    return json{
        {"prompt", json::array({1 + i % 50, 2, 3})}, {"max_tokens", 4 + i % 8}, {"stream", true}}
        .dump();
  };
  server::LoadResult r = server::run_sse_load(o);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.completed + r.cancelled, 1000);
  EXPECT_GT(r.cancelled, 100);
  ASSERT_TRUE(s.wait_idle());
  const std::string m = http_request(s.port(), "GET", "/metrics").body;
  EXPECT_EQ(metric(m, "longctx:kv_blocks_used{model_name=\"scripted\",engine=\"0\"}"), 0);
  EXPECT_EQ(metric(m, "vllm:num_requests_running{model_name=\"scripted\",engine=\"0\"}"), 0);
  std::printf(
      "load (scripted): %d completed, %d cancelled in %.2f s (%.0f req/s); TTFT p50 %.1f ms "
      "p99 %.1f ms\n",
      r.completed, r.cancelled, r.wall_s, r.requests_per_s(),
      1e3 * server::LoadResult::percentile(r.ttft_s, 0.5),
      1e3 * server::LoadResult::percentile(r.ttft_s, 0.99));
}

}  // namespace
}  // namespace longctx
