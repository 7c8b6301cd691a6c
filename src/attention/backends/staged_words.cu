#include <cuda_runtime.h>

#include <cstring>

#include "attention/backends/staged_words.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

// Skipped ranges shorter than this are uploaded with the rest: one copy costs more than 16 KB.
constexpr int64_t kMinGapWords = 4096;

}  // namespace

StagedWords::StagedWords(Device device, int64_t fixed_capacity) : device_(device), staged_(device) {
  if (fixed_capacity > 0) {
    reserve(fixed_capacity, fixed_capacity);
    fixed_ = true;
  }
}

void StagedWords::begin() {
  staged_.synchronize();
  words_.clear();
  gaps_.clear();
}

void StagedWords::reserve(int64_t n, int64_t capacity) {
  if (host_.numel() >= n) return;
  LONGCTX_CHECK(!fixed_, ErrorCode::kInternal,
                "staged words: {} words past the fixed capacity {} (kernels keep its addresses)", n,
                host_.numel());
  host_ = Tensor::empty_pinned({capacity}, DType::kI32);
  dev_ = Tensor::empty({capacity}, DType::kI32, device_);
}

int64_t StagedWords::put_at(int64_t at, const int32_t* data, size_t n) {
  const int64_t size = static_cast<int64_t>(words_.size());
  LONGCTX_CHECK(at % 4 == 0 && at >= size, ErrorCode::kInternal,
                "staged words: an array at word {} (16-byte aligned, after the {} words so far)",
                at, size);
  if (at - size >= kMinGapWords) gaps_.push_back({size, at});
  words_.resize(static_cast<size_t>(at), 0);
  words_.insert(words_.end(), data, data + n);
  return at;
}

int64_t StagedWords::put(const int32_t* data, size_t n, int32_t scale) {
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
  const int64_t n = static_cast<int64_t>(words_.size());
  if (n == 0) return;
  reserve(n, 2 * n);  // with headroom: steps vary in size
  // The written ranges: [0, first gap), between gaps, [last gap, n).
  int64_t begin = 0;
  auto copy = [&](int64_t end) {
    if (end <= begin) return;
    const size_t bytes = static_cast<size_t>(end - begin) * sizeof(int32_t);
    std::memcpy(host_.data<int32_t>() + begin, words_.data() + begin, bytes);
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev_.data<int32_t>() + begin, host_.data<int32_t>() + begin,
                                       bytes, cudaMemcpyHostToDevice,
                                       static_cast<cudaStream_t>(stream)));
  };
  for (const auto& [gap_begin, gap_end] : gaps_) {
    copy(gap_begin);
    begin = gap_end;
  }
  copy(n);
  staged_.record_on(stream);
}

}  // namespace longctx
