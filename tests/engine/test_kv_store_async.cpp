// The KV store's asynchronous reads (docs/fleet.md, "Shared KV store", Reads) against a real
// redis-server on a free loopback port (Debian's redis-server; the test fails, not skips, without
// it): models/needle on the CPU. Engine X computes a long document and writes it to the store;
// engine Y, decoding request B, receives request A for that document: A's blocks load while B
// keeps decoding (the engine imports them between steps), where the synchronous reads stalled B
// for the whole load. Outputs equal a run without a store; an abort mid-load frees every block;
// a store killed mid-load costs only a recompute.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/redis_server.h"
#include "common/store_documents.h"
#include "engine/engine_core.h"
#include "engine/llm_internal.h"
#include "longctx/llm.h"

namespace longctx {
namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kLongBlocks = 30;  // A's full blocks: more than the store reads ahead (8)

EngineConfig config(const std::string& store) {
  EngineConfig c;
  c.model = std::string(LONGCTX_SOURCE_DIR) + "/models/needle";
  c.device = "cpu";
  c.block_size = kBlock;
  c.max_model_len = 512;
  c.cpu_kv_cache_bytes = 8ll << 20;  // 64 blocks of 128 KiB
  c.kv_store = store;
  return c;
}

const std::vector<int32_t>& long_prompt() {  // A: 30 full blocks before its last token
  static const std::vector<int32_t> p = testing::store_document(3, kLongBlocks * kBlock + 10);
  return p;
}
const std::vector<int32_t>& short_prompt() {  // B: never in the store
  static const std::vector<int32_t> p = testing::store_document(11, 40);
  return p;
}
constexpr int64_t kLongTokens = 6, kShortTokens = 64;

void expect_same(const RequestOutput& got, const RequestOutput& want) {
  EXPECT_EQ(got.token_ids, want.token_ids);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i)
    EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4) << "token " << i;
}

// A's and B's outputs each alone, without a store.
const std::vector<RequestOutput>& reference() {
  static const std::vector<RequestOutput> r = [] {
    LLM llm(config(""));
    return std::vector<RequestOutput>{
        llm.generate({Prompt(long_prompt())}, testing::store_greedy(kLongTokens), false).at(0),
        llm.generate({Prompt(short_prompt())}, testing::store_greedy(kShortTokens), false).at(0)};
  }();
  return r;
}

// Engine X computes A's document and writes its blocks to the store.
void fill_store(const std::string& url) {
  LLM x(config(url));
  x.generate({Prompt(long_prompt())}, testing::store_greedy(1), false);
  engine_core(x).flush_kv_store();
}

// Adds B and steps until it decodes, then adds A. Returns A's id.
uint64_t start_b_then_a(EngineCore& core) {
  core.add_request(1, short_prompt(), testing::store_greedy(kShortTokens), now_seconds());
  while (core.stats().generation_tokens < 2) core.step();
  return core.add_request(0, long_prompt(), testing::store_greedy(kLongTokens), now_seconds());
}

// Steps until A is first scheduled; returns how many of those steps gave B a token.
int64_t b_steps_until_a_runs(EngineCore& core) {
  int64_t b_steps = 0;
  bool a_runs = false;
  for (int i = 0; i < 10000 && !a_runs; ++i) {
    const int64_t before = core.stats().generation_tokens;
    core.step(nullptr, [&] { a_runs = core.stats().num_running == 2; });
    if (!a_runs && core.stats().generation_tokens > before) ++b_steps;
  }
  EXPECT_TRUE(a_runs) << "A never ran beside B";
  return b_steps;
}

// Runs to the end; A's output, then B's.
std::vector<RequestOutput> finish(EngineCore& core) {
  while (core.has_unfinished()) core.step();
  std::vector<RequestOutput> out(2);
  for (RequestOutput& o : core.take_finished()) out.at(o.index) = std::move(o);
  return out;
}

TEST(KvStoreAsync, RunningRequestsDecodeWhileAPrefixLoads) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  fill_store(redis.url());
  {
    LLM y(config(redis.url()));
    EngineCore& core = engine_core(y);
    start_b_then_a(core);
    // A's 30 blocks come through 8 read buffers, imported between steps: B decodes meanwhile.
    const int64_t b_steps = b_steps_until_a_runs(core);
    EXPECT_GT(b_steps, 0);
    const std::vector<RequestOutput> out = finish(core);
    expect_same(out[0], reference()[0]);
    expect_same(out[1], reference()[1]);
    EXPECT_EQ(out[0].metrics.num_cached_tokens, kLongBlocks * kBlock);
    const EngineStats s = core.stats();
    EXPECT_EQ(s.kv_store_hits, kLongBlocks);
    EXPECT_EQ(s.kv_store_errors, 0);
    EXPECT_EQ(s.kv_blocks_used, 0);
    EXPECT_EQ(core.num_store_loads(), 0);
    core.check_consistency();
    std::printf("asynchronous reads: B decoded in %lld steps while A's %lld blocks loaded\n",
                static_cast<long long>(b_steps), static_cast<long long>(kLongBlocks));
  }
  {  // the synchronous reads, for comparison: the load holds the step, B waits
    LLM y(config(redis.url()));
    EngineCore& core = engine_core(y);
    core.set_kv_store_sync_reads(true);
    start_b_then_a(core);
    EXPECT_EQ(b_steps_until_a_runs(core), 0);
    const std::vector<RequestOutput> out = finish(core);
    expect_same(out[0], reference()[0]);
    expect_same(out[1], reference()[1]);
    EXPECT_EQ(out[0].metrics.num_cached_tokens, kLongBlocks * kBlock);
  }
}

TEST(KvStoreAsync, AbortMidLoadFreesEveryBlock) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  fill_store(redis.url());
  LLM y(config(redis.url()));
  EngineCore& core = engine_core(y);
  const uint64_t a =
      core.add_request(0, long_prompt(), testing::store_greedy(kLongTokens), now_seconds());
  // The lookup starts at the first step; the loader hands blocks on and waits for the engine to
  // import them (8 read buffers), so A is mid-load once some are imported.
  for (int i = 0; i < 500 && core.stats().kv_blocks_used == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    core.step();
  }
  const EngineStats mid = core.stats();
  EXPECT_GT(mid.kv_blocks_used, 0) << "no block was imported";
  EXPECT_LE(mid.kv_blocks_used, 8);
  EXPECT_EQ(core.num_store_loads(), 1);
  EXPECT_EQ(mid.num_running, 0);  // held while it loads
  core.check_consistency();
  EXPECT_TRUE(core.abort(a));
  while (core.has_unfinished()) core.step();  // the stopped load ends
  EXPECT_EQ(core.num_store_loads(), 0);
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  core.check_consistency();
  // The engine goes on: A again, now read whole.
  core.add_request(2, long_prompt(), testing::store_greedy(kLongTokens), now_seconds());
  while (core.has_unfinished()) core.step();
  const std::vector<RequestOutput> out = core.take_finished();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].finish_reason, FinishReason::kAbort);
  expect_same(out[1], reference()[0]);
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  core.check_consistency();
}

// Two requests for one document at once: the second follows the first's load (held) instead of
// reading the same blocks, then takes them from the local prefix cache.
TEST(KvStoreAsync, RequestsForOneDocumentShareOneLoad) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  fill_store(redis.url());
  LLM y(config(redis.url()));
  EngineCore& core = engine_core(y);
  core.add_request(0, long_prompt(), testing::store_greedy(kLongTokens), now_seconds());
  core.add_request(1, long_prompt(), testing::store_greedy(kLongTokens), now_seconds());
  core.step();
  EXPECT_EQ(core.num_store_loads(), 1);
  EXPECT_EQ(core.stats().num_running, 0);  // both held
  const std::vector<RequestOutput> out = finish(core);
  expect_same(out[0], reference()[0]);
  expect_same(out[1], reference()[0]);
  EXPECT_EQ(out[0].metrics.num_cached_tokens, kLongBlocks * kBlock);
  EXPECT_EQ(out[1].metrics.num_cached_tokens, kLongBlocks * kBlock);
  const EngineStats s = core.stats();
  EXPECT_EQ(s.kv_store_hits, kLongBlocks);
  EXPECT_EQ(s.kv_blocks_used, 0);
  core.check_consistency();
}

// Two different documents at once: each load reads on a lane of its own (connections and read
// buffers), so both advance between the same steps, and both requests are released with their
// hits.
TEST(KvStoreAsync, LoadsOfTwoDocumentsRunAtOnce) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  constexpr int64_t kOtherBlocks = 20;
  const std::vector<int32_t> other = testing::store_document(23, kOtherBlocks * kBlock + 5);
  RequestOutput other_alone;
  {
    LLM x(config(redis.url()));
    x.generate({Prompt(long_prompt())}, testing::store_greedy(1), false);
    other_alone = x.generate({Prompt(other)}, testing::store_greedy(kLongTokens), false).at(0);
    engine_core(x).flush_kv_store();
  }
  LLM y(config(redis.url()));
  EngineCore& core = engine_core(y);
  core.add_request(0, long_prompt(), testing::store_greedy(kLongTokens), now_seconds());
  core.add_request(1, other, testing::store_greedy(kLongTokens), now_seconds());
  core.step();
  EXPECT_EQ(core.num_store_loads(), 2);
  EXPECT_EQ(core.stats().num_running, 0);  // both held
  // Both loads import blocks before either ends (one at a time, the second would import none
  // until the first ended).
  bool both = false;
  for (int i = 0; i < 2000 && core.num_store_loads() == 2 && !both; ++i) {
    const std::vector<int64_t> n = core.store_load_blocks();
    both = n.size() == 2 && n[0] > 0 && n[1] > 0;
    if (!both) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      core.step();
    }
  }
  EXPECT_TRUE(both) << "the two documents' loads never advanced together";
  const std::vector<RequestOutput> out = finish(core);
  expect_same(out[0], reference()[0]);
  expect_same(out[1], other_alone);
  EXPECT_EQ(out[0].metrics.num_cached_tokens, kLongBlocks * kBlock);
  EXPECT_EQ(out[1].metrics.num_cached_tokens, kOtherBlocks * kBlock);
  const EngineStats s = core.stats();
  EXPECT_EQ(s.kv_store_hits, kLongBlocks + kOtherBlocks);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(core.num_store_loads(), 0);
  core.check_consistency();
}

TEST(KvStoreAsync, StoreKilledMidLoadOnlyCostsARecompute) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  fill_store(redis.url());
  LLM y(config(redis.url()));
  EngineCore& core = engine_core(y);
  start_b_then_a(core);
  // Some of A's blocks read (at most the 8 read ahead: the loader waits for their import).
  for (int i = 0; i < 500 && core.stats().kv_store_hits == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    core.step();
  }
  ASSERT_GT(core.stats().kv_store_hits, 0);
  EXPECT_EQ(core.num_store_loads(), 1);
  redis.stop_process();
  const std::vector<RequestOutput> out = finish(core);
  expect_same(out[0], reference()[0]);
  expect_same(out[1], reference()[1]);
  const EngineStats s = core.stats();
  EXPECT_LT(s.kv_store_hits, kLongBlocks);
  EXPECT_GT(s.kv_store_errors, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  core.check_consistency();
}

}  // namespace
}  // namespace longctx
