// The shared KV store (--kv-store) against a real redis-server this test starts on a free
// loopback port (Debian's redis-server; the test fails, not skips, without it): models/needle on
// the CPU, two engines over one store. The second engine's prefill of a prefix the first one
// computed reads it from the store and gives the tokens and logprobs a recomputation gives; a
// corrupted value, a store that is down, killed mid-run or never answers (a timeout) all end in
// the same outputs, counted as errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/redis_server.h"
#include "common/store_documents.h"
#include "engine/kv_store.h"
#include "engine/llm_internal.h"
#include "longctx/core/error.h"
#include "longctx/llm.h"

namespace longctx {
namespace {

constexpr int64_t kBlock = 16;

std::string needle_dir() { return std::string(LONGCTX_SOURCE_DIR) + "/models/needle"; }

using testing::free_port;

// The store's process and a hiredis client to read and corrupt its values.
class RedisServer : public testing::RedisProcess {
 public:
  RedisServer() {
    if (up()) ctx_ = redisConnect("127.0.0.1", port());
    EXPECT_TRUE(ctx_ != nullptr && ctx_->err == 0) << "cannot connect to redis-server";
  }
  ~RedisServer() override { stop(); }
  void stop() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
    stop_process();
  }
  // Every key of block hash `h` (one per chunk: the needle model's 128 KiB blocks are one).
  std::vector<std::string> keys_of(uint64_t h) {
    char pattern[64];
    std::snprintf(pattern, sizeof pattern, "longctx:kv:*:%016llx:*",
                  static_cast<unsigned long long>(h));
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "KEYS %s", pattern));
    std::vector<std::string> out;
    for (size_t i = 0; r != nullptr && i < r->elements; ++i)
      out.emplace_back(r->element[i]->str, r->element[i]->len);
    if (r != nullptr) freeReplyObject(r);
    return out;
  }
  void set(const std::string& key, const std::string& value) {
    auto* r = static_cast<redisReply*>(
        redisCommand(ctx_, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
    ASSERT_NE(r, nullptr);
    freeReplyObject(r);
  }
  std::string get(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "GET %b", key.data(), key.size()));
    std::string v =
        r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string();
    if (r != nullptr) freeReplyObject(r);
    return v;
  }

 private:
  redisContext* ctx_ = nullptr;
};

EngineConfig config(const std::string& store) {
  EngineConfig c;
  c.model = needle_dir();
  c.device = "cpu";
  c.block_size = kBlock;
  c.max_model_len = 512;
  c.cpu_kv_cache_bytes = 8ll << 20;
  c.kv_store = store;
  return c;
}

uint64_t block_hash(const std::vector<int32_t>& t, int64_t block) {
  uint64_t h = 0;
  for (int64_t i = 0; i <= block; ++i) h = XXH64(t.data() + i * kBlock, kBlock * 4, h);
  return h;
}

SamplingParams greedy() {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 6;
  sp.logprobs = 2;
  return sp;
}

// One prompt's output (the store's engines run one prompt at a time).
RequestOutput run(LLM& llm, const std::vector<int32_t>& prompt) {
  auto out = llm.generate({Prompt(prompt)}, greedy(), false);
  engine_core(llm).flush_kv_store();
  return out.at(0);
}

void expect_same(const RequestOutput& got, const RequestOutput& want) {
  EXPECT_EQ(got.token_ids, want.token_ids);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i)
    EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4) << "token " << i;
}

// 10 full blocks before the last token, whose block is computed.
const std::vector<int32_t>& prompt() {
  static const std::vector<int32_t> p = [] {
    auto t = testing::store_document(3, 165);
    return t;
  }();
  return p;
}

const RequestOutput& reference() {
  static const RequestOutput r = [] {
    LLM llm(config(""));
    return run(llm, prompt());
  }();
  return r;
}

TEST(KvStore, SecondEngineReadsWhatTheFirstComputed) {
  RedisServer redis;
  ASSERT_TRUE(redis.up());
  LLM a(config(redis.url()));
  expect_same(run(a, prompt()), reference());
  EngineStats sa = engine_core(a).stats();
  EXPECT_EQ(sa.kv_store_hits, 0);
  EXPECT_EQ(sa.kv_store_misses, 1);  // the first block: nothing further is asked
  EXPECT_GT(sa.kv_store_bytes_written, 0);
  EXPECT_EQ(sa.kv_store_errors, 0);
  EXPECT_EQ(redis.keys_of(block_hash(prompt(), 9)).size(), 1u);

  LLM b(config(redis.url()));
  const RequestOutput ob = run(b, prompt());
  expect_same(ob, reference());
  EXPECT_EQ(ob.metrics.num_cached_tokens, 160);  // every full block before the last token
  EngineStats sb = engine_core(b).stats();
  EXPECT_EQ(sb.kv_store_hits, 10);
  EXPECT_EQ(sb.kv_store_errors, 0);
  EXPECT_EQ(sb.kv_store_bytes_read, 10 * 8 * 2 * kBlock * 2 * 64 * 4);
  // B computed no full block (the prompt's were read, the generated tokens fill none): it wrote
  // nothing.
  EXPECT_EQ(sb.kv_store_bytes_written, 0);
  engine_core(b).check_consistency();
}

TEST(KvStore, CorruptedValuesAreRecomputed) {
  RedisServer redis;
  ASSERT_TRUE(redis.up());
  {
    LLM a(config(redis.url()));
    run(a, prompt());
  }
  // Block 4: one flipped byte in its K/V (the checksum); block 7: a value of another block.
  const auto k4 = redis.keys_of(block_hash(prompt(), 4));
  const auto k7 = redis.keys_of(block_hash(prompt(), 7));
  const auto k2 = redis.keys_of(block_hash(prompt(), 2));
  ASSERT_EQ(k4.size(), 1u);
  ASSERT_EQ(k7.size(), 1u);
  std::string v = redis.get(k4[0]);
  v[v.size() / 2] ^= 0x40;
  redis.set(k4[0], v);
  LLM b(config(redis.url()));
  expect_same(run(b, prompt()), reference());
  EngineStats s = engine_core(b).stats();
  EXPECT_EQ(s.kv_store_hits, 4);  // blocks 0-3, then the corrupted one ends the read
  EXPECT_EQ(s.kv_store_errors, 1);
  // Block 4 was recomputed and written again; now block 7 holds block 2's (valid) value.
  redis.set(k7[0], redis.get(k2[0]));
  LLM c(config(redis.url()));
  expect_same(run(c, prompt()), reference());
  EXPECT_EQ(engine_core(c).stats().kv_store_hits, 7);
  EXPECT_EQ(engine_core(c).stats().kv_store_errors, 1);
  // Block 0 truncated: nothing is read.
  const auto k0 = redis.keys_of(block_hash(prompt(), 0));
  redis.set(k0[0], redis.get(k0[0]).substr(0, 100));
  LLM c2(config(redis.url()));
  expect_same(run(c2, prompt()), reference());
  EXPECT_EQ(engine_core(c2).stats().kv_store_hits, 0);
  EXPECT_EQ(engine_core(c2).stats().kv_store_errors, 1);
  redis.set(k0[0], "");  // an empty value
  LLM d(config(redis.url()));
  expect_same(run(d, prompt()), reference());
  EXPECT_EQ(engine_core(d).stats().kv_store_errors, 1);
}

TEST(KvStore, DownKilledOrSilentStoreOnlyCostsARecompute) {
  {  // nothing listens
    LLM a(config("redis://127.0.0.1:" + std::to_string(free_port())));
    expect_same(run(a, prompt()), reference());
    EXPECT_GT(engine_core(a).stats().kv_store_errors, 0);
  }
  {  // killed between two requests of one engine
    RedisServer redis;
    ASSERT_TRUE(redis.up());
    LLM a(config(redis.url()));
    expect_same(run(a, testing::store_document(5, 100)), run(a, testing::store_document(5, 100)));
    redis.stop();
    expect_same(run(a, prompt()), reference());
    EXPECT_GT(engine_core(a).stats().kv_store_errors, 0);
  }
  {  // accepts connections (the kernel's backlog) but never answers: every read times out
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    LLM a(config("redis://127.0.0.1:" + std::to_string(ntohs(addr.sin_port))));
    const auto t0 = std::chrono::steady_clock::now();
    expect_same(run(a, prompt()), reference());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0) << "a silent store must cost a timeout, not a hang";
    EXPECT_GT(engine_core(a).stats().kv_store_errors, 0);
    ::close(fd);
  }
}

// A store that never answers: put() never waits, the queue stays bounded (what does not fit is
// dropped and counted), and the store shuts down without hanging on what is queued.
TEST(KvStore, WritesToASilentStoreAreBoundedAndNeverWait) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::vector<int32_t> tokens(kBlock, 7);
  const auto t0 = std::chrono::steady_clock::now();
  {
    KvStoreOptions o;
    o.timeout_ms = 100;
    o.max_queued_writes = 8;
    KvStore store("redis://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), "test", kBlock, 4096,
                  o);
    for (uint64_t h = 1; h <= 200; ++h) store.put(h, h - 1, tokens, std::string(4096, 'x'));
    const double put_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(put_s, 0.5) << "put() waited for the store";
    const KvStoreStats s = store.stats();
    EXPECT_GE(s.writes_dropped, 200 - 8 - 1);  // the queue and the one being sent
    EXPECT_EQ(s.bytes_written, 0);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 3.0) << "shutting down waited on the silent store";
  ::close(fd);
}

TEST(KvStore, BadConfigurationIsAClearError) {
  auto fails = [](EngineConfig c, const char* needle) {
    try {
      LLM llm(c);
      ADD_FAILURE() << "accepted " << c.kv_store;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails(config("redis:/127.0.0.1:6379"), "expected redis://HOST:PORT");
  fails(config("redis://127.0.0.1"), "expected redis://HOST:PORT");
  fails(config("redis://127.0.0.1:99999"), "is not in [1, 65535]");
  EngineConfig c = config("redis://127.0.0.1:6379");
  c.enable_prefix_caching = false;
  fails(c, "--kv-store needs prefix caching");
}

}  // namespace
}  // namespace longctx
