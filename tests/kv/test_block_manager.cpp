// BlockManager: reference counts, the prefix cache's hash chain, copy-on-write of a fully hit
// prompt, LRU eviction, refusal without side effects, and a random stress run that must end
// with every block free and every invariant intact.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "kv/block_manager.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(BlockManager, AllocatesAndFreesWithoutCaching) {
  BlockManager bm(8, 4, /*enable_prefix_caching=*/false);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(10);
  auto r = bm.start(1, t, 100, &copies);
  EXPECT_EQ(r.num_cached, 0);
  EXPECT_EQ(r.num_new, 10);
  EXPECT_EQ(bm.table(1).size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_TRUE(bm.append(1, 10, 2, &copies));  // 12 tokens: still 3 blocks
  EXPECT_EQ(bm.table(1).size(), 3u);
  EXPECT_TRUE(bm.append(1, 12, 1, &copies));  // 13: a fourth
  EXPECT_EQ(bm.table(1).size(), 4u);
  bm.commit(1, iota_tokens(13), 13);
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_EQ(bm.stats().cached_blocks, 0);
  EXPECT_TRUE(copies.empty());
  bm.check_consistency();
}

TEST(BlockManager, TruncateReleasesTheBlocksOfRejectedDraftTokens) {
  // Speculative decoding: 9 tokens computed, the last sampled one + a draft of 6 take slots up
  // to 16 (4 blocks); 2 drafts are accepted (12 tokens computed): the fourth block goes back.
  BlockManager bm(8, 4, /*enable_prefix_caching=*/true);
  std::vector<KVBlockCopy> copies;
  const auto t = iota_tokens(10);
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_new, 10);
  bm.commit(1, t, 9);
  EXPECT_TRUE(bm.append(1, 9, 7, &copies));
  EXPECT_EQ(bm.table(1).size(), 4u);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  bm.truncate(1, 12);
  EXPECT_EQ(bm.table(1).size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  // Only blocks full of accepted tokens are cached: 3 of them at 12 tokens.
  bm.commit(1, iota_tokens(13), 12);
  EXPECT_EQ(bm.stats().cached_blocks, 3);
  bm.check_consistency();
  // Back to fewer tokens than a committed block holds is a bug, not a rollback.
  EXPECT_THROW(bm.truncate(1, 4), Error);
  bm.truncate(1, 12);  // no-op
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  bm.check_consistency();
}

TEST(BlockManager, PrefixHitSharesFullBlocks) {
  BlockManager bm(16, 4, true);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(14);  // 3 full blocks + 2 tokens
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_cached, 0);
  bm.commit(1, t, 14);
  EXPECT_EQ(bm.stats().cached_blocks, 3);
  std::vector<int32_t> a(bm.table(1).begin(), bm.table(1).end());
  // A second request with the same first 13 tokens and a different tail, while the first runs.
  auto u = iota_tokens(13);
  u.push_back(99);
  u.push_back(98);
  auto r = bm.start(2, u, 100, &copies);
  EXPECT_EQ(r.num_cached, 12);
  EXPECT_EQ(r.num_new, 3);
  auto b = bm.table(2);
  ASSERT_EQ(b.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[i]);
  EXPECT_NE(b[3], a[3]);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.stats().hits, 12);
  EXPECT_EQ(bm.stats().queries, 14 + 15);
  bm.check_consistency();
  bm.free(1);
  bm.free(2);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(), 16);
  // Freed blocks stay cached: a third request still hits.
  EXPECT_EQ(bm.start(3, u, 100, &copies).num_cached, 12);
  bm.free(3);
  bm.check_consistency();
}

TEST(BlockManager, FullHitCopiesTheLastBlockOnWrite) {
  BlockManager bm(8, 4, true);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(8);  // exactly 2 blocks
  bm.start(1, t, 100, &copies);
  bm.commit(1, t, 8);
  std::vector<int32_t> a(bm.table(1).begin(), bm.table(1).end());
  auto r = bm.start(2, t, 100, &copies);
  EXPECT_EQ(r.num_cached, 7);  // the last token is recomputed for its logits
  EXPECT_EQ(r.num_new, 1);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a[1]);
  auto b = bm.table(2);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(copies[0].dst, b[1]);
  EXPECT_NE(b[1], a[1]);
  bm.check_consistency();
  bm.free(1);
  // The copy's source is held until the step ends: nothing can take and overwrite it yet.
  const int64_t free_before = bm.num_free_blocks();
  bm.end_step();
  EXPECT_EQ(bm.num_free_blocks(), free_before + 1);
  bm.commit(2, t, 8);  // same content as the cached block: stays private
  EXPECT_EQ(bm.stats().cached_blocks, 2);
  bm.free(2);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(), 8);
}

// A KV store load's blocks: pinned while their K/V arrive (out of every free list: nothing
// evicts or takes them), then cached under their chain hash, a prefix hit once unpinned.
TEST(BlockManager, PinnedBlocksAreNeitherTakenNorEvictedUntilUnpinned) {
  BlockManager bm(4, 4, true);
  std::vector<KVBlockCopy> copies;
  const auto t = iota_tokens(9);  // 2 full blocks + 1 token
  std::vector<uint64_t> hashes;
  ASSERT_EQ(bm.cached_prefix(std::span(t).first(8), &hashes), 0);
  ASSERT_EQ(hashes.size(), 2u);
  const int32_t p0 = bm.take_pinned(), p1 = bm.take_pinned();
  ASSERT_GE(p0, 0);
  ASSERT_GE(p1, 0);
  EXPECT_EQ(bm.num_pinned(), 2);
  EXPECT_EQ(bm.num_free_blocks(), 2);
  bm.check_consistency();
  // Another sequence takes the other two blocks; none is left, pinned ones included.
  ASSERT_EQ(bm.start(7, iota_tokens(8, 100), 100, &copies).num_cached, 0);
  EXPECT_EQ(bm.take_pinned(), -1);
  EXPECT_FALSE(bm.append(7, 8, 1, &copies));
  bm.free(7);  // its blocks are not full-committed: free, uncached
  bm.end_step();
  // Cached in order: now the prefix hit of a sequence with these tokens.
  EXPECT_TRUE(bm.cache_pinned(p0, 0, std::span(t).first(4)));
  EXPECT_TRUE(bm.cache_pinned(p1, hashes[0], std::span(t).subspan(4, 4)));
  EXPECT_EQ(bm.cached_prefix(std::span(t).first(8), &hashes), 2);
  EXPECT_EQ(bm.num_free_blocks(), 2);  // still pinned: not evictable
  bm.check_consistency();
  const auto r = bm.start(1, t, 100, &copies);
  EXPECT_EQ(r.num_cached, 8);
  EXPECT_EQ(bm.table(1)[0], p0);
  EXPECT_EQ(bm.table(1)[1], p1);
  bm.unpin(p0);
  bm.unpin(p1);
  EXPECT_EQ(bm.num_pinned(), 0);
  bm.check_consistency();
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  // A pinned block whose hash is already cached is not registered twice; unpinned, it is free.
  const int32_t dup = bm.take_pinned();
  ASSERT_GE(dup, 0);
  EXPECT_FALSE(bm.cache_pinned(dup, 0, std::span(t).first(4)));
  bm.unpin(dup);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_EQ(bm.stats().cached_blocks, 2);
  EXPECT_THROW(bm.unpin(dup), Error);
  bm.check_consistency();
}

TEST(BlockManager, ChainHashDependsOnTheWholePrefix) {
  BlockManager bm(8, 2, true);
  std::vector<KVBlockCopy> copies;
  std::vector<int32_t> a = {1, 2, 3, 4, 5};
  std::vector<int32_t> b = {9, 9, 3, 4, 5};  // same second block, different first
  bm.start(1, a, 100, &copies);
  bm.commit(1, a, 5);
  EXPECT_EQ(bm.start(2, b, 100, &copies).num_cached, 0);
  bm.free(1);
  bm.free(2);
  bm.check_consistency();
}

TEST(BlockManager, EvictsLeastRecentlyUsedCachedBlocks) {
  BlockManager bm(4, 2, true);
  std::vector<KVBlockCopy> copies;
  std::vector<int32_t> a = {1, 2, 3, 4, 5};
  bm.start(1, a, 100, &copies);
  bm.commit(1, a, 5);
  bm.free(1);
  EXPECT_EQ(bm.stats().cached_blocks, 2);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  // 7 tokens need all 4 blocks: the free one, then the cached ones (the tail first).
  std::vector<int32_t> c = {7, 7, 7, 7, 7, 7, 7};
  ASSERT_EQ(bm.start(2, c, 100, &copies).num_cached, 0);
  EXPECT_EQ(bm.stats().cached_blocks, 0);
  bm.free(2);
  EXPECT_EQ(bm.start(3, a, 100, &copies).num_cached, 0);
  bm.free(3);
  bm.check_consistency();
}

TEST(BlockManager, RefusesWithoutSideEffects) {
  BlockManager bm(3, 4, true);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(9);
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_cached, 0);  // 3 blocks
  EXPECT_EQ(bm.start(2, iota_tokens(2, 50), 100, &copies).num_cached, -1);
  EXPECT_FALSE(bm.holds(2));
  EXPECT_FALSE(bm.append(1, 9, 4, &copies));  // 13 tokens need a fourth block
  EXPECT_EQ(bm.table(1).size(), 3u);
  EXPECT_EQ(bm.stats().queries, 9);  // a refused start is not a query
  bm.check_consistency();
  // A chunk that fits is fine.
  EXPECT_TRUE(bm.append(1, 9, 3, &copies));
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 3);
}

TEST(BlockManager, RejectsBadSizes) {
  EXPECT_THROW(BlockManager(0, 16, true), Error);
  EXPECT_THROW(BlockManager(16, 0, true), Error);
}

// Random starts, growth, commits, frees and copy-on-writes over shared prompt families.
TEST(BlockManager, RandomStressEndsWithEverythingFree) {
  std::mt19937_64 rng(5);
  BlockManager bm(64, 4, true);
  struct Live {
    std::vector<int32_t> tokens;
    int64_t computed = 0;
  };
  std::unordered_map<uint64_t, Live> live;
  std::vector<std::vector<int32_t>> families;
  for (int f = 0; f < 6; ++f) {
    std::vector<int32_t> p(4 * (1 + rng() % 6) + rng() % 4);
    for (auto& x : p) x = static_cast<int32_t>(rng() % 5);
    families.push_back(p);
  }
  uint64_t next = 0;
  int64_t refused = 0, hits = 0;
  for (int step = 0; step < 4000; ++step) {
    std::vector<KVBlockCopy> copies;
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 || live.empty()) {
      Live l;
      l.tokens = families[rng() % families.size()];
      l.tokens.resize(l.tokens.size() - rng() % 3);
      if (l.tokens.empty()) l.tokens.push_back(1);
      auto r = bm.start(next, l.tokens, 1 + static_cast<int64_t>(rng() % 8), &copies);
      if (r.num_cached < 0) {
        ++refused;
      } else {
        hits += r.num_cached;
        l.computed = r.num_cached + r.num_new;
        bm.commit(next, l.tokens, l.computed);
        live.emplace(next, l);
      }
      ++next;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      Live& l = it->second;
      if (op == 3) {
        bm.free(it->first);
        live.erase(it);
      } else {
        if (l.computed == static_cast<int64_t>(l.tokens.size()))
          l.tokens.push_back(static_cast<int32_t>(rng() % 5));
        const int64_t n = std::min<int64_t>(l.tokens.size() - l.computed, 1 + rng() % 5);
        if (bm.append(it->first, l.computed, n, &copies)) {
          l.computed += n;
          bm.commit(it->first, l.tokens, l.computed);
        }
      }
    }
    for (const KVBlockCopy& c : copies) EXPECT_NE(c.src, c.dst);
    bm.end_step();
    if (step % 97 == 0) bm.check_consistency();
  }
  for (auto& [id, l] : live) bm.free(id);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(), 64);
  EXPECT_EQ(bm.stats().used_blocks, 0);
  EXPECT_GT(hits, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace longctx
