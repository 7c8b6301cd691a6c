// Read throughput from a real local redis-server (issue 50's store hits): with LONGCTX_PERF=1,
// GETs of 16 MiB values against 1 MiB chunks over 1, 4 and 8 connections, read by hiredis (16 KiB
// reads into a reply buffer that grows, then a copy into the reply) and by a reader that takes the
// bulk length and receives the value straight into its destination; then KvStore::get_prefix.
// Prints GB/s; the one assertion is that every byte read is the value written.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/redis_server.h"
#include "engine/kv_store.h"

namespace longctx {
namespace {

bool perf_mode() {
  const char* v = std::getenv("LONGCTX_PERF");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

constexpr size_t kTotal = size_t{1} << 30;  // bytes read per measurement

std::string value_of(size_t i, size_t bytes) {
  std::string v(bytes, '\0');
  for (size_t j = 0; j < bytes; j += 4096) v[j] = static_cast<char>(i * 31 + j / 4096);
  return v;
}

redisContext* connect(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  EXPECT_TRUE(c != nullptr && c->err == 0);
  return c;
}

// Receives exactly n bytes.
bool recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, MSG_WAITALL);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// GET over the connection's socket: the bulk length, then the value straight into `out`.
bool raw_get(int fd, const std::string& key, char* out, size_t bytes) {
  const std::string cmd =
      "*2\r\n$3\r\nGET\r\n$" + std::to_string(key.size()) + "\r\n" + key + "\r\n";
  if (::send(fd, cmd.data(), cmd.size(), 0) != static_cast<ssize_t>(cmd.size())) return false;
  std::string head;
  char ch = 0;
  while (head.size() < 32 && recv_all(fd, &ch, 1) && ch != '\n') head.push_back(ch);
  if (head != "$" + std::to_string(bytes) + "\r") return false;
  char crlf[2];
  return recv_all(fd, out, bytes) && recv_all(fd, crlf, 2);
}

TEST(KvStoreThroughput, GetsOfWholeValuesAndChunks) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 runs it";
  for (const bool io_threads : {false, true}) {
    testing::RedisProcess redis(
        io_threads ? std::vector<std::string>{"--io-threads", "4", "--io-threads-do-reads", "yes"}
                   : std::vector<std::string>{});
    ASSERT_TRUE(redis.up());
    for (const size_t bytes : {size_t{16} << 20, size_t{4} << 20, size_t{1} << 20}) {
      const size_t n = kTotal / bytes;
      {
        redisContext* c = connect(redis.port());
        for (size_t i = 0; i < n; ++i) {
          const std::string k = "v" + std::to_string(bytes) + ":" + std::to_string(i);
          const std::string v = value_of(i, bytes);
          freeReplyObject(redisCommand(c, "SET %b %b", k.data(), k.size(), v.data(), v.size()));
        }
        redisFree(c);
      }
      for (const bool raw : {false, true}) {
        for (const int conns : {1, 4, 8}) {
          std::vector<std::thread> threads;
          std::vector<int> bad(conns, 0);
          const auto t0 = std::chrono::steady_clock::now();
          for (int t = 0; t < conns; ++t) {
            threads.emplace_back([&, t] {
              redisContext* c = connect(redis.port());
              std::vector<char> dst(bytes);
              for (size_t i = t; i < n; i += conns) {
                const std::string k = "v" + std::to_string(bytes) + ":" + std::to_string(i);
                if (raw) {
                  bad[t] += !raw_get(c->fd, k, dst.data(), bytes);
                } else {
                  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", k.data(), k.size()));
                  if (r == nullptr || r->len != static_cast<long long>(bytes)) {
                    ++bad[t];
                  } else {
                    std::memcpy(dst.data(), r->str, bytes);  // where the engine wants it
                  }
                  if (r != nullptr) freeReplyObject(r);
                }
                bad[t] += dst[4096] != static_cast<char>(i * 31 + 1);
              }
              redisFree(c);
            });
          }
          for (auto& th : threads) th.join();
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          for (int b : bad) EXPECT_EQ(b, 0);
          std::printf("io-threads %s, %2zu MiB values, %s, %d connection(s): %.2f GB/s\n",
                      io_threads ? "4" : "off", bytes >> 20,
                      raw ? "read into place" : "hiredis + copy", conns,
                      static_cast<double>(n * bytes) / s / 1e9);
        }
      }
    }
  }
}

// The store itself: 16 MiB blocks (Llama-3.1-8B's 128-token blocks) written behind and read by
// get_prefix (its reader threads, pipelined), by chunk size.
TEST(KvStoreThroughput, BlocksOf16MiBWrittenAndRead) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 runs it";
  constexpr int64_t kBlockSize = 128;
  constexpr int64_t kBytes = int64_t{16} << 20;
  constexpr uint64_t kBlocks = 64;
  std::vector<std::vector<int32_t>> tokens;
  for (uint64_t h = 1; h <= kBlocks; ++h) tokens.emplace_back(kBlockSize, static_cast<int32_t>(h));
  for (const int64_t chunk : {int64_t{16} << 20, int64_t{4} << 20, int64_t{1} << 20})
    for (const bool io_threads : {false, true}) {
      // A fresh server each: the last one's values freed.
      testing::RedisProcess redis(io_threads ? std::vector<std::string>{"--io-threads", "4"}
                                             : std::vector<std::string>{});
      ASSERT_TRUE(redis.up());
      KvStoreOptions o;
      o.chunk_bytes = chunk;
      o.timeout_ms = 5000;  // throughput, not timeouts, on a loaded machine
      KvStore store(redis.url(), "bench" + std::to_string(chunk), kBlockSize, kBytes, o);
      std::vector<std::string> values;
      for (uint64_t h = 1; h <= kBlocks; ++h) values.push_back(value_of(h, kBytes));
      const auto t0 = std::chrono::steady_clock::now();
      for (uint64_t h = 1; h <= kBlocks; ++h)
        store.put(h, h - 1, tokens[h - 1], std::move(values[h - 1]));
      store.flush();
      const double write_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<KvStoreBlockRef> refs;
      for (uint64_t h = 1; h <= kBlocks; ++h) refs.push_back({h, h - 1, tokens[h - 1]});
      int bad = 0;
      const auto t1 = std::chrono::steady_clock::now();
      const int64_t got =
          store.get_prefix(refs, [&](size_t i, std::span<const std::byte> b, auto*) {
            bad += static_cast<char>(b[4096]) != static_cast<char>((i + 1) * 31 + 1);
            return true;
          });
      const double read_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      EXPECT_EQ(got, static_cast<int64_t>(kBlocks));
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(store.stats().writes_dropped, 0);
      std::printf(
          "KvStore, io-threads %s, 16 MiB blocks in %2lld MiB chunks: written %.2f GB/s, read %.2f "
          "GB/s\n",
          io_threads ? "4" : "off", static_cast<long long>(chunk >> 20),
          kBlocks * kBytes / write_s / 1e9, kBlocks * kBytes / read_s / 1e9);
    }
}

}  // namespace
}  // namespace longctx
