// A KV store shared by replicas (docs/fleet.md, "Shared KV store"): full KV blocks kept in a
// Redis-protocol server (Redis, Valkey, ...) under the model's namespace and the block's prefix
// hash chain, so a replica that never computed a prefix reads its blocks instead of prefilling
// them.
//
// Writes go behind: put() queues a block (a bounded queue; past it the block is dropped and
// counted) and a thread of the store's own sends it, so a step never waits for the store. The
// executor copies a block into one of the store's staging buffers (KvBlockBuffers: pinned for a
// GPU executor, whose copy then runs on a copy stream) and queues it with put_staged(); the writer
// thread waits for the copy, moves the bytes out of the staging buffer (first, before any send,
// so the few pinned buffers are free again soon) and sends them. With every staging buffer taken
// a block is dropped and counted (a step never waits for the store). Reads (get_prefix()) are
// synchronous for the caller, done by several threads with a connection each (reading a 16 MiB
// value off the socket and checksumming it cost milliseconds), each GET bounded by a timeout. Every
// value carries a header (format, block size, parent hash, the block's tokens) and an xxhash64
// checksum; a value that fails any check, a timeout, or a store that is down is a miss (logged,
// counted): the caller recomputes, so the store can never change an output. After a connection
// failure the store is not tried again for a second, so a down store costs one timeout a second at
// most.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv_block_buffers.h"

namespace longctx {

struct KvStoreStats {
  int64_t hits = 0;            // blocks read and verified
  int64_t misses = 0;          // blocks the store did not have
  int64_t errors = 0;          // timeouts, connection failures, malformed or mismatched values
  int64_t bytes_read = 0;      // of verified blocks
  int64_t bytes_written = 0;   // sent and acknowledged
  int64_t writes_dropped = 0;  // the write queue or every staging buffer was full
};

// One block a lookup asks for: its chain hash, its parent's and its tokens.
struct KvStoreBlockRef {
  uint64_t hash = 0;
  uint64_t parent = 0;
  std::span<const int32_t> tokens;
};

class KvStore {
 public:
  // Staging buffers, all of them together, at most staging_bytes (at least 4 buffers, at most
  // max_queued_writes); by default this many.
  static constexpr int64_t kStagingBytes = int64_t{1} << 30;
  // get_prefix()'s reading threads (each with a connection of its own), and how many blocks
  // past the one handed on they may read (the memory of that many values).
  static constexpr size_t kReaders = 4;
  static constexpr size_t kReadAhead = 8;

  // `url`: redis://HOST:PORT. `ns` names the model and the bytes' format (blocks of different
  // models or formats never meet). `pinned_staging`: the staging buffers are page-locked (a GPU
  // executor's asynchronous copies). Throws Error(kInvalidArgument) for a malformed URL,
  // Error(kNotFound) without libhiredis; a store that is down is not an error here.
  KvStore(const std::string& url, std::string ns, int64_t block_size, int64_t block_bytes,
          int timeout_ms = 200, size_t max_queued_writes = 256, bool pinned_staging = false,
          int64_t staging_bytes = kStagingBytes);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Queues a block for writing (encoded and checksummed on the writer thread); never waits.
  void put(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, std::string bytes);
  // A free staging buffer's index for put_staged(), or -1 when all are taken (the caller drops
  // the block: counted in writes_dropped). Never waits.
  int32_t take_staging();
  std::span<std::byte> staging(int32_t buffer) { return staging_.bytes(buffer); }
  // Queues the block being copied into staging buffer `buffer` (taken with take_staging());
  // `wait` (empty: the copy finished) returns once the copy did, on the writer thread. The
  // store gives the buffer back. Never waits.
  void put_staged(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, int32_t buffer,
                  std::function<void()> wait);
  // Reads `blocks` (kReaders threads, up to kReadAhead blocks ahead) and calls on_hit(i, bytes), in
  // order, for
  // each verified value (the bytes valid during the call) until the first block the store does
  // not hold or that fails a check, a store failure, or on_hit returning false. Returns how many
  // blocks on_hit took.
  int64_t get_prefix(std::span<const KvStoreBlockRef> blocks,
                     const std::function<bool(size_t, std::span<const std::byte>)>& on_hit);
  // The block's K/V bytes when the store holds a verified value for exactly this block (hash,
  // parent and tokens); nullopt otherwise.
  std::optional<std::string> get(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens);
  // Waits until every queued write was sent or failed (tests, shutdown).
  void flush();
  KvStoreStats stats() const;
  const std::string& url() const { return url_; }
  const KvBlockBuffers& staging_buffers() const { return staging_; }

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
    std::string bytes;           // the block's bytes (buffer < 0 and !framed)
    bool framed = false;         // `bytes` is the value, its checksum not yet set
    int32_t buffer = -1;         // or the staging buffer the executor copies the block into
    std::function<void()> wait;  // returns once that copy finished (empty: finished)
  };
  // The value without its checksum (header, tokens, payload), in a string of spare_ when there
  // is one (its pages are mapped already: a fresh 16 MiB string costs page faults).
  std::string frame(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                    std::span<const std::byte> payload);
  static void seal(std::string& value);  // writes the checksum
  // nullptr when the value is exactly this block's; what is wrong otherwise.
  const char* check(const char* p, size_t len, const KvStoreBlockRef& block) const;
  size_t num_unstaged() const;  // queued blocks out of (or never in) a staging buffer; mu_ held
  void run_writer();

  std::string url_, host_, ns_;
  int port_ = 0;
  int64_t block_size_, block_bytes_;
  int timeout_ms_;
  size_t max_queued_;
  std::vector<std::unique_ptr<Connection>> readers_;  // get_prefix()'s threads, one each
  std::unique_ptr<Connection> writer_;                // the writer thread
  KvBlockBuffers staging_;
  std::vector<std::string> spare_;  // sent values kept for frame() (the writer thread's)
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
