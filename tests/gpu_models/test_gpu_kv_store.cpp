// The shared KV store (--kv-store) on the GPU engine, against a real redis-server (on the PATH;
// the tests fail without it): engine B reads from the store the prompt blocks engine A computed
// and gives A's tokens. With LONGCTX_PERF=1, Llama-3.1-8B shapes (dummy weights) at 32K print
// the TTFT of a store hit against a recompute, and the decode TPOT with the store's write-behind
// against none (issue 50's GPU measurements).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/redis_server.h"
#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine/llm_internal.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

bool perf_mode() {
  const char* v = std::getenv("LONGCTX_PERF");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

std::vector<int32_t> document(int32_t salt, int64_t n, int32_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>(3 + (i * 37 + salt * 101) % (vocab - 3)));
  return t;
}

SamplingParams greedy(int64_t tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = tokens;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  return sp;
}

RequestOutput run(LLM& llm, const std::vector<int32_t>& prompt, int64_t tokens) {
  auto out = llm.generate({Prompt(prompt)}, greedy(tokens), false);
  engine_core(llm).flush_kv_store();
  return out.at(0);
}

EngineConfig needle_config(const std::string& store) {
  EngineConfig c;
  c.model = needle_model_dir();
  c.device = "cuda";
  c.block_size = 16;
  c.max_model_len = 2048;
  c.num_gpu_blocks = 256;
  c.max_num_batched_tokens = 512;
  c.kv_store = store;
  return c;
}

TEST(GpuKvStore, SecondEngineReadsWhatTheFirstComputed) {
  RedisProcess redis;
  ASSERT_TRUE(redis.up());
  const std::vector<int32_t> prompt = document(3, 1000, 2000);  // 62 full blocks, then 8 tokens
  LLM a(needle_config(redis.url()));
  const RequestOutput oa = run(a, prompt, 16);
  const EngineStats sa = engine_core(a).stats();
  EXPECT_GT(sa.kv_store_bytes_written, 0);
  EXPECT_EQ(sa.kv_store_errors, 0);
  LLM b(needle_config(redis.url()));
  const RequestOutput ob = run(b, prompt, 16);
  const EngineStats sb = engine_core(b).stats();
  EXPECT_EQ(sb.kv_store_hits, 62);
  EXPECT_EQ(ob.metrics.num_cached_tokens, 62 * 16);
  EXPECT_EQ(sb.kv_store_errors, 0);
  // The same kernels read the same bytes: B's tokens are A's, its logprobs A's up to the
  // last-token prefill reading cached blocks instead of one chunk.
  EXPECT_EQ(ob.token_ids, oa.token_ids);
  for (size_t i = 0; i < ob.logprobs.size() && i < oa.logprobs.size(); ++i)
    EXPECT_NEAR(ob.logprobs[i].logprob, oa.logprobs[i].logprob, 2e-2) << "token " << i;
  engine_core(b).check_consistency();
}

// LONGCTX_REDIS_IO_THREADS=N runs the store with Redis' io-threads N (its replies written by N
// threads).
TEST(GpuKvStorePerf, Llama8BShapesAt32K) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 runs it";
  const char* io_threads = std::getenv("LONGCTX_REDIS_IO_THREADS");
  std::vector<std::string> redis_options;
  if (io_threads != nullptr && *io_threads != '\0') redis_options = {"--io-threads", io_threads};
  RedisProcess redis(redis_options);
  ASSERT_TRUE(redis.up());
  std::printf("redis-server io-threads: %s\n", redis_options.empty() ? "off" : io_threads);
  auto config = [](const std::string& store) {
    EngineConfig c;
    c.dummy_preset = "llama-3.1-8b";
    c.device = "cuda";
    c.max_model_len = 33000;
    c.max_num_seqs = 4;
    c.kv_store = store;
    return c;
  };
  const std::vector<int32_t> prompt = document(7, 32768, 100000);
  auto ttft = [](const RequestOutput& o) { return 1e3 * o.metrics.ttft(); };
  auto tpot = [](const RequestOutput& o) {
    return 1e3 * o.metrics.decode_seconds() / static_cast<double>(o.token_ids.size() - 1);
  };
  RequestOutput plain, computed, hit;
  auto ms_since = [](std::chrono::steady_clock::time_point t0) {
    return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double startup_none = 0, startup_store = 0;
  {
    const auto t0 = std::chrono::steady_clock::now();
    LLM none(config(""));
    startup_none = ms_since(t0);
    run(none, document(8, 1024, 100000), 8);  // warm-up
    plain = run(none, prompt, 256);
  }
  {
    const auto t0 = std::chrono::steady_clock::now();
    LLM a(config(redis.url()));
    startup_store = ms_since(t0);
    run(a, document(8, 1024, 100000), 8);
    computed = run(a, prompt, 256);
    const EngineStats s = engine_core(a).stats();
    std::printf(
        "store writes: %.2f GiB written, %lld blocks dropped (export or write queue full, or "
        "overwritten while waiting)\n",
        static_cast<double>(s.kv_store_bytes_written) / (1ll << 30),
        static_cast<long long>(s.kv_store_writes_dropped));
  }
  {
    LLM b(config(redis.url()));
    run(b, document(9, 1024, 100000), 8);
    hit = run(b, prompt, 16);
    const EngineStats s = engine_core(b).stats();
    std::printf("store hits %lld, bytes read %.2f GiB\n", static_cast<long long>(s.kv_store_hits),
                static_cast<double>(s.kv_store_bytes_read) / (1ll << 30));
  }
  // Random weights make near ties common: the tokens are printed, not compared (the needle
  // test above compares them).
  size_t same = 0;
  while (same < hit.token_ids.size() && hit.token_ids[same] == computed.token_ids[same]) ++same;
  std::printf("hit's first tokens equal to the computed run's: %zu of %zu\n", same,
              hit.token_ids.size());
  std::printf(
      "TTFT: recompute (no store) %.1f ms, store miss (computed, written behind) %.1f ms, store "
      "hit %.1f ms (%.2fx the recompute's speed)\n",
      ttft(plain), ttft(computed), ttft(hit), ttft(plain) / ttft(hit));
  std::printf("engine start-up: no store %.0f ms, with a store %.0f ms\n", startup_none,
              startup_store);
  std::printf("TPOT over 255 tokens: no store %.3f ms, store writing behind %.3f ms (%+.2f %%)\n",
              tpot(plain), tpot(computed), 100.0 * (tpot(computed) / tpot(plain) - 1.0));
}

// A decoding request's tokens while another request's 32K prefix loads from the store, with the
// synchronous reads (the load holds the engine thread: the decode stalls for all of it) and the
// asynchronous ones (the blocks imported between steps): the decode's gaps between tokens
// during the load, against its TPOT before.
TEST(GpuKvStorePerf, DecodeWhileA32KHitLoads) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 runs it";
  RedisProcess redis;
  ASSERT_TRUE(redis.up());
  auto config = [](const std::string& store) {
    EngineConfig c;
    c.dummy_preset = "llama-3.1-8b";
    c.device = "cuda";
    c.max_model_len = 33000;
    c.max_num_seqs = 4;
    c.kv_store = store;
    return c;
  };
  const std::vector<int32_t> prompt = document(7, 32768, 100000);
  {
    LLM a(config(redis.url()));
    run(a, prompt, 1);
  }
  for (const bool sync : {true, false}) {
    LLM c(config(redis.url()));
    EngineCore& core = engine_core(c);
    core.set_kv_store_sync_reads(sync);
    run(c, document(9, 1024, 100000), 8);  // warm-up
    const uint64_t d = core.add_request(0, document(11, 1024, 100000), greedy(4096), now_seconds());
    std::vector<double> before, during;  // the decode's gaps between tokens, seconds
    double last = 0;
    auto step = [&](std::vector<double>& gaps, uint64_t watch, bool* watched_done) {
      const auto updates = core.step();
      const double now = now_seconds();
      for (const StepUpdate& u : updates) {
        if (u.seq->id == d && u.num_new_tokens > 0) {
          if (last > 0) gaps.push_back(now - last);
          last = now;
        }
        if (watched_done != nullptr && u.seq->id == watch && u.finished) *watched_done = true;
      }
    };
    while (before.size() < 64) step(before, 0, nullptr);
    const double t0 = now_seconds();
    const uint64_t h = core.add_request(1, prompt, greedy(1), t0);
    bool h_done = false;
    while (!h_done) step(during, h, &h_done);
    const double ttft = now_seconds() - t0;
    core.abort(d);
    while (core.has_unfinished()) core.step();
    const EngineStats s = core.stats();
    auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
    };
    double worst = 0;
    for (double x : during) worst = std::max(worst, x);
    std::printf(
        "%s reads: the 32K hit's TTFT %.1f ms (%lld blocks, %.2f GiB); the decode beside it: "
        "TPOT before %.3f ms, during the load %zu tokens, mean gap %.3f ms, longest %.1f ms\n",
        sync ? "synchronous" : "asynchronous", 1e3 * ttft, static_cast<long long>(s.kv_store_hits),
        static_cast<double>(s.kv_store_bytes_read) / (1ll << 30), 1e3 * mean(before), during.size(),
        1e3 * mean(during), 1e3 * worst);
  }
}

}  // namespace
}  // namespace longctx::testing
