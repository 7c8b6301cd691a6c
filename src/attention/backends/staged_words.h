// A step's index arrays (page tables, indptrs, work lists) for the GPU kernels, staged in one
// copy: arrays are appended to one int32 word vector, each 16-byte aligned, and upload() copies
// the words through a pinned buffer to a device buffer on the given stream. The CUDA backends of
// one step (Quest, resident XAttention, XAttention with offload, the offload device) each own one.
// A fixed capacity keeps the device buffer where it is for the object's life, so arrays placed at
// fixed offsets (put_at) have addresses a CUDA graph can keep; upload() then copies the placed
// ranges, not the room between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "longctx/core/device.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"

namespace longctx {

class StagedWords {
 public:
  // fixed_capacity > 0: both buffers are allocated now, never move, and a step past that many
  // words throws Error(kInternal); 0: they grow with the steps.
  explicit StagedWords(Device device, int64_t fixed_capacity = 0);

  // Starts a step: waits until the previous upload's copy has left the pinned buffer, clears.
  void begin();
  // Appends data[0, n) times scale at the next 16-byte boundary; returns its word offset.
  int64_t put(const int32_t* data, size_t n, int32_t scale = 1);
  int64_t put(std::span<const int32_t> v, int32_t scale = 1) {
    return put(v.data(), v.size(), scale);
  }
  // A fixed capacity only, in a step of no appended words: places data[0, n) at word `at` (a
  // multiple of 4, past the arrays placed so far, inside the capacity; the words between hold
  // stale values); returns `at`. Throws Error(kInternal) otherwise.
  int64_t put_at(int64_t at, const int32_t* data, size_t n);
  int64_t put_at(int64_t at, std::span<const int32_t> v) { return put_at(at, v.data(), v.size()); }
  // Appends `bytes` bytes of any array (e.g. int64 indptrs), zero-padded to whole words.
  int64_t put_bytes(const void* data, size_t bytes);
  // Appends one word (arrays built in place after an aligned put(nullptr, 0)).
  void push(int32_t w) { words_.push_back(w); }
  // Copies the words to the device buffer on `stream` (a cudaStream_t).
  void upload(void* stream);
  // Word `at` of the device buffer (valid for kernels queued after upload()).
  const int32_t* device_at(int64_t at) const { return dev_.data<int32_t>() + at; }
  // The host words (host plans read the arrays they stage; valid until the next begin()); not
  // the placed ones.
  const int32_t* host() const { return words_.data(); }

 private:
  Device device_;
  bool fixed_ = false;
  std::vector<int32_t> words_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // [begin, end) words put_at placed
  Tensor host_;                                      // [capacity] i32 pinned
  Tensor dev_;                                       // [capacity] i32 on device_
  Event staged_;                                     // after the last upload's copy
};

}  // namespace longctx
