// Host buffers of one KV block each for the KV store's block copies (docs/fleet.md, "Shared KV
// store"): page-locked for a GPU executor, so a block's copy out of or into the device runs on a
// copy stream with no host wait, plain host memory for the CPU executor. Allocated by grow(), up
// to a fixed count, and reused: a pinned allocation of a 16 MiB block costs milliseconds (2.2 GiB
// of them cost seconds), so the store's writer thread pins the whole pool when it starts, off the
// engine thread, each buffer free as soon as it is pinned, and a fixed count bounds the memory.
// Thread-safe: the engine thread takes a buffer, the store's writer thread grows the pool and
// gives buffers back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

class KvBlockBuffers {
 public:
  // At most `count` buffers of `block_bytes` each, `initial` of them allocated now. Throws
  // Error(kInvalidArgument) for a non-positive size, Error(kUnsupported) for pinned buffers in a
  // build without CUDA.
  KvBlockBuffers(int64_t count, int64_t block_bytes, bool pinned, int64_t initial);
  KvBlockBuffers(int64_t count, int64_t block_bytes, bool pinned)
      : KvBlockBuffers(count, block_bytes, pinned, count) {}
  KvBlockBuffers(const KvBlockBuffers&) = delete;
  KvBlockBuffers& operator=(const KvBlockBuffers&) = delete;

  int64_t count() const { return count_; }  // the most there may be
  int64_t block_bytes() const { return block_bytes_; }
  bool pinned() const { return pinned_; }
  // A free buffer's index, or -1 when every allocated one is taken (never waits, never
  // allocates; counted in exhausted(), and wants_growth() turns true while count() allows more).
  int32_t try_take();
  // Buffer i's bytes (taken). Throws Error(kInternal) for an index not allocated.
  std::span<std::byte> bytes(int32_t i);
  // Returns a taken buffer; Error(kInternal) for one that is not taken.
  void give_back(int32_t i);
  // Allocates up to `n` more buffers (not past count()), free; returns how many. The allocation
  // runs outside the lock: try_take() and give_back() go on meanwhile.
  int64_t grow(int64_t n);
  // try_take() found none free since the last grow(), and count() allows more.
  bool wants_growth() const;
  int64_t allocated() const;
  int64_t num_free() const;
  int64_t exhausted() const;  // try_take() calls that found every buffer taken

  // The count for at most `max_bytes` of buffers, at least `min_count`, at most `max_count`.
  static int64_t count_for(int64_t max_bytes, int64_t block_bytes, int64_t min_count,
                           int64_t max_count);

 private:
  int64_t count_, block_bytes_;
  bool pinned_;
  mutable std::mutex mu_;
  std::mutex grow_mu_;  // one grow() at a time
  // [count] each [block_bytes] u8, pinned or plain host memory; the first allocated_ are; an
  // element is written once (before its index is free) and only read after.
  std::vector<Tensor> storage_;
  int64_t allocated_ = 0;
  std::vector<int32_t> free_;   // free indices, taken from the back
  std::vector<uint8_t> taken_;  // [count] 1 while taken (a double give-back check)
  int64_t exhausted_ = 0;
  bool wanted_ = false;  // try_take() found none free since the last grow()
};

}  // namespace longctx
