#include <cuda_runtime.h>

#include <cstring>

#include "attention/backends/staged_words.h"
#include "longctx/core/cuda_check.h"

namespace longctx {

StagedWords::StagedWords(Device device) : device_(device), staged_(device) {}

void StagedWords::begin() {
  staged_.synchronize();
  words_.clear();
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
