// A KV store shared by replicas (docs/fleet.md, "Shared KV store"): full KV blocks kept in a
// Redis-protocol server (Redis, Valkey, ...) under the model's namespace and the block's prefix
// hash chain, so a replica that never computed a prefix reads its blocks instead of prefilling
// them.
//
// Writes go behind: put() queues a block (a bounded queue; past it the block is dropped and
// counted) and a thread of the store's own sends it, so a step never waits for the store. Reads
// (get()) are synchronous on the caller's thread, bounded by a timeout. Every value carries a
// header (format, block size, parent hash, the block's tokens) and an xxhash64 checksum; a value
// that fails any check, a timeout, or a store that is down is a miss (logged, counted): the
// caller recomputes, so the store can never change an output. After a connection failure the
// store is not tried again for a second, so a down store costs one timeout a second at most.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace longctx {

struct KvStoreStats {
  int64_t hits = 0;            // blocks read and verified
  int64_t misses = 0;          // blocks the store did not have
  int64_t errors = 0;          // timeouts, connection failures, malformed or mismatched values
  int64_t bytes_read = 0;      // of verified blocks
  int64_t bytes_written = 0;   // sent and acknowledged
  int64_t writes_dropped = 0;  // the write queue was full
};

class KvStore {
 public:
  // `url`: redis://HOST:PORT. `ns` names the model and the bytes' format (blocks of different
  // models or formats never meet). Throws Error(kInvalidArgument) for a malformed URL,
  // Error(kNotFound) without libhiredis; a store that is down is not an error here.
  KvStore(const std::string& url, std::string ns, int64_t block_size, int64_t block_bytes,
          int timeout_ms = 200, size_t max_queued_writes = 256);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Queues a block for writing (encoded and checksummed on the writer thread); never waits.
  void put(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, std::string bytes);
  // The block's K/V bytes when the store holds a verified value for exactly this block (hash,
  // parent and tokens); nullopt otherwise.
  std::optional<std::string> get(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens);
  // Waits until every queued write was sent or failed (tests, shutdown).
  void flush();
  KvStoreStats stats() const;
  const std::string& url() const { return url_; }

  // The value stored for a block (exposed for tests that corrupt one).
  std::string key(uint64_t hash) const;

 private:
  struct Connection;
  // A queued block, encoded by the writer thread (the checksum and the value's copy of a large
  // block cost milliseconds that the engine thread should not pay).
  struct Write {
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::string bytes;
  };
  std::string encode(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                     const std::string& bytes) const;
  void run_writer();

  std::string url_, host_, ns_;
  int port_ = 0;
  int64_t block_size_, block_bytes_;
  int timeout_ms_;
  size_t max_queued_;
  std::unique_ptr<Connection> reader_;  // the caller's thread
  std::unique_ptr<Connection> writer_;  // the writer thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Write> queue_;
  bool busy_ = false;  // the writer holds a write outside the queue
  bool stop_ = false;
  std::atomic<int64_t> hits_{0}, misses_{0}, errors_{0}, bytes_read_{0}, bytes_written_{0},
      dropped_{0};
  std::thread thread_;
};

}  // namespace longctx
