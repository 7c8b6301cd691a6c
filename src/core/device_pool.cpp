#include "core/device_pool.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "longctx/core/error.h"

namespace longctx {

std::string format_bytes(int64_t bytes) {
  if (bytes < 0) return "-" + format_bytes(-bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

namespace detail {

DevicePool::DevicePool(DevicePoolBackend* backend) : backend_(backend) {}

DevicePool::~DevicePool() {
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg.first; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    backend_->raw_free(base);
  }
}

size_t DevicePool::round_size(size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

int64_t DevicePool::budget_locked() {
  if (total_memory_ < 0) total_memory_ = backend_->total_memory();
  const auto from_util = static_cast<int64_t>(utilization_ * static_cast<double>(total_memory_));
  return limit_bytes_ > 0 ? std::min(limit_bytes_, from_util) : from_util;
}

std::string DevicePool::budget_origin_locked() {
  const auto from_util = static_cast<int64_t>(utilization_ * static_cast<double>(total_memory_));
  if (limit_bytes_ > 0 && limit_bytes_ <= from_util) return "--gpu-memory-limit";
  return fmt::format("--gpu-memory-utilization {:.2f} x {} total", utilization_,
                     format_bytes(total_memory_));
}

void DevicePool::throw_oom_locked(size_t request, const std::string& why) {
  const int64_t budget = budget_locked();
  LONGCTX_THROW(ErrorCode::kOutOfMemory,
                "device pool: cannot allocate {} on {}{} (in use {}, cached {}, budget {} = {})",
                format_bytes(static_cast<int64_t>(request)), backend_->device_name(), why,
                format_bytes(in_use_), format_bytes(reserved_ - in_use_), format_bytes(budget),
                budget_origin_locked());
}

DevicePool::Block* DevicePool::take_free_locked(FreeList& list, size_t size) {
  Block key;
  key.size = size;
  key.ptr = nullptr;
  auto it = list.lower_bound(&key);
  if (it == list.end()) return nullptr;
  Block* b = *it;
  list.erase(it);
  return b;
}

// Cuts b down to `size`, leaving the tail as a free block in `list`.
void DevicePool::split_locked(Block* b, size_t size, FreeList& list) {
  auto* tail = new Block;
  tail->ptr = b->ptr + size;
  tail->size = b->size - size;
  tail->small = b->small;
  tail->owner = b->owner;
  tail->prev = b;
  tail->next = b->next;
  if (b->next) b->next->prev = tail;
  b->next = tail;
  b->size = size;
  list.insert(tail);
}

DevicePool::FreeList& DevicePool::list_of_locked(uint64_t owner, bool small) {
  FreeLists& l = owner == 0 ? shared_ : private_.at(owner);
  return small ? l.small : l.large;
}

uint64_t DevicePool::allocation_owner_locked() const {
  return active_private_ != 0 && std::this_thread::get_id() == active_thread_ ? active_private_ : 0;
}

DevicePool::Block* DevicePool::new_segment_locked(size_t segment_bytes, size_t request, bool small,
                                                  uint64_t owner) {
  const int64_t budget = budget_locked();
  if (reserved_ + static_cast<int64_t>(segment_bytes) > budget) release_cached_locked();
  if (reserved_ + static_cast<int64_t>(segment_bytes) > budget) throw_oom_locked(request, "");
  void* p = backend_->raw_alloc(segment_bytes);
  if (!p) {
    // Segments this pool caches are the likeliest memory to free for the driver.
    if (release_cached_locked() > 0) p = backend_->raw_alloc(segment_bytes);
    if (!p) {
      throw_oom_locked(request,
                       fmt::format(": the device refused a {} segment ({} free on the device)",
                                   format_bytes(static_cast<int64_t>(segment_bytes)),
                                   format_bytes(backend_->free_memory())));
    }
  }
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = segment_bytes;
  b->small = small;
  b->owner = owner;
  segments_[b->ptr] = Segment{b, segment_bytes, owner};
  reserved_ += static_cast<int64_t>(segment_bytes);
  return b;
}

void* DevicePool::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  LONGCTX_CHECK(bytes <= (size_t{1} << 60), ErrorCode::kOutOfMemory,
                "device pool: request of {} bytes is not a size", bytes);
  const size_t size = round_size(bytes);
  const bool small = size < kSmallLimit;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t owner = allocation_owner_locked();
  FreeList& list = list_of_locked(owner, small);
  Block* b = take_free_locked(list, size);
  if (!b) {
    const size_t seg =
        small ? kSmallSegment : (size + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
    b = new_segment_locked(seg, bytes, small, owner);
  }
  // A small tail is worth keeping at any size; a large segment's tail only from 1 MiB on, so the
  // large list does not fill with slivers no large request can use.
  const size_t remainder = b->size - size;
  if (remainder >= (small ? kAlignment : kSmallLimit)) split_locked(b, size, list);
  b->allocated = true;
  live_[b->ptr] = b;
  in_use_ += static_cast<int64_t>(b->size);
  peak_in_use_ = std::max(peak_in_use_, in_use_);
  return b->ptr;
}

void DevicePool::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  LONGCTX_ASSERT(it != live_.end(), "device pool on {}: free of {} which it did not hand out",
                 backend_->device_name(), ptr);
  Block* b = it->second;
  live_.erase(it);
  in_use_ -= static_cast<int64_t>(b->size);
  b->allocated = false;
  FreeList& list = list_of_locked(b->owner, b->small);
  if (b->prev && !b->prev->allocated) {
    Block* p = b->prev;
    list.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next && !b->next->allocated) {
    Block* n = b->next;
    list.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  list.insert(b);
}

size_t DevicePool::release_cached_locked() {
  size_t released = 0;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* first = it->second.first;
    // A private segment stays: a captured graph may still use its addresses.
    if (it->second.owner == 0 && !first->allocated && first->size == it->second.size) {
      (first->small ? shared_.small : shared_.large).erase(first);
      backend_->raw_free(first->ptr);
      reserved_ -= static_cast<int64_t>(it->second.size);
      released += it->second.size;
      delete first;
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  return released;
}

void DevicePool::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void DevicePool::configure(int64_t limit_bytes, double utilization) {
  LONGCTX_CHECK(limit_bytes >= 0, ErrorCode::kInvalidArgument,
                "device memory limit must be >= 0 bytes (0 = none), got {}", limit_bytes);
  LONGCTX_CHECK(utilization > 0.0 && utilization <= 1.0 && std::isfinite(utilization),
                ErrorCode::kInvalidArgument, "device memory utilization must be in (0, 1], got {}",
                utilization);
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t old_limit = limit_bytes_;
  const double old_util = utilization_;
  limit_bytes_ = limit_bytes;
  utilization_ = utilization;
  // Nothing handed out yet: the device need not be touched (the budget is computed on first use).
  if (in_use_ == 0 && reserved_ == 0) return;
  const int64_t budget = budget_locked();
  if (budget < in_use_) {
    const std::string origin = budget_origin_locked();
    limit_bytes_ = old_limit;
    utilization_ = old_util;
    LONGCTX_THROW(ErrorCode::kInvalidArgument,
                  "device pool on {}: a budget of {} (= {}) is below the {} in use",
                  backend_->device_name(), format_bytes(budget), origin, format_bytes(in_use_));
  }
  // Cached memory past the new budget goes back now; partly used segments stay until freed
  // (new segments are refused while reserved exceeds the budget).
  if (reserved_ > budget) release_cached_locked();
}

DeviceMemoryStats DevicePool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceMemoryStats s;
  s.budget = budget_locked();
  s.reserved = reserved_;
  s.in_use = in_use_;
  s.peak_in_use = peak_in_use_;
  s.num_allocations = static_cast<int64_t>(live_.size());
  s.device_total = total_memory_;
  s.device_free = backend_->free_memory();
  return s;
}

size_t DevicePool::block_size(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(const_cast<void*>(ptr));
  return it == live_.end() ? 0 : it->second->size;
}

int64_t DevicePool::num_segments() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(segments_.size());
}

uint64_t DevicePool::create_private_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_private_++;
  private_[id];
  return id;
}

void DevicePool::begin_private(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  LONGCTX_CHECK(private_.count(id) == 1, ErrorCode::kInvalidArgument,
                "device pool on {}: private pool {} does not exist (or was released)",
                backend_->device_name(), id);
  LONGCTX_CHECK(active_private_ == 0, ErrorCode::kInvalidArgument,
                "device pool on {}: private pool {} is active already; one at a time",
                backend_->device_name(), active_private_);
  active_private_ = id;
  active_thread_ = std::this_thread::get_id();
}

void DevicePool::end_private() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_private_ != 0 && std::this_thread::get_id() == active_thread_) active_private_ = 0;
}

void DevicePool::release_private_pool(uint64_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto pool = private_.find(id);
  if (pool == private_.end()) return;
  if (active_private_ == id) active_private_ = 0;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment& seg = it->second;
    if (seg.owner != id) {
      ++it;
      continue;
    }
    seg.owner = 0;
    for (Block* b = seg.first; b; b = b->next) {
      b->owner = 0;
      if (!b->allocated) (b->small ? shared_.small : shared_.large).insert(b);
    }
    if (!seg.first->allocated && seg.first->size == seg.size) {
      (seg.first->small ? shared_.small : shared_.large).erase(seg.first);
      backend_->raw_free(seg.first->ptr);
      reserved_ -= static_cast<int64_t>(seg.size);
      delete seg.first;
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  private_.erase(pool);
}

int64_t DevicePool::private_reserved(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [base, seg] : segments_)
    if (id != 0 && seg.owner == id) n += static_cast<int64_t>(seg.size);
  return n;
}

uint64_t DevicePool::owner_of(const void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(const_cast<void*>(ptr));
  return it == live_.end() ? 0 : it->second->owner;
}

}  // namespace detail
}  // namespace longctx
