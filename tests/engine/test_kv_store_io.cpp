// The KV store's block I/O, device-agnostic (docs/fleet.md, "Shared KV store"): the staging
// buffers a GPU executor copies blocks into (allocated on demand up to a bound), the export queue
// where blocks wait for a buffer (bounded; a waiting block about to be overwritten is dropped),
// the writer thread reading a staged block only once its copy finished, values split into chunks
// (a missing, corrupted or misplaced chunk costs its block, nothing else), and reads by several
// threads (a connection each, pipelined) handed on in order, ending at the first missing block,
// a read buffer refilled only after the caller's copy out of it. Against a real redis-server (the
// tests fail without it), with plain host buffers standing in for pinned ones.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
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
constexpr int64_t kChunk = 1024;  // 4 chunks a block
// A chunk's header before the tokens (kv_store.cpp): magic, format, block size, chunk, chunks,
// parent, hash, block bytes, checksum.
constexpr int64_t kHeader = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8;

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

// Buffers are allocated by grow(), up to the count: try_take() never allocates, and asks for more
// (wants_growth) only while the count allows more.
TEST(KvBlockBuffers, GrowOnDemandUpToTheCount) {
  KvBlockBuffers b(6, 64, /*pinned=*/false, /*initial=*/0);
  EXPECT_EQ(b.allocated(), 0);
  EXPECT_FALSE(b.wants_growth());
  EXPECT_EQ(b.try_take(), -1);
  EXPECT_TRUE(b.wants_growth());
  EXPECT_THROW(b.bytes(0), Error);  // not allocated
  EXPECT_EQ(b.grow(4), 4);
  EXPECT_FALSE(b.wants_growth());
  EXPECT_EQ(b.allocated(), 4);
  std::vector<int32_t> taken;
  for (int i = 0; i < 4; ++i) taken.push_back(b.try_take());
  EXPECT_EQ(b.try_take(), -1);
  EXPECT_TRUE(b.wants_growth());
  EXPECT_EQ(b.grow(8), 2);  // the count's bound
  EXPECT_EQ(b.allocated(), 6);
  for (int i = 0; i < 2; ++i) taken.push_back(b.try_take());
  std::sort(taken.begin(), taken.end());
  EXPECT_EQ(taken, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  for (int32_t i : taken) std::memset(b.bytes(i).data(), i + 1, 64);
  for (int32_t i : taken) EXPECT_EQ(static_cast<int>(b.bytes(i)[0]), i + 1);
  EXPECT_EQ(b.try_take(), -1);
  EXPECT_FALSE(b.wants_growth());  // all allocated: nothing to ask for
  EXPECT_EQ(b.grow(1), 0);
  EXPECT_EQ(b.exhausted(), 3);
}

// A hiredis client on the side, to delete, corrupt and move chunks.
class Client {
 public:
  explicit Client(int port) : ctx_(redisConnect("127.0.0.1", port)) {
    EXPECT_TRUE(ctx_ != nullptr && ctx_->err == 0);
  }
  ~Client() { redisFree(ctx_); }
  std::string get(const std::string& k) {
    auto* r = static_cast<redisReply*>(redisCommand(ctx_, "GET %b", k.data(), k.size()));
    std::string v =
        r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
    if (r != nullptr) freeReplyObject(r);
    return v;
  }
  void set(const std::string& k, const std::string& v) {
    freeReplyObject(redisCommand(ctx_, "SET %b %b", k.data(), k.size(), v.data(), v.size()));
  }
  void del(const std::string& k) {
    freeReplyObject(redisCommand(ctx_, "DEL %b", k.data(), k.size()));
  }

 private:
  redisContext* ctx_;
};

KvStoreOptions chunked() {
  KvStoreOptions o;
  o.chunk_bytes = kChunk;
  return o;
}

// Blocks wait in the export queue (its bound drops the rest, counted) until a staging buffer is
// free, and start_exports() never waits for a copy or the store; the writer thread reads a
// staged block only after its copy finished: the "copy" fills the buffer inside the wait, so a
// writer that read earlier would store garbage (the value's checksum covers the bytes it read, so
// a read-back could not tell; the bytes are compared). A waiting block that is about to be
// overwritten is dropped (counted); every other block reaches the store.
TEST(KvStore, ExportsWaitForAStagingBufferAndAreAllWritten) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  KvStoreOptions o = chunked();
  o.staging_bytes = kBytes;  // 4 buffers (the least)
  o.max_waiting_exports = 6;
  KvStore store(redis.url(), "io", kBlock, kBytes, o);
  store.flush();  // the writer allocated its first staging buffers
  ASSERT_EQ(store.staging_buffers().count(), 4);
  ASSERT_EQ(store.staging_buffers().allocated(), 4);
  // The engine's pool: block id b + 100 holds block hash b.
  std::vector<std::vector<int32_t>> tokens;
  for (uint64_t h = 1; h <= 8; ++h) tokens.push_back(tokens_of(h));
  for (uint64_t h = 1; h <= 8; ++h)
    store.queue_export(static_cast<int32_t>(h + 100), h, h - 1, tokens[h - 1]);
  EXPECT_EQ(store.num_waiting_exports(), 6u);
  EXPECT_EQ(store.stats().writes_dropped, 2);  // blocks 7 and 8: the queue's bound
  Gate gate;
  std::vector<int32_t> copied;
  auto copy = [&](int32_t block, std::span<std::byte> dst) -> std::function<void()> {
    copied.push_back(block);
    std::memset(dst.data(), 0xee, dst.size());  // what an early reader would see
    return [&gate, dst, block] {
      gate.wait();
      const std::string want = bytes_of(static_cast<uint64_t>(block - 100));
      std::memcpy(dst.data(), want.data(), want.size());
    };
  };
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(store.start_exports(copy), 4);
  EXPECT_EQ(store.start_exports(copy), 0);  // every buffer taken, the copies not finished
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5)
      << "start_exports() waited for the copy";
  EXPECT_EQ(copied, (std::vector<int32_t>{101, 102, 103, 104}));
  EXPECT_EQ(store.num_waiting_exports(), 2u);
  const int32_t overwritten[] = {106, 42};  // block 6 is about to be overwritten
  store.forget_exports(overwritten);
  EXPECT_EQ(store.num_waiting_exports(), 1u);
  EXPECT_EQ(store.stats().writes_dropped, 3);
  gate.release();
  while (store.num_waiting_exports() > 0) {
    store.start_exports(copy);
    store.flush();
  }
  EXPECT_EQ(copied, (std::vector<int32_t>{101, 102, 103, 104, 105}));
  EXPECT_EQ(store.staging_buffers().num_free(), 4);
  for (uint64_t h = 1; h <= 5; ++h) {
    const std::optional<std::string> got = store.get(h, h - 1, tokens[h - 1]);
    ASSERT_TRUE(got.has_value()) << "block " << h;
    EXPECT_EQ(*got, bytes_of(h)) << "block " << h;
  }
  for (uint64_t h = 6; h <= 8; ++h) EXPECT_FALSE(store.get(h, h - 1, tokens[h - 1]).has_value());
  EXPECT_EQ(store.stats().errors, 0);
  EXPECT_EQ(store.stats().bytes_written, 5 * (kBytes + 4 * (kHeader + kBlock * 4)));
}

// A block is one key a chunk; a missing chunk (evicted) is a miss of its block, a corrupted one or
// one under another chunk's key an error: either way the lookup ends there (the caller recomputes
// from there) and the blocks before it are read.
TEST(KvStore, AMissingOrCorruptedChunkCostsItsBlock) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  KvStore store(redis.url(), "io", kBlock, kBytes, chunked());
  ASSERT_EQ(store.num_chunks(), 4);
  std::vector<std::vector<int32_t>> tokens;
  for (uint64_t h = 1; h <= 3; ++h) tokens.push_back(tokens_of(h));
  std::vector<KvStoreBlockRef> refs;
  for (uint64_t h = 1; h <= 3; ++h) refs.push_back({h, h - 1, tokens[h - 1]});
  auto write_all = [&] {
    for (uint64_t h = 1; h <= 3; ++h) store.put(h, h - 1, tokens[h - 1], bytes_of(h));
    store.flush();
  };
  auto read = [&] {
    return store.get_prefix(refs, [&](size_t i, std::span<const std::byte> bytes, auto*) {
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                bytes_of(i + 1));
      return true;
    });
  };
  write_all();
  EXPECT_EQ(read(), 3);
  Client redis_client(redis.port());
  // Each chunk is its own value: the header, the tokens, a quarter of the block.
  EXPECT_EQ(redis_client.get(store.key(2, 3)).size(), kHeader + kBlock * 4 + kChunk);
  EXPECT_EQ(redis_client.get(store.key(2, 4)), "");  // no fifth chunk

  redis_client.del(store.key(2, 2));
  EXPECT_EQ(read(), 1);
  EXPECT_EQ(store.stats().misses, 1);
  EXPECT_EQ(store.stats().errors, 0);

  write_all();
  std::string v = redis_client.get(store.key(2, 1));
  v[v.size() - 10] ^= 0x01;  // one bit of the block's bytes
  redis_client.set(store.key(2, 1), v);
  EXPECT_EQ(read(), 1);
  EXPECT_EQ(store.stats().errors, 1);

  write_all();
  redis_client.set(store.key(2, 3), redis_client.get(store.key(2, 0)));  // a valid chunk, misplaced
  EXPECT_EQ(read(), 1);
  EXPECT_EQ(store.stats().errors, 2);

  write_all();
  redis_client.set(store.key(3, 0), "LCKV");  // truncated
  EXPECT_EQ(read(), 2);
  EXPECT_EQ(store.stats().errors, 3);

  write_all();
  EXPECT_EQ(read(), 3);
  EXPECT_EQ(store.stats().errors, 3);
}

// Reads ahead by several threads: blocks handed on in order until the first the store lacks;
// what was read past the end of the lookup is dropped, and the next lookups get their own
// values. A read buffer is refilled only after the caller's copy out of it (reuse_after) returned,
// and get_prefix() returns after every such copy.
TEST(KvStore, ParallelReadsAreHandedOnInOrderUntilTheFirstMiss) {
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.up());
  KvStore store(redis.url(), "io", kBlock, kBytes, chunked());
  constexpr uint64_t kBlocks = 24;  // three times the read-ahead: every read buffer reused
  std::vector<std::vector<int32_t>> tokens;
  for (uint64_t h = 1; h <= kBlocks; ++h) tokens.push_back(tokens_of(h));
  for (uint64_t h = 1; h <= kBlocks; ++h)
    if (h != 21) store.put(h, h - 1, tokens[h - 1], bytes_of(h));  // 21 is missing
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
  // Each block's "copy" runs later, on another thread, and checks the bytes are still the block's.
  std::atomic<int> copies_done{0};
  std::vector<std::thread> copiers;
  auto on_hit = [&](size_t i, std::span<const std::byte> bytes, std::function<void()>* reuse) {
    auto done = std::make_shared<Gate>();
    copiers.emplace_back([&, i, bytes, done] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                bytes_of(refs[i].hash))
          << "block " << i << "'s read buffer was refilled before its copy finished";
      ++copies_done;
      done->release();
    });
    *reuse = [done] { done->wait(); };
    return check(i, bytes);
  };
  EXPECT_EQ(store.get_prefix(refs, on_hit), 20);
  EXPECT_EQ(copies_done.load(), 20) << "get_prefix returned before the copies";
  for (auto& t : copiers) t.join();
  std::vector<size_t> want(20);
  for (size_t i = 0; i < want.size(); ++i) want[i] = i;
  EXPECT_EQ(seen, want);
  EXPECT_EQ(store.stats().hits, 20);
  EXPECT_EQ(store.stats().misses, 1);

  // The caller stops after two blocks (no room): two taken, the GETs after them drained.
  seen.clear();
  int calls = 0;
  EXPECT_EQ(store.get_prefix(std::span(refs).subspan(2),
                             [&](size_t i, std::span<const std::byte> bytes, auto*) {
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
  EXPECT_EQ(store.get_prefix(
                wrong, [&](size_t i, std::span<const std::byte> b, auto*) { return check(i, b); }),
            1);
  EXPECT_EQ(store.stats().errors, 1);
  EXPECT_TRUE(store.get(3, 2, tokens[2]).has_value());
}

}  // namespace
}  // namespace longctx
