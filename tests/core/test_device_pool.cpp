// The device pool's logic over a fake backend: fake addresses (never dereferenced) from a fake
// device of configurable size, so budgets of many GiB cost nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/device_pool.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"

using namespace longctx;
using detail::DevicePool;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

class FakeBackend final : public detail::DevicePoolBackend {
 public:
  explicit FakeBackend(int64_t total) : total_(total) {}
  void* raw_alloc(size_t bytes) override {
    ++alloc_calls;
    if (refuse_next > 0) {
      --refuse_next;
      return nullptr;
    }
    if (held + int64_t(bytes) > total_) return nullptr;
    const uintptr_t p = next_;
    next_ += (bytes + 4 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);  // gaps between segments
    segments[p] = bytes;
    held += int64_t(bytes);
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void* ptr) override {
    auto it = segments.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, segments.end()) << "raw_free of a pointer the backend did not hand out";
    held -= int64_t(it->second);
    segments.erase(it);
    ++free_calls;
  }
  int64_t total_memory() override { return total_; }
  int64_t free_memory() override { return total_ - held; }
  std::string device_name() override { return "cuda:7"; }

  std::map<uintptr_t, size_t> segments;  // live segments: base -> bytes
  int64_t held = 0;
  int refuse_next = 0;  // the next N raw_alloc calls fail as cudaMalloc out of memory would
  int alloc_calls = 0, free_calls = 0;

 private:
  int64_t total_;
  uintptr_t next_ = uintptr_t{1} << 44;
};

std::string oom_message(DevicePool& pool, size_t bytes) {
  try {
    pool.allocate(bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "allocate(" << bytes << ") did not throw";
  return "";
}

}  // namespace

TEST(FormatBytes, Units) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(300 * kMiB), "300.0 MiB");
  EXPECT_EQ(format_bytes(kGiB + kGiB / 5), "1.2 GiB");
  EXPECT_EQ(format_bytes(-2 * kGiB), "-2.0 GiB");
}

TEST(DevicePool, RoundingAndSmallLargeSegments) {
  FakeBackend be(80 * kGiB);
  DevicePool pool(&be);
  void* a = pool.allocate(1);
  EXPECT_EQ(pool.block_size(a), 512u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 512, 0u);
  void* b = pool.allocate(1000);
  EXPECT_EQ(pool.block_size(b), 1024u);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 512);  // carved from the same segment
  EXPECT_EQ(pool.num_segments(), 1);
  EXPECT_EQ(be.segments.begin()->second, size_t(DevicePool::kSmallSegment));
  EXPECT_EQ(pool.allocate(0), nullptr);
  // Large: its own segment rounded to 2 MiB; a tail under 1 MiB stays in the block.
  void* c = pool.allocate(1 * kMiB + kMiB / 2);
  EXPECT_EQ(pool.block_size(c), size_t(2 * kMiB));
  EXPECT_EQ(pool.num_segments(), 2);
  // A tail of >= 1 MiB is cached for the next large request, which gets it without a new segment.
  void* d = pool.allocate(3 * kMiB);
  EXPECT_EQ(pool.block_size(d), size_t(3 * kMiB));
  EXPECT_EQ(pool.num_segments(), 3);
  void* e = pool.allocate(1 * kMiB);
  EXPECT_EQ(static_cast<char*>(e), static_cast<char*>(d) + 3 * kMiB);
  EXPECT_EQ(pool.num_segments(), 3);
  const DeviceMemoryStats s = pool.stats();
  EXPECT_EQ(s.in_use, 512 + 1024 + 2 * kMiB + 3 * kMiB + 1 * kMiB);
  EXPECT_EQ(s.reserved, 2 * kMiB + 2 * kMiB + 4 * kMiB);
  EXPECT_EQ(s.num_allocations, 5);
  EXPECT_EQ(s.budget, int64_t(0.9 * double(80 * kGiB)));
  EXPECT_EQ(s.device_total, 80 * kGiB);
  EXPECT_EQ(s.device_free, 80 * kGiB - s.reserved);
  for (void* p : {a, b, c, d, e}) pool.free(p);
  EXPECT_EQ(pool.stats().in_use, 0);
  EXPECT_EQ(pool.stats().num_allocations, 0);
}

TEST(DevicePool, BudgetEnforcedWithClearMessage) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  pool.configure(4 * kGiB, 0.9);
  void* a = pool.allocate(size_t(3 * kGiB + 400 * kMiB));
  EXPECT_EQ(pool.stats().budget, 4 * kGiB);
  const std::string m = oom_message(pool, size_t(kGiB + kGiB / 5));
  EXPECT_NE(m.find("device pool: cannot allocate 1.2 GiB on cuda:7"), std::string::npos) << m;
  EXPECT_NE(m.find("in use 3.4 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("cached 0 B"), std::string::npos) << m;
  EXPECT_NE(m.find("budget 4.0 GiB = --gpu-memory-limit"), std::string::npos) << m;
  // Nothing changed by the failed request.
  EXPECT_EQ(pool.stats().in_use, 3 * kGiB + 400 * kMiB);
  EXPECT_EQ(pool.stats().num_allocations, 1);
  // Utilization as the binding limit is named as such.
  pool.configure(0, 0.5);
  const std::string u = oom_message(pool, size_t(kGiB));
  EXPECT_NE(u.find("budget 4.0 GiB = --gpu-memory-utilization 0.50 x 8.0 GiB total"),
            std::string::npos)
      << u;
  pool.free(a);
  // Reserved never exceeds the budget, exactly at the edge too.
  void* full = pool.allocate(size_t(4 * kGiB));
  EXPECT_EQ(pool.stats().reserved, 4 * kGiB);
  oom_message(pool, 1);
  pool.free(full);
}

TEST(DevicePool, OverflowFirstReleasesCachedSegments) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  pool.configure(1 * kGiB, 1.0);
  void* a = pool.allocate(size_t(600 * kMiB));
  pool.free(a);  // cached: 600 MiB reserved, 0 in use
  EXPECT_EQ(pool.stats().reserved, 600 * kMiB);
  // 700 MiB does not fit the cached block and 600 + 700 > 1 GiB: the cache goes back first.
  void* b = pool.allocate(size_t(700 * kMiB));
  EXPECT_EQ(pool.stats().reserved, 700 * kMiB);
  EXPECT_EQ(be.segments.size(), 1u);
  EXPECT_EQ(be.free_calls, 1);
  pool.free(b);
}

TEST(DevicePool, BackendOutOfMemoryBecomesKOutOfMemory) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  void* cached = pool.allocate(size_t(64 * kMiB));
  pool.free(cached);
  // The device refuses once: the pool releases its cache and retries, which succeeds.
  be.refuse_next = 1;
  void* a = pool.allocate(size_t(100 * kMiB));
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(be.segments.size(), 1u);
  // Refuses twice: error naming the bytes (the request and the segment asked for).
  be.refuse_next = 2;
  const std::string m = oom_message(pool, size_t(200 * kMiB));
  EXPECT_NE(m.find("cannot allocate 200.0 MiB on cuda:7: the device refused a 200.0 MiB segment"),
            std::string::npos)
      << m;
  EXPECT_EQ(pool.stats().in_use, 100 * kMiB);
  pool.free(a);
}

TEST(DevicePool, ReuseGivesTheSameAddress) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  for (size_t bytes : {size_t(100), size_t(4096), size_t(3 * kMiB), size_t(kGiB)}) {
    void* a = pool.allocate(bytes);
    pool.free(a);
    const int calls = be.alloc_calls;
    void* b = pool.allocate(bytes);
    EXPECT_EQ(a, b) << bytes;
    EXPECT_EQ(be.alloc_calls, calls) << "reuse must not go to the backend";
    pool.free(b);
  }
  // A replayed sequence of requests (one decode step) gets the same addresses every time.
  auto step = [&] {
    std::vector<void*> ptrs;
    for (size_t bytes : {size_t(5000), size_t(2 * kMiB), size_t(300), size_t(70000)})
      ptrs.push_back(pool.allocate(bytes));
    pool.free(ptrs[1]);
    ptrs.push_back(pool.allocate(size_t(kMiB)));
    for (size_t i = 0; i < ptrs.size(); ++i)
      if (i != 1) pool.free(ptrs[i]);  // ptrs[1] was freed above
    return ptrs;
  };
  const auto first = step();
  EXPECT_EQ(first[4], first[1]);  // the 1 MiB block reuses the freed 2 MiB one's address
  for (int i = 0; i < 5; ++i) EXPECT_EQ(step(), first);
  EXPECT_EQ(pool.stats().in_use, 0);
}

TEST(DevicePool, ReleaseCachedAndPeak) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  void* a = pool.allocate(size_t(10 * kMiB));
  void* b = pool.allocate(size_t(20 * kMiB));
  void* s1 = pool.allocate(100);
  void* s2 = pool.allocate(100);
  EXPECT_EQ(pool.stats().peak_in_use, 30 * kMiB + 1024);
  pool.free(a);
  pool.free(s1);
  EXPECT_EQ(pool.stats().peak_in_use, 30 * kMiB + 1024);
  EXPECT_EQ(pool.stats().in_use, 20 * kMiB + 512);
  EXPECT_EQ(pool.stats().reserved, 30 * kMiB + 2 * kMiB);
  // Only wholly free segments go back: a's segment does, the small one (s2 lives) does not.
  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved, 20 * kMiB + 2 * kMiB);
  EXPECT_EQ(be.held, 20 * kMiB + 2 * kMiB);
  pool.free(b);
  pool.free(s2);
  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved, 0);
  EXPECT_EQ(be.held, 0);
  EXPECT_TRUE(be.segments.empty());
  EXPECT_EQ(pool.stats().peak_in_use, 30 * kMiB + 1024);
}

TEST(DevicePool, ConfigureValidates) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  EXPECT_THROW(pool.configure(-1, 0.9), Error);
  EXPECT_THROW(pool.configure(0, 0.0), Error);
  EXPECT_THROW(pool.configure(0, 1.5), Error);
  void* a = pool.allocate(size_t(2 * kGiB));
  try {
    pool.configure(kGiB, 0.9);
    ADD_FAILURE() << "a budget below what is in use must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("below the 2.0 GiB in use"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(pool.stats().budget, int64_t(0.9 * double(8 * kGiB)));  // unchanged
  pool.free(a);
  pool.configure(kGiB, 0.9);  // the cached 2 GiB segment goes back to fit the new budget
  EXPECT_EQ(pool.stats().reserved, 0);
  EXPECT_EQ(pool.stats().budget, kGiB);
}

// A KV pool of 100 GB and thousands of small activation tensors coexist: small blocks live in
// their own segments and never split the KV segment; everything fits a 120 GiB budget.
TEST(DevicePool, KvPoolAndManySmallTensorsCoexist) {
  FakeBackend be(140 * kGiB);
  DevicePool pool(&be);
  pool.configure(120 * kGiB, 0.95);
  void* kv = pool.allocate(size_t(100'000'000'000));
  std::mt19937 rng(7);
  std::vector<void*> small;
  for (int step = 0; step < 200; ++step) {
    for (int i = 0; i < 50; ++i) small.push_back(pool.allocate(256 + rng() % (512 << 10)));
    // Free a random half: the survivors stay, so fragmentation builds up.
    std::shuffle(small.begin(), small.end(), rng);
    for (size_t i = small.size() / 2; i < small.size(); ++i) pool.free(small[i]);
    small.resize(small.size() / 2);
  }
  const DeviceMemoryStats s = pool.stats();
  const int64_t kv_block = int64_t(pool.block_size(kv));
  EXPECT_LT(kv_block - 100'000'000'000, 2 * kMiB);
  // Cached-but-unused small memory stays bounded (well under 1 GiB here).
  EXPECT_LT(s.reserved - kv_block, kGiB) << format_bytes(s.reserved - kv_block);
  // After a step, a big activation workspace still fits next to the KV pool.
  void* ws = pool.allocate(size_t(8 * kGiB));
  for (void* p : small) pool.free(p);
  pool.free(ws);
  pool.free(kv);
  EXPECT_EQ(pool.stats().in_use, 0);
}

// Random alloc/free of mixed sizes: live blocks never overlap, lie inside backend segments, are
// at least the request, and in_use equals the sum of live block sizes exactly.
TEST(DevicePool, RandomStressInvariants) {
  FakeBackend be(64 * kGiB);
  DevicePool pool(&be);
  pool.configure(6 * kGiB, 1.0);
  std::mt19937_64 rng(12345);
  std::map<uintptr_t, size_t> live;  // address -> block size
  int64_t peak = 0;
  int ooms = 0;
  for (int it = 0; it < 20000; ++it) {
    const bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      size_t bytes;
      switch (rng() % 4) {
        case 0:
          bytes = 1 + rng() % 4096;
          break;
        case 1:
          bytes = 1 + rng() % (1 << 20);
          break;
        case 2:
          bytes = (1 << 20) + rng() % (16 << 20);
          break;
        default:
          bytes = (16 << 20) + rng() % (512 << 20);
      }
      void* p = nullptr;
      try {
        p = pool.allocate(bytes);
      } catch (const Error& e) {
        ASSERT_EQ(e.code(), ErrorCode::kOutOfMemory);
        ++ooms;
        continue;
      }
      const auto a = reinterpret_cast<uintptr_t>(p);
      const size_t size = pool.block_size(p);
      ASSERT_GE(size, bytes);
      ASSERT_EQ(a % DevicePool::kAlignment, 0u);
      // No overlap with the neighbours by address.
      auto next = live.lower_bound(a);
      if (next != live.end()) ASSERT_LE(a + size, next->first);
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, a);
      }
      // Inside one backend segment.
      auto seg = be.segments.upper_bound(a);
      ASSERT_NE(seg, be.segments.begin());
      --seg;
      ASSERT_LE(a + size, seg->first + seg->second);
      live[a] = size;
    } else {
      auto it2 = live.begin();
      std::advance(it2, rng() % live.size());
      pool.free(reinterpret_cast<void*>(it2->first));
      live.erase(it2);
    }
    int64_t sum = 0;
    for (auto& [a, sz] : live) sum += int64_t(sz);
    peak = std::max(peak, sum);
    const DeviceMemoryStats s = pool.stats();
    ASSERT_EQ(s.in_use, sum);
    ASSERT_EQ(s.num_allocations, int64_t(live.size()));
    ASSERT_EQ(s.reserved, be.held);
    ASSERT_LE(s.reserved, s.budget);
    ASSERT_GE(s.reserved, s.in_use);
    if (it % 3000 == 2999) pool.release_cached();
  }
  EXPECT_EQ(pool.stats().peak_in_use, peak);
  EXPECT_GT(ooms, 0) << "the stress should reach the budget";
  for (auto& [a, sz] : live) pool.free(reinterpret_cast<void*>(a));
  pool.release_cached();
  EXPECT_EQ(be.held, 0);
}

// CUDA-graph pools: memory a captured graph uses is never handed to anyone else while the graph
// lives, whenever it is freed; graphs captured one after another share their pool's blocks.
TEST(DevicePool, PrivatePoolKeepsItsBlocksApart) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  void* shared_a = pool.allocate(size_t(4 * kMiB));
  const uint64_t g = pool.create_private_pool();
  pool.begin_private(g);
  void* p_small = pool.allocate(4096);
  void* p_large = pool.allocate(size_t(3 * kMiB));
  pool.end_private();
  EXPECT_EQ(pool.owner_of(p_small), g);
  EXPECT_EQ(pool.owner_of(p_large), g);
  EXPECT_EQ(pool.owner_of(shared_a), 0u);
  EXPECT_EQ(pool.private_reserved(g), int64_t(DevicePool::kSmallSegment + 4 * kMiB));
  // The shared pool had a free 4 MiB block: a private request never takes it.
  pool.free(shared_a);
  EXPECT_EQ(pool.num_segments(), 3);
  // Freed after the capture: the blocks go back to the private pool, not to later shared users.
  pool.free(p_small);
  pool.free(p_large);
  void* s1 = pool.allocate(4096);
  void* s2 = pool.allocate(size_t(3 * kMiB));
  EXPECT_NE(s1, p_small);
  EXPECT_NE(s2, p_large);
  EXPECT_EQ(pool.owner_of(s1), 0u);
  EXPECT_EQ(pool.owner_of(s2), 0u);
  EXPECT_EQ(s2, shared_a);  // the shared cached block, reused
  // release_cached() keeps the wholly free private segments (a graph may still use them).
  pool.free(s1);
  pool.free(s2);
  pool.release_cached();
  EXPECT_EQ(pool.private_reserved(g), int64_t(DevicePool::kSmallSegment + 4 * kMiB));
  EXPECT_EQ(pool.stats().reserved, pool.private_reserved(g));
  // The next capture in the same pool gets the same addresses (no new segment).
  const int calls = be.alloc_calls;
  pool.begin_private(g);
  EXPECT_EQ(pool.allocate(4096), p_small);
  EXPECT_EQ(pool.allocate(size_t(3 * kMiB)), p_large);
  pool.end_private();
  EXPECT_EQ(be.alloc_calls, calls);
  // Release with one block still live: the free segment goes back at once, the live block stays
  // valid and, once freed, is an ordinary shared block.
  pool.free(p_small);
  pool.release_private_pool(g);
  EXPECT_EQ(pool.private_reserved(g), 0);
  EXPECT_EQ(pool.owner_of(p_large), 0u);
  EXPECT_EQ(pool.stats().reserved, 4 * kMiB);
  EXPECT_EQ(be.segments.size(), 1u);
  pool.free(p_large);
  EXPECT_EQ(pool.allocate(size_t(3 * kMiB)), p_large);  // shared now
  pool.free(p_large);
  pool.release_cached();
  EXPECT_EQ(be.held, 0);
  EXPECT_EQ(pool.stats().in_use, 0);
}

TEST(DevicePool, PrivatePoolScopeRules) {
  FakeBackend be(8 * kGiB);
  DevicePool pool(&be);
  const uint64_t a = pool.create_private_pool(), b = pool.create_private_pool();
  EXPECT_NE(a, b);
  EXPECT_THROW(pool.begin_private(a + b + 100), Error);  // unknown
  pool.begin_private(a);
  try {
    pool.begin_private(b);
    ADD_FAILURE() << "two active private pools";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("active already"), std::string::npos) << e.what();
  }
  // Another thread's allocations during the capture stay shared.
  void* other = nullptr;
  std::thread t([&] { other = pool.allocate(1000); });
  t.join();
  EXPECT_EQ(pool.owner_of(other), 0u);
  void* mine = pool.allocate(1000);
  EXPECT_EQ(pool.owner_of(mine), a);
  pool.end_private();
  pool.end_private();  // no-op
  // Private segments count in the budget like any other.
  pool.configure(64 * kMiB, 1.0);
  pool.begin_private(b);
  void* big = pool.allocate(size_t(50 * kMiB));
  pool.end_private();
  EXPECT_EQ(pool.stats().reserved, 2 * DevicePool::kSmallSegment + 50 * kMiB);
  oom_message(pool, size_t(20 * kMiB));
  pool.release_private_pool(a);
  EXPECT_THROW(pool.begin_private(a), Error);  // released
  pool.release_private_pool(a);                // twice: ignored
  for (void* p : {other, mine, big}) pool.free(p);
  pool.release_private_pool(b);
  pool.release_cached();
  EXPECT_EQ(be.held, 0);
}

// The pools cudaMalloc feeds: in a build without CUDA, device allocation says so clearly (a CUDA
// build has no such test: tests/gpu_core allocates on the device).
#ifndef LONGCTX_WITH_CUDA
TEST(DevicePool, NoCudaBuildSaysSo) {
  configure_device_memory(0, 256 * kMiB);  // settings only: the device is not touched
  EXPECT_THROW(configure_device_memory(0, 0, 2.0), Error);
  try {
    Tensor::empty({16}, DType::kF32, Device::cuda(0));
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
  EXPECT_THROW(device_memory_stats(16), Error);
}
#endif
