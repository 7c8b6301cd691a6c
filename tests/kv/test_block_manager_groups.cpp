// BlockManager with several KV groups (attention/kv_groups.h): a table per group from one shared
// pool, a sliding-window group dropping blocks wholly before its window, prefix hits limited to
// where every sliding group still has each block its window needs, preemption (free) of every
// group, per-sequence state slots, and a random stress run over two groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "kv/block_manager.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

constexpr KvGroupAlloc kFull{KvGroupKind::kFull, 0};
KvGroupAlloc sliding(int64_t w) { return {KvGroupKind::kSlidingWindow, w}; }

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

int64_t live_entries(std::span<const int32_t> table) {
  return std::count_if(table.begin(), table.end(), [](int32_t b) { return b != kNoBlock; });
}

TEST(BlockManagerGroups, EachGroupHasItsOwnTableFromOneSharedPool) {
  BlockManager bm(64, 4, false, {kFull, sliding(8)});
  ASSERT_EQ(bm.num_groups(), 2);
  std::vector<KVBlockCopy> copies;
  auto r = bm.start(1, iota_tokens(20), 100, &copies);
  EXPECT_EQ(r.num_cached, 0);
  EXPECT_EQ(r.num_new, 20);
  // The whole first chunk is written, so the sliding group holds all of it for now.
  ASSERT_EQ(bm.table(1, 0).size(), 5u);
  ASSERT_EQ(bm.table(1, 1).size(), 5u);
  std::set<int32_t> ids(bm.table(1, 0).begin(), bm.table(1, 0).end());
  ids.insert(bm.table(1, 1).begin(), bm.table(1, 1).end());
  EXPECT_EQ(ids.size(), 10u);  // no block serves two groups
  EXPECT_EQ(bm.num_free_blocks(), 54);
  // Queries from position 20 see keys > 12: blocks 0-2 (tokens 0-11) are out of the window.
  ASSERT_TRUE(bm.append(1, 20, 1, &copies));
  auto s = bm.table(1, 1);
  ASSERT_EQ(s.size(), 6u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s[i], kNoBlock) << i;
  for (int i = 3; i < 6; ++i) EXPECT_GE(s[i], 0) << i;
  EXPECT_EQ(bm.table(1, 0).size(), 6u);
  EXPECT_EQ(live_entries(bm.table(1, 0)), 6);
  EXPECT_EQ(bm.num_free_blocks(), 64 - 6 - 3);
  const BlockManagerStats st = bm.stats();
  ASSERT_EQ(st.group_used_blocks.size(), 2u);
  EXPECT_EQ(st.group_used_blocks[0], 6);
  EXPECT_EQ(st.group_used_blocks[1], 3);
  bm.check_consistency();
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 64);
  bm.check_consistency();
}

TEST(BlockManagerGroups, SlidingGroupHoldsOnlyItsWindowWhileDecoding) {
  BlockManager bm(64, 4, true, {kFull, sliding(8)});
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(8);
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_new, 8);
  int64_t computed = 8;
  bm.commit(1, t, computed);
  int64_t most = 0;
  for (int i = 0; i < 100; ++i) {
    t.push_back(1000 + i);
    ASSERT_TRUE(bm.append(1, computed, 1, &copies));
    ++computed;
    bm.commit(1, t, computed);
    bm.end_step();
    most = std::max(most, live_entries(bm.table(1, 1)));
    EXPECT_EQ(live_entries(bm.table(1, 0)), bm.blocks_for(computed));
    if (i % 13 == 0) bm.check_consistency();
  }
  // 7 earlier keys + the new token straddle at most 3 blocks of 4.
  EXPECT_EQ(most, 3);
  EXPECT_EQ(bm.max_blocks_held(108, 1), 27 + 3);
  EXPECT_EQ(bm.max_blocks_held(6, 1), 2 + 2);  // a short sequence: its whole length
  bm.free(1);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(), 64);
}

// Runs a 32-token prompt through a {full, sliding 8} manager in chunks of 4 (the sliding group
// drops blocks 0-4 on the way, cached and evictable), frees it, and (when evict) takes 30 fresh
// blocks for another sequence: the 24 uncached free blocks, then the least recently released
// cached ones, which are the dropped sliding blocks 0-4 and the full group's block 7.
void run_and_free(BlockManager& bm, const std::vector<int32_t>& t, bool evict) {
  std::vector<KVBlockCopy> copies;
  ASSERT_EQ(bm.start(1, t, 4, &copies).num_new, 4);
  bm.commit(1, t, 4);
  for (int64_t c = 4; c < 32; c += 4) {
    ASSERT_TRUE(bm.append(1, c, 4, &copies));
    bm.commit(1, t, c + 4);
  }
  EXPECT_EQ(bm.table(1, 1)[4], kNoBlock);
  bm.free(1);
  EXPECT_EQ(bm.stats().cached_blocks, 16);
  if (evict) {  // 24 uncached free blocks, then 6 cached ones
    ASSERT_EQ(bm.start(99, iota_tokens(60, 5000), 100, &copies).num_new, 60);
    EXPECT_EQ(bm.stats().cached_blocks, 10);
    bm.free(99);
  }
  bm.check_consistency();
}

TEST(BlockManagerGroups, PrefixHitNeedsEverySlidingBlockOfTheWindow) {
  const auto t = iota_tokens(32);
  std::vector<KVBlockCopy> copies;
  auto longer = t;  // the whole prompt + one token
  longer.push_back(999);
  auto branch = iota_tokens(24);  // the first 6 blocks + another tail
  branch.push_back(777);
  branch.push_back(778);
  {  // Nothing evicted: every hit as with one group.
    BlockManager bm(40, 4, true, {kFull, sliding(8)});
    run_and_free(bm, t, false);
    EXPECT_EQ(bm.start(2, longer, 100, &copies).num_cached, 32);
    EXPECT_EQ(bm.start(3, branch, 100, &copies).num_cached, 24);
    bm.check_consistency();
  }
  BlockManager bm(40, 4, true, {kFull, sliding(8)});
  run_and_free(bm, t, true);
  // The full group lost block 7: 7 blocks hit, and at 28 tokens the window needs sliding blocks
  // 5 and 6 (keys 21-27), still cached; blocks 0-4 are not needed.
  auto r = bm.start(2, longer, 100, &copies);
  EXPECT_EQ(r.num_cached, 28);
  auto s = bm.table(2, 1);
  ASSERT_EQ(s.size(), 9u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s[i], kNoBlock) << i;
  EXPECT_EQ(live_entries(bm.table(2, 0)), 9);
  // At 24 tokens the window needs block 4 (keys 17-19), evicted; every shorter hit needs an
  // evicted block too: no hit, although the full group still has blocks 0-5.
  EXPECT_EQ(bm.start(3, branch, 100, &copies).num_cached, 0);
  bm.check_consistency();
  bm.free(2);
  bm.free(3);
  bm.end_step();
  EXPECT_EQ(bm.num_free_blocks(), 40);
  bm.check_consistency();
}

TEST(BlockManagerGroups, FreeingForPreemptionReleasesEveryGroup) {
  BlockManager bm(16, 4, true, {kFull, sliding(4)});
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(16);
  ASSERT_EQ(bm.start(1, t, 8, &copies).num_new, 8);
  bm.commit(1, t, 8);
  ASSERT_TRUE(bm.append(1, 8, 8, &copies));
  bm.commit(1, t, 16);
  EXPECT_EQ(bm.table(1, 1)[0], kNoBlock);  // keys < 5 are out of every window from 8 on
  EXPECT_EQ(bm.stats().group_used_blocks, (std::vector<int64_t>{4, 3}));
  auto u = iota_tokens(16, 100);
  ASSERT_EQ(bm.start(2, u, 16, &copies).num_new, 16);
  bm.commit(2, u, 16);
  // A third sequence does not fit until one is preempted (freed, to be recomputed later).
  EXPECT_EQ(bm.start(3, iota_tokens(16, 200), 16, &copies).num_cached, -1);
  bm.free(1);
  bm.check_consistency();
  EXPECT_FALSE(bm.holds(1));
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_EQ(bm.stats().group_used_blocks, (std::vector<int64_t>{4, 4}));
  // The preempted one comes back and hits its cached prefix: all 4 blocks hit, the last token is
  // recomputed (a copy-on-write in each group), and the sliding group needs only block 3.
  auto r = bm.start(1, t, 16, &copies);
  EXPECT_EQ(r.num_cached, 15);
  EXPECT_EQ(copies.size(), 2u);
  EXPECT_EQ(live_entries(bm.table(1, 1)), 1);
  bm.end_step();
  bm.check_consistency();
  bm.free(1);
  bm.free(2);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(), 16);
}

TEST(BlockManagerGroups, StateGroupHoldsOneSlotPerSequence) {
  BlockManager bm(16, 4, true, {kFull, {KvGroupKind::kState, 0}}, 2);
  EXPECT_EQ(bm.num_free_state_slots(), 2);
  std::vector<KVBlockCopy> copies;
  auto t = iota_tokens(8);
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_cached, 0);
  bm.commit(1, t, 8);
  ASSERT_EQ(bm.table(1, 1).size(), 1u);
  EXPECT_EQ(bm.num_free_state_slots(), 1);
  // No prefix hits without state snapshots: the same prompt computes again.
  EXPECT_EQ(bm.start(2, t, 100, &copies).num_cached, 0);
  EXPECT_NE(bm.table(1, 1)[0], bm.table(2, 1)[0]);
  EXPECT_EQ(bm.start(3, t, 100, &copies).num_cached, -1);  // no slot left
  EXPECT_EQ(bm.num_free_blocks(), 12);                     // and nothing taken
  bm.check_consistency();
  bm.free(1);
  EXPECT_EQ(bm.start(3, t, 100, &copies).num_cached, 0);
  bm.free(2);
  bm.free(3);
  EXPECT_EQ(bm.num_free_state_slots(), 2);
  EXPECT_EQ(bm.max_blocks_held(100, 8), 25);  // a state costs no blocks
  bm.check_consistency();
}

// A step's tables of groups 1..G-1: a paged group's cut to the blocks the step's end needs, a
// state group's slot whole.
TEST(BlockManagerGroups, StepTablesCutPagedGroupsAndKeepTheStateSlot) {
  BlockManager bm(32, 4, false, {kFull, sliding(8), {KvGroupKind::kState, 0}}, 2);
  std::vector<KVBlockCopy> copies;
  const auto t = iota_tokens(10);
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_cached, 0);
  std::vector<std::span<const int32_t>> tables(2);
  bm.step_tables(1, 6, tables);
  ASSERT_EQ(tables[0].size(), 2u);  // tokens [0, 6): two blocks of the sliding group's three
  EXPECT_EQ(tables[0].data(), bm.table(1, 1).data());
  ASSERT_EQ(tables[1].size(), 1u);  // the state slot
  EXPECT_EQ(tables[1][0], bm.table(1, 2)[0]);
  bm.step_tables(1, 10, tables);
  EXPECT_EQ(tables[0].size(), 3u);
  std::vector<std::span<const int32_t>> wrong(1);
  EXPECT_THROW(bm.step_tables(1, 10, wrong), Error);
  bm.free(1);
  bm.check_consistency();
}

TEST(BlockManagerGroups, RejectsBadGroups) {
  EXPECT_THROW(BlockManager(16, 4, true, {}), Error);
  EXPECT_THROW(BlockManager(16, 4, true, {sliding(0)}), Error);
  EXPECT_THROW(BlockManager(16, 4, true, {{KvGroupKind::kState, 0}}, 0), Error);
}

// The single-group stress run, over a full and a sliding group.
TEST(BlockManagerGroups, RandomStressEndsWithEverythingFree) {
  std::mt19937_64 rng(7);
  BlockManager bm(64, 4, true, {kFull, sliding(6)});
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
        const int64_t before = l.computed;
        if (bm.append(it->first, l.computed, n, &copies)) {
          l.computed += n;
          bm.commit(it->first, l.tokens, l.computed);
        }
        // Every block the window at `before` needs is held (append dropped only earlier ones).
        auto s = bm.table(it->first, 1);
        const int64_t live_from = std::max<int64_t>(0, before - 6 + 1) / 4;
        for (int64_t i = live_from; i < static_cast<int64_t>(s.size()); ++i) EXPECT_GE(s[i], 0);
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
