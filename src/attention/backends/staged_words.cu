#include <cuda_runtime.h>

#include <cstring>

#include "attention/backends/staged_words.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

// Placed arrays less than this apart go up in one copy (gap included): a copy's call costs more
// than 16 KB of the link.
constexpr int64_t kMinGapWords = 4096;

}  // namespace

StagedWords::StagedWords(Device device, int64_t fixed_capacity) : device_(device), staged_(device) {
  if (fixed_capacity > 0) {
    host_ = Tensor::empty_pinned({fixed_capacity}, DType::kI32);
    dev_ = Tensor::empty({fixed_capacity}, DType::kI32, device_);
    fixed_ = true;
  }
}

void StagedWords::begin() {
  staged_.synchronize();
  words_.clear();
  ranges_.clear();
}

int64_t StagedWords::put_at(int64_t at, const int32_t* data, size_t n) {
  const int64_t end = ranges_.empty() ? 0 : ranges_.back().second;
  LONGCTX_CHECK(fixed_ && words_.empty() && at % 4 == 0 && at >= end &&
                    at + static_cast<int64_t>(n) <= host_.numel(),
                ErrorCode::kInternal,
                "staged words: an array of {} words at word {} (wants a fixed capacity ({}), no "
                "appended words, 16-byte alignment, after word {})",
                n, at, host_.numel(), end);
  // The pinned buffer is free: begin() waited for the last upload's copy out of it.
  if (n > 0) std::memcpy(host_.data<int32_t>() + at, data, n * sizeof(int32_t));
  const int64_t stop = at + static_cast<int64_t>(n);
  if (!ranges_.empty() && at - end < kMinGapWords)
    ranges_.back().second = stop;
  else
    ranges_.push_back({at, stop});
  return at;
}

int64_t StagedWords::put(const int32_t* data, size_t n, int32_t scale) {
  LONGCTX_CHECK(ranges_.empty(), ErrorCode::kInternal,
                "staged words: an appended array in a step of placed ones");
  while (words_.size() % 4) words_.push_back(0);
  const int64_t at = static_cast<int64_t>(words_.size());
  for (size_t i = 0; i < n; ++i) words_.push_back(data[i] * scale);
  return at;
}

int64_t StagedWords::put_bytes(const void* data, size_t bytes) {
  const int64_t at = put(nullptr, 0);
  words_.resize(words_.size() + (bytes + 3) / 4, 0);
  if (bytes > 0) std::memcpy(words_.data() + at, data, bytes);
  return at;
}

void StagedWords::upload(void* stream) {
  if (!ranges_.empty()) {  // placed arrays: already in the pinned buffer, at their offsets
    for (const auto& [begin, end] : ranges_)
      LONGCTX_CUDA_CHECK(
          cudaMemcpyAsync(dev_.data<int32_t>() + begin, host_.data<int32_t>() + begin,
                          static_cast<size_t>(end - begin) * sizeof(int32_t),
                          cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
    staged_.record_on(stream);
    return;
  }
  const int64_t n = static_cast<int64_t>(words_.size());
  if (n == 0) return;
  LONGCTX_CHECK(!fixed_ || n <= host_.numel(), ErrorCode::kInternal,
                "staged words: {} words past the fixed capacity {} (kernels keep its addresses)", n,
                host_.numel());
  if (host_.numel() < n) {  // grows with headroom: steps vary in size
    host_ = Tensor::empty_pinned({n * 2}, DType::kI32);
    dev_ = Tensor::empty({n * 2}, DType::kI32, device_);
  }
  std::memcpy(host_.data_ptr(), words_.data(), static_cast<size_t>(n) * sizeof(int32_t));
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev_.data_ptr(), host_.data_ptr(),
                                     static_cast<size_t>(n) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
  staged_.record_on(stream);
}

}  // namespace longctx
