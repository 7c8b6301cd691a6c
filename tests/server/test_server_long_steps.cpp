// The server during long engine steps, on the CPU with the real needle model (models/needle)
// and the CPU's default step budget (1024 tokens): /metrics counts a request as running while
// its prefill step runs (not only after it), and a client that disconnects during a multi-chunk
// prefill is aborted after the chunk in progress, freeing every KV block.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/test_data.h"
#include "http_client.h"
#include "longctx/llm.h"
#include "server/server.h"

namespace longctx {
namespace {

using nlohmann::json;
using testing::http_request;
using testing::post_json;

constexpr int64_t kCpuStepTokens = 1024;  // EngineConfig's CPU default (max_num_batched_tokens 0)

// Token ids of a long prompt (ordinary ids of the needle vocabulary, no special tokens).
std::vector<int> long_prompt(int n) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(10 + (i * 7919) % 1900);
  return ids;
}

double metric(const std::string& text, const std::string& name_and_labels) {
  const size_t p = text.find("\n" + name_and_labels + " ");
  if (p == std::string::npos) return -1;
  return std::stod(text.substr(p + name_and_labels.size() + 2));
}

const std::string kRunning = "vllm:num_requests_running{model_name=\"needle\",engine=\"0\"}";

class ServerLongSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineConfig c;
    c.model = testing::test_data_dir() + "/../../models/needle";
    c.device = "cpu";
    c.max_model_len = 4096;
    llm_ = std::make_unique<LLM>(c);
    server::ServeOptions o;
    o.transport.port = 0;
    o.api.served_model_names = {"needle"};
    o.close_grace_s = 0.5;
    srv_ = std::make_unique<server::Server>(*llm_, o);
  }
  bool wait_idle(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      const LoopStats s = srv_->loop().stats();
      if (s.num_in_flight == 0 && s.engine.num_running == 0 && s.engine.num_waiting == 0 &&
          s.engine.kv_blocks_used == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  std::unique_ptr<LLM> llm_;
  std::unique_ptr<server::Server> srv_;
};

TEST_F(ServerLongSteps, MetricsShowTheRequestRunningDuringItsOnlyStep) {
  // One prefill step and max_tokens 1: the request starts and finishes within a single step, so
  // stats refreshed only after steps would never show it running.
  const int port = srv_->port();
  std::atomic<bool> done{false};
  int status = 0;
  std::thread client([&] {
    status = post_json(port, "/v1/completions",
                       {{"prompt", long_prompt(kCpuStepTokens - 24)}, {"max_tokens", 1}})
                 .status;
    done = true;
  });
  double most_running = 0;
  int polls = 0;
  while (!done) {
    most_running =
        std::max(most_running, metric(http_request(port, "GET", "/metrics").body, kRunning));
    ++polls;
  }
  client.join();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(most_running, 1) << "over " << polls << " reads of /metrics during the request";
  EXPECT_EQ(srv_->loop().stats().num_steps, 1) << "the prompt should have taken one step";
  EXPECT_TRUE(wait_idle(10));
}

TEST_F(ServerLongSteps, DisconnectDuringAPrefillAbortsAfterTheChunkInProgress) {
  const int port = srv_->port();
  const int n = static_cast<int>(3 * kCpuStepTokens);
  testing::net::io_context ioc;
  testing::tcp::socket sock(ioc);
  sock.connect({testing::net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)});
  auto req = testing::make_request(
      port, "POST", "/v1/completions",
      json{{"prompt", long_prompt(n)}, {"max_tokens", 500}, {"ignore_eos", true}}.dump(), {});
  testing::http::write(sock, req);
  // Leave as soon as the engine runs it (during its first chunk).
  bool running = false;
  for (int i = 0; i < 20000 && !running; ++i)
    running = metric(http_request(port, "GET", "/metrics").body, kRunning) == 1;
  ASSERT_TRUE(running);
  sock.close();
  ASSERT_TRUE(wait_idle(120)) << "the request of a client that left still holds the engine";
  const LoopStats s = srv_->loop().stats();
  EXPECT_EQ(s.engine.kv_blocks_used, 0);
  // Aborted mid-prefill: fewer prompt tokens computed than the prompt holds, no token sampled.
  EXPECT_LT(s.engine.prompt_tokens, n);
  EXPECT_EQ(s.engine.generation_tokens, 0);
  const std::string m = http_request(port, "GET", "/metrics").body;
  EXPECT_EQ(metric(m, "longctx:kv_blocks_used{model_name=\"needle\",engine=\"0\"}"), 0);
  EXPECT_EQ(metric(m, kRunning), 0);
}

}  // namespace
}  // namespace longctx
