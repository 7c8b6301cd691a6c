// The shared KV store under KV offload (docs/fleet.md, "Shared KV store"), against a real
// redis-server on a free loopback port (Debian's redis-server; the test fails, not skips, without
// it): models/needle on the CPU executor with the CPU simulation of the offload (host pool, GPU
// cache, ring; a write-back lands a step late). An offloaded engine's blocks are its host pool's:
// a store hit is imported into the host copy (its tier there) and reaches the GPU cache through
// the ring or a reload like any host block, an export reads the GPU cache's full copy or the host
// copy. The bytes are the resident pool's, so offloaded and resident replicas share the store.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/redis_server.h"
#include "common/store_documents.h"
#include "engine/engine_core.h"
#include "longctx/engine/executor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kDocBlocks = 40;  // the document's full blocks: more than the GPU cache
constexpr int64_t kGpuBlocks = 24;  // the simulated GPU cache
constexpr int64_t kHostBlocks = 96;
constexpr int64_t kTokens = 6;

std::shared_ptr<Model> needle() {
  static auto ck = std::make_shared<const Checkpoint>(
      load_checkpoint(std::string(LONGCTX_SOURCE_DIR) + "/models/needle"));
  return create_model(ck, ModelBuildOptions{});
}

std::unique_ptr<EngineCore> engine(const std::string& store, bool offload) {
  CpuExecutorOptions x;
  x.block_size = kBlock;
  x.num_blocks = kHostBlocks;
  if (offload) {
    x.offload_gpu_blocks = kGpuBlocks;
    x.offload_slots = 2;
    x.offload_slot_blocks = 8;
  }
  EngineCoreOptions o;
  o.max_model_len = 1024;
  o.scheduler.max_num_batched_tokens = 128;
  o.scheduler.max_num_seqs = 4;
  o.enable_prefix_caching = true;
  o.kv_store = store;
  o.kv_store_namespace = "needle";
  o.kv_medium = offload ? KvMedium::kCpu : KvMedium::kGpu;
  return std::make_unique<EngineCore>(make_cpu_executor(needle(), x), nullptr, o);
}

const std::vector<int32_t>& doc_prompt() {  // kDocBlocks full blocks before its last token
  static const std::vector<int32_t> p = testing::store_document(5, kDocBlocks * kBlock + 9);
  return p;
}

std::vector<RequestOutput> run(EngineCore& core, const std::vector<std::vector<int32_t>>& prompts,
                               int64_t tokens = kTokens) {
  for (size_t i = 0; i < prompts.size(); ++i)
    core.add_request(i, prompts[i], testing::store_greedy(tokens), now_seconds());
  while (core.has_unfinished()) core.step();
  std::vector<RequestOutput> out(prompts.size());
  for (RequestOutput& o : core.take_finished()) out.at(o.index) = std::move(o);
  return out;
}

void expect_same(const RequestOutput& got, const RequestOutput& want) {
  EXPECT_EQ(got.token_ids, want.token_ids);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i)
    EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4) << "token " << i;
}

// The document's output without a store, offloaded and resident.
const RequestOutput& reference(bool offload) {
  static const RequestOutput off = run(*engine("", true), {doc_prompt()}).at(0);
  static const RequestOutput res = run(*engine("", false), {doc_prompt()}).at(0);
  return offload ? off : res;
}

// Engine A (offloaded) computes the document and writes its blocks behind; returns its TTFT.
double fill_store(const std::string& url) {
  auto a = engine(url, true);
  const RequestOutput out = run(*a, {doc_prompt()}).at(0);
  expect_same(out, reference(true));
  a->flush_kv_store();
  EXPECT_GT(a->stats().kv_store_bytes_written, 0) << "A wrote nothing";
  return out.metrics.ttft();
}

// Every block and every host-pool block back, the block manager's books consistent.
void expect_nothing_held(EngineCore& core) {
  EXPECT_EQ(core.num_store_loads(), 0);
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  core.check_consistency();
}

TEST(KvStoreOffload, AnOffloadedReplicaReadsWhatAnotherComputed) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  const double recompute_ttft = fill_store(redis.url());

  // B, offloaded: the hit's 40 blocks go into its host pool (more than its 24-block GPU cache),
  // then through the ring; the output is the one computed without a store.
  auto b = engine(redis.url(), true);
  const RequestOutput hit = run(*b, {doc_prompt()}).at(0);
  expect_same(hit, reference(true));
  EXPECT_EQ(hit.metrics.num_cached_tokens, kDocBlocks * kBlock);
  const EngineStats s = b->stats();
  EXPECT_EQ(s.kv_store_hits, kDocBlocks);
  EXPECT_EQ(s.kv_store_errors, 0);
  EXPECT_GT(s.executor.offload_host_bytes_loaded, 0) << "the hit never went through the ring";
  EXPECT_LT(hit.metrics.ttft(), recompute_ttft);
  std::printf("offloaded: TTFT %.1f ms computed, %.1f ms as a store hit (%.1fx)\n",
              recompute_ttft * 1e3, hit.metrics.ttft() * 1e3, recompute_ttft / hit.metrics.ttft());
  expect_nothing_held(*b);
  // Again on B: a local prefix hit of the imported host blocks, no store read.
  const RequestOutput again = run(*b, {doc_prompt()}).at(0);
  expect_same(again, reference(true));
  EXPECT_EQ(again.metrics.num_cached_tokens, kDocBlocks * kBlock);
  EXPECT_EQ(b->stats().kv_store_hits, kDocBlocks);

  // C, resident: the offloaded replica's blocks are in the resident pool's format.
  auto c = engine(redis.url(), false);
  const RequestOutput res = run(*c, {doc_prompt()}).at(0);
  expect_same(res, reference(false));
  EXPECT_EQ(res.metrics.num_cached_tokens, kDocBlocks * kBlock);
  EXPECT_EQ(c->stats().kv_store_hits, kDocBlocks);
  expect_nothing_held(*c);
}

// A resident replica writes, an offloaded one reads; B's other request decodes meanwhile.
TEST(KvStoreOffload, AResidentReplicasBlocksLoadIntoTheHostPoolBesideADecode) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  {
    auto a = engine(redis.url(), false);
    run(*a, {doc_prompt()}, 1);
    a->flush_kv_store();
  }
  auto b = engine(redis.url(), true);
  const std::vector<int32_t> other = testing::store_document(17, 40);
  b->add_request(1, other, testing::store_greedy(48), now_seconds());
  while (b->stats().generation_tokens < 2) b->step();
  b->add_request(0, doc_prompt(), testing::store_greedy(kTokens), now_seconds());
  int64_t b_steps = 0;
  while (b->has_unfinished()) {
    const int64_t before = b->stats().generation_tokens;
    b->step();
    if (b->num_store_loads() > 0 && b->stats().generation_tokens > before) ++b_steps;
  }
  std::vector<RequestOutput> out(2);
  for (RequestOutput& o : b->take_finished()) out.at(o.index) = std::move(o);
  expect_same(out[0], reference(true));
  EXPECT_EQ(out[0].metrics.num_cached_tokens, kDocBlocks * kBlock);
  EXPECT_EQ(out[1].token_ids, run(*engine("", true), {other}, 48).at(0).token_ids);
  EXPECT_GT(b_steps, 0) << "the other request never decoded while the document loaded";
  expect_nothing_held(*b);
}

TEST(KvStoreOffload, AbortMidLoadLeaksNothing) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  fill_store(redis.url());
  auto b = engine(redis.url(), true);
  const uint64_t id =
      b->add_request(0, doc_prompt(), testing::store_greedy(kTokens), now_seconds());
  for (int i = 0; i < 500 && b->stats().kv_blocks_used == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    b->step();
  }
  EXPECT_GT(b->stats().kv_blocks_used, 0) << "no block was imported";
  EXPECT_EQ(b->num_store_loads(), 1);
  EXPECT_EQ(b->stats().num_running, 0);  // held while it loads
  EXPECT_TRUE(b->abort(id));
  while (b->has_unfinished()) b->step();
  expect_nothing_held(*b);
  // The engine goes on: the document again, read whole, and computed output equal.
  const RequestOutput again = run(*b, {doc_prompt()}).at(0);
  expect_same(again, reference(true));
  EXPECT_EQ(again.metrics.num_cached_tokens, kDocBlocks * kBlock);
  expect_nothing_held(*b);
}

uint64_t block_hash(const std::vector<int32_t>& t, int64_t block) {
  uint64_t h = 0;
  for (int64_t i = 0; i <= block; ++i) h = XXH64(t.data() + i * kBlock, kBlock * 4, h);
  return h;
}

// One byte in the middle of block hash `h`'s value (one chunk: the needle's blocks are 128 KiB).
void flip_a_byte(int port, uint64_t h) {
  redisContext* ctx = redisConnect("127.0.0.1", port);
  ASSERT_TRUE(ctx != nullptr && ctx->err == 0);
  auto* keys = static_cast<redisReply*>(
      redisCommand(ctx, "KEYS longctx:kv:*:%016llx:*", static_cast<unsigned long long>(h)));
  ASSERT_TRUE(keys != nullptr && keys->elements == 1);
  const std::string key(keys->element[0]->str, keys->element[0]->len);
  freeReplyObject(keys);
  auto* got = static_cast<redisReply*>(redisCommand(ctx, "GET %b", key.data(), key.size()));
  ASSERT_TRUE(got != nullptr && got->type == REDIS_REPLY_STRING);
  std::string v(got->str, got->len);
  freeReplyObject(got);
  v[v.size() / 2] ^= 0x40;
  auto* set = static_cast<redisReply*>(
      redisCommand(ctx, "SET %b %b", key.data(), key.size(), v.data(), v.size()));
  ASSERT_NE(set, nullptr);
  freeReplyObject(set);
  redisFree(ctx);
}

// A corrupted value costs its block and the ones after it (recomputed); a store that is down
// costs the whole prefix. The output is the same either way.
TEST(KvStoreOffload, ACorruptOrDownStoreOnlyCostsARecompute) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  fill_store(redis.url());
  flip_a_byte(redis.port(), block_hash(doc_prompt(), 10));
  auto b = engine(redis.url(), true);
  const RequestOutput out = run(*b, {doc_prompt()}).at(0);
  expect_same(out, reference(true));
  EXPECT_EQ(out.metrics.num_cached_tokens, 10 * kBlock);  // blocks 0-9, block 10 fails its check
  EXPECT_EQ(b->stats().kv_store_hits, 10);
  EXPECT_EQ(b->stats().kv_store_errors, 1);
  expect_nothing_held(*b);

  redis.stop_process();
  auto c = engine(redis.url(), true);
  const RequestOutput down = run(*c, {doc_prompt()}).at(0);
  expect_same(down, reference(true));
  EXPECT_EQ(down.metrics.num_cached_tokens, 0);
  EXPECT_GT(c->stats().kv_store_errors, 0);
  expect_nothing_held(*c);
}

// The block I/O itself, without a store: an offloaded executor's blocks read as the resident
// executor's (from the GPU cache while resident and full, else from the host copy once its
// write-back landed), and an import replaces a block's content, a stale GPU copy included.
TEST(KvStoreOffload, OffloadedBlockIoReadsAndWritesTheResidentFormat) {
  constexpr int64_t kBlocks = 24, kChunk = 64;
  CpuExecutorOptions r;
  r.block_size = kBlock;
  r.num_blocks = 64;
  CpuExecutorOptions x = r;
  x.offload_gpu_blocks = 8;  // blocks 0-15 leave the GPU cache while the prefill goes on
  x.offload_slots = 2;
  x.offload_slot_blocks = 4;
  auto resident = make_cpu_executor(needle(), r);
  auto offloaded = make_cpu_executor(needle(), x);
  ASSERT_EQ(offloaded->kv_block_bytes(), resident->kv_block_bytes());
  ASSERT_EQ(offloaded->kv_block_format(), resident->kv_block_format());
  const std::vector<int32_t> tokens = testing::store_document(9, kBlocks * kBlock);
  std::vector<int32_t> table(kBlocks);
  for (int32_t i = 0; i < kBlocks; ++i) table[i] = i;
  for (int64_t at = 0; at < kBlocks * kBlock; at += kChunk) {
    StepInput in;
    in.seq_id = 1;
    in.all_tokens = tokens;
    in.num_computed = at;
    in.num_new = kChunk;
    in.block_table = table;
    resident->execute(std::span(&in, 1), {});
    offloaded->execute(std::span(&in, 1), {});
  }
  const auto bytes = static_cast<size_t>(resident->kv_block_bytes());
  auto read = [&](Executor& e, int32_t b) {
    std::vector<float> v(bytes / sizeof(float));
    e.read_kv_block(b, std::as_writable_bytes(std::span(v)));
    return v;
  };
  for (int32_t b = 0; b < kBlocks; ++b) {
    const std::vector<float> want = read(*resident, b), got = read(*offloaded, b);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1.0 + std::abs(want[i])));
    EXPECT_LT(worst, 1e-4) << "block " << b;  // the ring's merge order differs, not the layout
  }
  // Imports: into a free block (host copy only) and over block 23, resident on the GPU cache.
  const std::vector<float> five = read(*resident, 5);
  auto write = [&](int32_t b, const std::vector<float>& v) {
    offloaded->write_kv_block(b, std::as_bytes(std::span(v)));
  };
  write(40, five);
  EXPECT_EQ(read(*offloaded, 40), five);
  write(23, five);
  EXPECT_EQ(read(*offloaded, 23), five);
  // The asynchronous forms: the import's copy runs in its wait, on the thread that calls it.
  const std::vector<float> six = read(*resident, 6);
  auto wait = offloaded->write_kv_block_async(41, std::as_bytes(std::span(six)));
  ASSERT_TRUE(wait);
  std::thread([&] { wait(); }).join();
  EXPECT_EQ(read(*offloaded, 41), six);
}

}  // namespace
}  // namespace longctx
