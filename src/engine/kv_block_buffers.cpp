#include "engine/kv_block_buffers.h"

#include <algorithm>

#include "longctx/core/error.h"

namespace longctx {

KvBlockBuffers::KvBlockBuffers(int64_t count, int64_t block_bytes, bool pinned, int64_t initial)
    : count_(count), block_bytes_(block_bytes), pinned_(pinned) {
  LONGCTX_CHECK(count > 0 && block_bytes > 0 && initial >= 0 && initial <= count,
                ErrorCode::kInvalidArgument, "KV block buffers: {} buffers ({} now) of {} bytes",
                count, initial, block_bytes);
  storage_.resize(static_cast<size_t>(count));
  free_.reserve(static_cast<size_t>(count));
  taken_.assign(static_cast<size_t>(count), 0);
  grow(initial);
  // Lowest index first, as before the pool grew on demand.
  std::reverse(free_.begin(), free_.end());
}

int64_t KvBlockBuffers::count_for(int64_t max_bytes, int64_t block_bytes, int64_t min_count,
                                  int64_t max_count) {
  const int64_t fit = block_bytes > 0 ? max_bytes / block_bytes : max_count;
  return std::clamp(fit, min_count, std::max(min_count, max_count));
}

int64_t KvBlockBuffers::grow(int64_t n) {
  const std::lock_guard<std::mutex> grow_lock(grow_mu_);
  int64_t first = 0;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    first = allocated_;
    wanted_ = false;
  }
  const int64_t end = std::min(count_, first + std::max<int64_t>(n, 0));
  for (int64_t i = first; i < end; ++i) {
    const Shape shape = {block_bytes_};
    storage_[i] =
        pinned_ ? Tensor::empty_pinned(shape, DType::kU8) : Tensor::empty(shape, DType::kU8);
    const std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(static_cast<int32_t>(i));
    allocated_ = i + 1;
  }
  return end - first;
}

int32_t KvBlockBuffers::try_take() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {
    ++exhausted_;
    wanted_ = allocated_ < count_;
    return -1;
  }
  const int32_t i = free_.back();
  free_.pop_back();
  taken_[i] = 1;
  return i;
}

std::span<std::byte> KvBlockBuffers::bytes(int32_t i) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    LONGCTX_CHECK(i >= 0 && i < allocated_, ErrorCode::kInternal,
                  "KV block buffer {} of {} allocated", i, allocated_);
  }
  return {reinterpret_cast<std::byte*>(storage_[i].data<uint8_t>()),
          static_cast<size_t>(block_bytes_)};
}

void KvBlockBuffers::give_back(int32_t i) {
  const std::lock_guard<std::mutex> lock(mu_);
  LONGCTX_CHECK(i >= 0 && i < allocated_ && taken_[i], ErrorCode::kInternal,
                "KV block buffers: giving back buffer {} (of {}) that is not taken", i, allocated_);
  taken_[i] = 0;
  free_.push_back(i);
}

bool KvBlockBuffers::wants_growth() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return wanted_;
}

int64_t KvBlockBuffers::allocated() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

int64_t KvBlockBuffers::num_free() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

int64_t KvBlockBuffers::exhausted() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return exhausted_;
}

}  // namespace longctx
