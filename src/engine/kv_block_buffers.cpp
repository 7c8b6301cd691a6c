#include "engine/kv_block_buffers.h"

#include <algorithm>

#include "longctx/core/error.h"

namespace longctx {

KvBlockBuffers::KvBlockBuffers(int64_t count, int64_t block_bytes, bool pinned)
    : count_(count), block_bytes_(block_bytes), pinned_(pinned) {
  LONGCTX_CHECK(count > 0 && block_bytes > 0, ErrorCode::kInvalidArgument,
                "KV block buffers: {} buffers of {} bytes", count, block_bytes);
  const Shape shape = {count, block_bytes};
  storage_ = pinned ? Tensor::empty_pinned(shape, DType::kU8) : Tensor::empty(shape, DType::kU8);
  free_.reserve(static_cast<size_t>(count));
  for (int64_t i = count; i-- > 0;) free_.push_back(static_cast<int32_t>(i));
  taken_.assign(static_cast<size_t>(count), 0);
}

int64_t KvBlockBuffers::count_for(int64_t max_bytes, int64_t block_bytes, int64_t min_count,
                                  int64_t max_count) {
  const int64_t fit = block_bytes > 0 ? max_bytes / block_bytes : max_count;
  return std::clamp(fit, min_count, std::max(min_count, max_count));
}

int32_t KvBlockBuffers::try_take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    ++exhausted_;
    return -1;
  }
  const int32_t i = free_.back();
  free_.pop_back();
  taken_[i] = 1;
  return i;
}

std::span<std::byte> KvBlockBuffers::bytes(int32_t i) {
  LONGCTX_CHECK(i >= 0 && i < count_, ErrorCode::kInternal, "KV block buffer {} of {}", i, count_);
  return {reinterpret_cast<std::byte*>(storage_.data<uint8_t>()) + i * block_bytes_,
          static_cast<size_t>(block_bytes_)};
}

void KvBlockBuffers::give_back(int32_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  LONGCTX_CHECK(i >= 0 && i < count_ && taken_[i], ErrorCode::kInternal,
                "KV block buffers: giving back buffer {} (of {}) that is not taken", i, count_);
  taken_[i] = 0;
  free_.push_back(i);
}

int64_t KvBlockBuffers::num_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

int64_t KvBlockBuffers::exhausted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exhausted_;
}

}  // namespace longctx
