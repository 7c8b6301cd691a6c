// Host buffers of one KV block each for the KV store's block copies (docs/fleet.md, "Shared KV
// store"): page-locked for a GPU executor, so a block's copy out of or into the device runs on a
// copy stream with no host wait, plain host memory for the CPU executor. Allocated once and
// reused: a pinned allocation of a 16 MiB block costs milliseconds, and a fixed count bounds the
// memory. Thread-safe: the engine thread takes a buffer, the store's writer thread gives it back.
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
  // `count` buffers of `block_bytes` each. Throws Error(kInvalidArgument) for a non-positive
  // size, Error(kUnsupported) for pinned buffers in a build without CUDA.
  KvBlockBuffers(int64_t count, int64_t block_bytes, bool pinned);
  KvBlockBuffers(const KvBlockBuffers&) = delete;
  KvBlockBuffers& operator=(const KvBlockBuffers&) = delete;

  int64_t count() const { return count_; }
  int64_t block_bytes() const { return block_bytes_; }
  bool pinned() const { return pinned_; }
  // A free buffer's index, or -1 when every one is taken (never waits; counted in exhausted()).
  int32_t try_take();
  // Buffer i's bytes (taken). Throws Error(kInternal) for an index out of range.
  std::span<std::byte> bytes(int32_t i);
  // Returns a taken buffer; Error(kInternal) for one that is not taken.
  void give_back(int32_t i);
  int64_t num_free() const;
  int64_t exhausted() const;  // try_take() calls that found every buffer taken

  // The count for at most `max_bytes` of buffers, at least `min_count`, at most `max_count`.
  static int64_t count_for(int64_t max_bytes, int64_t block_bytes, int64_t min_count,
                           int64_t max_count);

 private:
  int64_t count_, block_bytes_;
  bool pinned_;
  Tensor storage_;  // [count, block_bytes] u8, pinned or plain host memory
  mutable std::mutex mu_;
  std::vector<int32_t> free_;   // free indices, taken from the back
  std::vector<uint8_t> taken_;  // [count] 1 while taken (a double give-back check)
  int64_t exhausted_ = 0;
};

}  // namespace longctx
