// The KV store's block I/O, device-agnostic (docs/fleet.md, "Shared KV store"): the staging
// buffers a GPU executor copies blocks into (a fixed pool: a block finding none is dropped and
// counted), the writer thread reading a staged block only once its copy finished, and reads by
// several threads (a connection each) handed on in order, ending at the first missing block,
// with every connection answering the next lookup with its own replies. Against a real redis-server
// (the tests fail without it), with plain host buffers standing in for pinned ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/redis_server.h"
#include "engine/kv_block_buffers.h"
#include "engine/kv_store.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

constexpr int64_t kBlock = 4;
constexpr int64_t kBytes = 4096;

std::vector<int32_t> tokens_of(uint64_t h) {
  return {static_cast<int32_t>(h), 1, 2, static_cast<int32_t>(h + 7)};
}

// Block h's bytes: every byte depends on h and its offset.
std::string bytes_of(uint64_t h) {
  std::string s(kBytes, '\0');
  for (int64_t i = 0; i < kBytes; ++i) s[i] = static_cast<char>((h * 131 + i * 7) & 0xff);
  return s;
}

// A latch the test opens, standing in for a device copy that has not finished.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  }
};

TEST(KvBlockBuffers, TakesEveryBufferOnceAndCountsExhaustion) {
  KvBlockBuffers b(3, 64, /*pinned=*/false);
  EXPECT_EQ(b.num_free(), 3);
  std::vector<int32_t> taken;
  for (int i = 0; i < 3; ++i) taken.push_back(b.try_take());
  EXPECT_EQ(b.try_take(), -1);
  EXPECT_EQ(b.try_take(), -1);
  EXPECT_EQ(b.exhausted(), 2);
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<int32_t>{0, 1, 2}));
  // Distinct, non-overlapping buffers of the block's size.
  for (int32_t i : taken) {
    EXPECT_EQ(b.bytes(i).size(), 64u);
    std::memset(b.bytes(i).data(), i + 1, 64);
  }
  for (int32_t i : taken) EXPECT_EQ(static_cast<int>(b.bytes(i)[63]), i + 1);
  b.give_back(taken[1]);
  EXPECT_EQ(b.num_free(), 1);
  EXPECT_EQ(b.try_take(), taken[1]);
  b.give_back(taken[0]);
  EXPECT_THROW(b.give_back(taken[0]), Error);  // not taken any more
  EXPECT_THROW(b.bytes(3), Error);
  EXPECT_THROW(KvBlockBuffers(0, 64, false), Error);
}

TEST(KvBlockBuffers, CountIsBoundedByBytes) {
  EXPECT_EQ(KvBlockBuffers::count_for(int64_t{1} << 30, 16 << 20, 4, 256), 64);
  EXPECT_EQ(KvBlockBuffers::count_for(int64_t{1} << 30, 4096, 4, 256), 256);
  EXPECT_EQ(KvBlockBuffers::count_for(1 << 20, 16 << 20, 4, 256), 4);
}

// The writer thread reads a staged block only after the copy into it finished: the "copy" here
// fills the buffer inside the wait, so a writer that read earlier would store garbage (the
// value's checksum covers the bytes it read, so a read-back could not tell; the bytes are
// compared). Staging buffers all taken: the block is dropped and counted, never waited for.
TEST(KvStore, StagedWritesWaitForTheCopyAndDropWhenNoBufferIsFree) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  KvStore store(redis.url(), "io", kBlock, kBytes, /*timeout_ms=*/2000, /*max_queued_writes=*/64,
                /*pinned_staging=*/false, /*staging_bytes=*/kBytes);  // 4 buffers (the least)
  ASSERT_EQ(store.staging_buffers().count(), 4);
  Gate gate;
  std::vector<std::vector<int32_t>> tokens;
  for (uint64_t h = 1; h <= 6; ++h) tokens.push_back(tokens_of(h));
  int64_t staged = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t h = 1; h <= 6; ++h) {
    const int32_t b = store.take_staging();
    if (b < 0) continue;
    ++staged;
    std::span<std::byte> dst = store.staging(b);
    std::memset(dst.data(), 0xee, dst.size());  // what an early reader would see
    store.put_staged(h, h - 1, tokens[h - 1], b, [&gate, dst, h] {
      gate.wait();
      const std::string want = bytes_of(h);
      std::memcpy(dst.data(), want.data(), want.size());
    });
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5)
      << "put_staged() waited for the copy";
  EXPECT_EQ(staged, 4);
  EXPECT_EQ(store.stats().writes_dropped, 2);
  EXPECT_EQ(store.staging_buffers().exhausted(), 2);
  gate.release();
  store.flush();
  EXPECT_EQ(store.staging_buffers().num_free(), 4);
  for (uint64_t h = 1; h <= 4; ++h) {
    const std::optional<std::string> got = store.get(h, h - 1, tokens[h - 1]);
    ASSERT_TRUE(got.has_value()) << "block " << h;
    EXPECT_EQ(*got, bytes_of(h)) << "block " << h;
  }
  EXPECT_FALSE(store.get(5, 4, tokens[4]).has_value());  // dropped
  EXPECT_EQ(store.stats().errors, 0);
}

// Reads ahead by several threads: blocks handed on in order until the first the store lacks;
// what was read past the end of the lookup is dropped, and the next lookups get their own
// values.
TEST(KvStore, ParallelReadsAreHandedOnInOrderUntilTheFirstMiss) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  KvStore store(redis.url(), "io", kBlock, kBytes);
  constexpr uint64_t kBlocks = 12;
  std::vector<std::vector<int32_t>> tokens;
  for (uint64_t h = 1; h <= kBlocks; ++h) tokens.push_back(tokens_of(h));
  for (uint64_t h = 1; h <= kBlocks; ++h)
    if (h != 9) store.put(h, h - 1, tokens[h - 1], bytes_of(h));  // 9 is missing
  store.flush();
  std::vector<KvStoreBlockRef> refs;
  for (uint64_t h = 1; h <= kBlocks; ++h) refs.push_back({h, h - 1, tokens[h - 1]});

  std::vector<size_t> seen;
  auto check = [&](size_t i, std::span<const std::byte> bytes) {
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
              bytes_of(refs[i].hash))
        << "block " << i;
    seen.push_back(i);
    return true;
  };
  EXPECT_EQ(store.get_prefix(refs, check), 8);
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(store.stats().hits, 8);
  EXPECT_EQ(store.stats().misses, 1);

  // The caller stops after two blocks (no room): two taken, the GETs after them drained.
  seen.clear();
  int calls = 0;
  EXPECT_EQ(store.get_prefix(std::span(refs).subspan(2),
                             [&](size_t i, std::span<const std::byte> bytes) {
                               ++calls;
                               return check(i + 2, bytes) && calls <= 2;
                             }),
            2);
  EXPECT_EQ(calls, 3);
  // Each next lookup gets its own value, not one read ahead for the last.
  for (uint64_t h : {10ull, 1ull, 12ull}) {
    const std::optional<std::string> got = store.get(h, h - 1, tokens[h - 1]);
    ASSERT_TRUE(got.has_value()) << "block " << h;
    EXPECT_EQ(*got, bytes_of(h)) << "block " << h;
  }
  EXPECT_EQ(store.stats().errors, 0);

  // A value that fails its check ends the lookup like a miss (counted as an error).
  const std::vector<int32_t> other = tokens_of(99);
  std::vector<KvStoreBlockRef> wrong = {refs[0], {refs[1].hash, refs[1].parent, other}, refs[2]};
  seen.clear();
  EXPECT_EQ(store.get_prefix(wrong, check), 1);
  EXPECT_EQ(store.stats().errors, 1);
  EXPECT_TRUE(store.get(3, 2, tokens[2]).has_value());
}

}  // namespace
}  // namespace longctx
