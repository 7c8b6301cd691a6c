// BlockManager's KV-cache events: a committed block is stored once (a shared prefix too), with
// its parent and tokens; eviction removes it; a random run's events, replayed, give exactly the
// manager's cached set.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "kv/block_manager.h"

namespace longctx {
namespace {

using Kind = KvCacheEvent::Kind;

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Applies events to a mirror of the cached hashes, as a router's indexer would; fails on a store
// of a hash already there or a removal of one that is not.
void apply_events(const std::vector<KvCacheEvent>& events, std::set<uint64_t>& mirror) {
  for (const KvCacheEvent& e : events) {
    if (e.kind == Kind::kAllCleared) mirror.clear();
    for (uint64_t h : e.block_hashes) {
      if (e.kind == Kind::kStored) {
        EXPECT_TRUE(mirror.insert(h).second) << "stored twice: " << h;
      } else {
        EXPECT_EQ(mirror.erase(h), 1u) << "removed but not stored: " << h;
      }
    }
  }
}

TEST(BlockManagerEvents, NothingRecordedUnlessAsked) {
  BlockManager bm(8, 4, true);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(9);
  bm.start(1, t, 100, &copies);
  bm.commit(1, t, 9);
  EXPECT_TRUE(bm.take_events().empty());
  EXPECT_EQ(bm.cached_hashes().size(), 2u);
}

TEST(BlockManagerEvents, StoredOnceWithParentAndTokens) {
  BlockManager bm(16, 4, true);
  bm.record_events(true);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(14);    // 3 full blocks
  bm.start(1, t, 8, &copies);  // a chunk of 8 tokens: 2 blocks full
  bm.commit(1, t, 8);
  bm.append(1, 8, 6, &copies);
  bm.commit(1, t, 14);
  auto ev = bm.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, Kind::kStored);
  EXPECT_EQ(ev[0].block_hashes.size(), 2u);
  EXPECT_FALSE(ev[0].parent_block_hash.has_value());
  EXPECT_EQ(ev[0].token_ids, iota_tokens(8));
  ASSERT_EQ(ev[1].block_hashes.size(), 1u);
  EXPECT_EQ(ev[1].parent_block_hash, ev[0].block_hashes[1]);
  EXPECT_EQ(ev[1].token_ids, iota_tokens(4, 8));
  // The same prefix again (a hit) and another request sharing it: nothing is stored twice, the
  // new tail is stored under the shared parent.
  auto u = iota_tokens(12);
  u.insert(u.end(), {50, 51, 52, 53});
  bm.start(2, u, 100, &copies);
  bm.commit(2, u, 16);
  bm.end_step();
  ev = bm.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].block_hashes.size(), 1u);
  auto cached = bm.cached_hashes();
  EXPECT_EQ(cached.size(), 4u);
  EXPECT_TRUE(bm.take_events().empty());
}

TEST(BlockManagerEvents, EvictionRemoves) {
  BlockManager bm(4, 4, true);
  bm.record_events(true);
  std::vector<KVBlockCopy> copies;
  auto a = iota_tokens(8);
  bm.start(1, a, 100, &copies);
  bm.commit(1, a, 8);
  bm.free(1);  // its 2 blocks stay cached, evictable: no event
  std::set<uint64_t> mirror;
  apply_events(bm.take_events(), mirror);
  EXPECT_EQ(mirror.size(), 2u);
  auto b = iota_tokens(16, 100);  // needs all 4 blocks: both cached ones are evicted
  ASSERT_GE(bm.start(2, b, 100, &copies).num_cached, 0);
  auto ev = bm.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, Kind::kRemoved);
  EXPECT_EQ(ev[0].block_hashes.size(), 2u);
  apply_events(ev, mirror);
  EXPECT_TRUE(mirror.empty());
  bm.commit(2, b, 16);
  apply_events(bm.take_events(), mirror);
  auto cached = bm.cached_hashes();
  EXPECT_EQ(std::vector<uint64_t>(mirror.begin(), mirror.end()), cached);
}

TEST(BlockManagerEvents, RandomRunMirrorsTheCache) {
  std::mt19937 rng(7);
  BlockManager bm(24, 4, true);
  bm.record_events(true);
  std::set<uint64_t> mirror;
  std::vector<KVBlockCopy> copies;
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> live;
  uint64_t next = 0;
  for (int step = 0; step < 400; ++step) {
    if (!live.empty() && (rng() % 3 == 0 || live.size() > 3)) {
      const size_t k = rng() % live.size();
      bm.free(live[k].first);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      // Prompts from a few shared prefixes, so hits and evictions both happen.
      std::vector<int32_t> t = iota_tokens(4 * (1 + rng() % 3), 1000 * (rng() % 3));
      const int64_t tail = 1 + rng() % 9;
      for (int64_t i = 0; i < tail; ++i) t.push_back(static_cast<int32_t>(rng() % 5));
      const uint64_t id = next++;
      const auto r = bm.start(id, t, 100, &copies);
      if (r.num_cached >= 0) {
        bm.commit(id, t, static_cast<int64_t>(t.size()));
        live.emplace_back(id, t);
      }
    }
    bm.end_step();
    apply_events(bm.take_events(), mirror);
    ASSERT_EQ(std::vector<uint64_t>(mirror.begin(), mirror.end()), bm.cached_hashes())
        << "step " << step;
  }
  bm.check_consistency();
}

}  // namespace
}  // namespace longctx
