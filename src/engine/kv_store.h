// A KV store shared by replicas (docs/fleet.md, "Shared KV store"): full KV blocks kept in a
// Redis-protocol server (Redis, Valkey, ...) under the model's namespace and the block's prefix
// hash chain, so a replica that never computed a prefix reads its blocks instead of prefilling
// them.
//
// Values. A block is split into chunks of chunk_bytes (1 MiB by default), each stored under a key
// of its own (the block's key and the chunk's index): a reader knows the keys from the block's
// size, reads the chunks over several connections at once, and a chunk that is missing or fails
// its check costs the block (recomputed), never an output. Every chunk carries a header (format,
// block size, chunk index and count, parent hash, its block's hash and size), the block's tokens
// and an xxhash64 checksum over all of it.
//
// Wire. hiredis connects (and sets the socket's timeouts); the commands and replies go over its
// socket directly: a SET sends the chunk from where it lies (a staging buffer) and a GET receives
// the chunk straight into its destination. hiredis' reader takes a 16 MiB value 16 KiB at a time
// into a buffer that grows, then copies it into the reply: a GET of 16 MiB values ran at 0.75
// GB/s, 1 MiB chunks received in place at 4 GB/s on one connection (a loaded 2-core machine).
//
// Writes go behind. The engine thread queues a full block with queue_export(): it waits, in order,
// in a bounded queue of block ids (past the bound it is dropped and counted) until
// start_exports() finds a staging buffer free (KvBlockBuffers: pinned for a GPU executor, whose
// copy then runs on a copy stream, allocated on demand up to staging_bytes) and starts its copy.
// A waiting block's bytes stay in the engine's pool: the engine forgets (drops, counted) a waiting
// block that a step or an import is about to overwrite (forget_exports()), rare since it is among
// the most recently used. A thread of the store's own waits for each copy, sends the chunks from
// the staging buffer (the checksum computed on that thread) and gives the buffer back. The store
// never waits on the engine thread and a step never waits for the store.
//
// Reads (get_prefix()) are synchronous for the caller: kReaders threads with a connection each
// read the chunks of the next kReadAhead blocks, kPipeline GETs at a time, into read buffers
// (pinned for a GPU executor) and hand each verified block on in order; the caller's copy out of
// a read buffer may run on while the next blocks are read (reuse_after). Each read is bounded by
// a timeout. start_load() runs such a read on the store's loader thread instead, one load at a
// time in the order they were started (their memory: the kReadAhead read buffers): the engine
// thread takes the blocks that arrived between its steps (KvStoreLoad) and never waits for the
// store. A value that fails a check, a timeout, or a store that is down is a miss (logged,
// counted): the caller recomputes. After a connection failure the store is not tried again for a
// second, so a down store costs one timeout a second at most.
#pragma once

#include <atomic>
#include <chrono>
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
  int64_t misses = 0;          // blocks the store did not have (a chunk missing)
  int64_t errors = 0;          // timeouts, connection failures, malformed or mismatched values
  int64_t bytes_read = 0;      // of verified blocks
  int64_t bytes_written = 0;   // sent and acknowledged
  int64_t writes_dropped = 0;  // the write or export queue was full, or a waiting block was
                               // overwritten before a staging buffer freed
};

// One block a lookup asks for: its chain hash, its parent's and its tokens.
struct KvStoreBlockRef {
  uint64_t hash = 0;
  uint64_t parent = 0;
  std::span<const int32_t> tokens;
};

// An asynchronous lookup (KvStore::start_load), shared by the store's loader thread and the
// engine thread. The loader reads the blocks in order until the first one the store lacks or that
// fails a check, a store failure, or stop(), and hands each verified block on with take_hits();
// the caller copies it out of the store's read buffer and says so with imported(). The load is
// done() once the lookup ended and every copy of a block handed on finished.
class KvStoreLoad {
 public:
  struct Hit {
    size_t index = 0;                  // of blocks()
    std::span<const std::byte> bytes;  // a read buffer's, valid until imported(index, ...)
  };
  // `blocks`' tokens are copied (the load outlives its request's).
  explicit KvStoreLoad(std::span<const KvStoreBlockRef> blocks);
  std::span<const KvStoreBlockRef> blocks() const { return blocks_; }

  // The engine thread's. The blocks verified since the last call, in order; the caller imports
  // each before its next call: imported(index, wait), `wait` returning once its copy out of the
  // bytes finished (empty: finished), or stop().
  std::vector<Hit> take_hits();
  void imported(size_t index, std::function<void()> wait);
  // Ends the load: nothing more is handed on (hits not yet taken are dropped).
  void stop();
  bool done() const;
  // Waits at most `timeout` until a hit is ready or the load is done.
  void wait(std::chrono::milliseconds timeout) const;

 private:
  friend class KvStore;
  // The loader's: a verified block (false once stopped), then what waits before its read buffer
  // is reused; the end.
  bool hand_on(size_t index, std::span<const std::byte> bytes);
  void wait_imported(size_t index);
  void finish();

  std::vector<int32_t> tokens_;  // the blocks' tokens, which blocks_ point into
  std::vector<KvStoreBlockRef> blocks_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Hit> ready_;                    // handed on, not taken
  std::vector<uint8_t> imported_;            // [blocks] 1 once imported()
  std::vector<std::function<void()>> wait_;  // [blocks] imported()'s
  bool stopped_ = false, done_ = false;
};

struct KvStoreOptions {
  int timeout_ms = 200;            // each connect, send and receive
  size_t max_queued_writes = 256;  // put()'s blocks (their bytes owned by the queue)
  bool pinned = false;             // staging and read buffers page-locked (a GPU executor's)
  // Staging buffers at most this many bytes together (at least 4 buffers, at most
  // max_queued_writes), allocated on demand by the writer thread.
  int64_t staging_bytes = int64_t{2} << 30;
  int64_t chunk_bytes = int64_t{1} << 20;  // a block's bytes per key
  size_t max_waiting_exports = 4096;       // blocks waiting for a staging buffer
};

class KvStore {
 public:
  // get_prefix()'s reading threads (each with a connection of its own), the blocks they read
  // ahead of the one handed on (a read buffer each) and the GETs each sends before reading
  // their replies.
  static constexpr size_t kReaders = 4;
  static constexpr size_t kReadAhead = 8;
  static constexpr size_t kPipeline = 4;

  // `url`: redis://HOST:PORT. `ns` names the model and the bytes' format (blocks of different
  // models or formats never meet). Throws Error(kInvalidArgument) for a malformed URL or option,
  // Error(kNotFound) without libhiredis; a store that is down is not an error here.
  KvStore(const std::string& url, std::string ns, int64_t block_size, int64_t block_bytes,
          KvStoreOptions options = {});
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Queues a block's bytes for writing; past max_queued_writes dropped (counted). Never waits.
  void put(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, std::string bytes);
  // A free staging buffer's index for put_staged(), or -1 when every pinned one is taken (the
  // writer pins the pool, staging_bytes of it, when it starts). Never waits.
  int32_t take_staging();
  std::span<std::byte> staging(int32_t buffer) { return staging_.bytes(buffer); }
  // Queues the block being copied into staging buffer `buffer` (taken with take_staging());
  // `wait` (empty: the copy finished) returns once the copy did, on the writer thread. The
  // store gives the buffer back. Never waits.
  void put_staged(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, int32_t buffer,
                  std::function<void()> wait);

  // The export queue (the engine thread's alone). Starts a copy of block `block` into `dst` and
  // returns what waits for it (empty: done).
  using CopyOut = std::function<std::function<void()>(int32_t block, std::span<std::byte> dst)>;
  // Queues the caller's KV block `block` for export; dropped (counted) past
  // max_waiting_exports. Never waits.
  void queue_export(int32_t block, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens);
  // Starts the copies of the waiting blocks, in order, while staging buffers are free; returns
  // how many started.
  int64_t start_exports(const CopyOut& copy);
  // Drops (counted) the waiting exports of `blocks`, which the caller is about to overwrite.
  void forget_exports(std::span<const int32_t> blocks);
  size_t num_waiting_exports() const { return waiting_.size(); }
  size_t max_waiting_exports() const { return options_.max_waiting_exports; }

  // Reads `blocks` and calls on_hit(i, bytes, reuse_after) in order for each verified block (the
  // bytes are the store's until on_hit returns or, when on_hit sets *reuse_after, until that
  // returns: an asynchronous copy out of them), until the first block the store does not hold
  // or that fails a check, a store failure, or on_hit returning false. Returns once every
  // reuse_after returned, with how many blocks on_hit took.
  using OnHit =
      std::function<bool(size_t, std::span<const std::byte>, std::function<void()>* reuse_after)>;
  int64_t get_prefix(std::span<const KvStoreBlockRef> blocks, const OnHit& on_hit);
  // Starts an asynchronous read of `blocks` (as get_prefix(), on the loader thread, after the
  // loads started before). Never waits.
  std::shared_ptr<KvStoreLoad> start_load(std::span<const KvStoreBlockRef> blocks);
  // The block's K/V bytes when the store holds a verified value for exactly this block (hash,
  // parent and tokens); nullopt otherwise.
  std::optional<std::string> get(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens);
  // Waits until every queued write was sent or failed (tests, shutdown); waiting exports stay.
  void flush();
  KvStoreStats stats() const;
  const std::string& url() const { return url_; }
  const KvBlockBuffers& staging_buffers() const { return staging_; }
  int64_t num_chunks() const { return (block_bytes_ + chunk_bytes_ - 1) / chunk_bytes_; }

  // The key of a block's chunk (exposed for tests that corrupt or delete one).
  std::string key(uint64_t hash, int64_t chunk) const;

 private:
  struct Connection;
  struct Write {
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::string bytes;           // the block's bytes (buffer < 0)
    int32_t buffer = -1;         // or the staging buffer the executor copies the block into
    std::function<void()> wait;  // returns once that copy finished (empty: finished)
  };
  struct Export {  // a block waiting for a staging buffer
    int32_t block = -1;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
  };
  // The chunk's header and the block's tokens, checksum included, for `payload` (the chunk's).
  std::string chunk_head(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                         int64_t chunk, std::span<const std::byte> payload) const;
  size_t chunk_head_bytes() const;
  // nullptr when `head` and `payload` are exactly this chunk of this block; what is wrong
  // otherwise.
  const char* check(std::span<const char> head, std::span<const std::byte> payload,
                    const KvStoreBlockRef& block, int64_t chunk) const;
  bool send_block(const Write& w, std::span<const std::byte> payload);  // the writer's
  void run_writer();
  void run_loader();

  std::string url_, host_, ns_;
  int port_ = 0;
  int64_t block_size_, block_bytes_;
  KvStoreOptions options_;
  int64_t chunk_bytes_;
  std::vector<std::unique_ptr<Connection>> readers_;  // get_prefix()'s threads, one each
  std::unique_ptr<Connection> writer_;                // the writer thread
  KvBlockBuffers staging_;
  std::unique_ptr<KvBlockBuffers> reading_;  // [kReadAhead] blocks, allocated by get_prefix()
  std::deque<Export> waiting_;               // the engine thread's
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Write> queue_;
  size_t num_unstaged_ = 0;  // queued writes with their bytes in the queue (put())
  bool busy_ = true;         // the writer holds a write (or grows the staging pool)
  bool stop_ = false;
  std::atomic<int64_t> hits_{0}, misses_{0}, errors_{0}, bytes_read_{0}, bytes_written_{0},
      dropped_{0};
  std::thread thread_;
  std::mutex read_mu_;  // one get_prefix() at a time (the readers' connections and buffers)
  std::deque<std::shared_ptr<KvStoreLoad>> loads_;  // started, not yet read (under mu_)
  std::shared_ptr<KvStoreLoad> loading_;            // the one being read (under mu_)
  std::thread loader_;
};

}  // namespace longctx
