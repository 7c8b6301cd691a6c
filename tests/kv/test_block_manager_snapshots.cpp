// BlockManager's state snapshots (a full group and a state group, as Qwen3-Next): chunks cut to
// end on block boundaries, a snapshot reserved there and tied to the block at commit, a prefix
// hit cut back to the last block with a snapshot (never ending on the prompt's last token) and
// naming it to restore, the first chunk of a prompt whose K/V hit goes past its last snapshot
// ending at the branch point, a block's eviction freeing its snapshot, a full snapshot pool
// taking the least recently used one, free / failed steps returning reservations, and a random
// run in which every restored snapshot holds the state of exactly the hit's tokens.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

#include "kv/block_manager.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

constexpr int64_t kBs = 4;
const std::vector<KvGroupAlloc> kGroups = {{KvGroupKind::kFull, 0}, {KvGroupKind::kState, 0}};

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs one step of `seq` as the scheduler does: `n` tokens after `done`, a snapshot reserved
// when it ends on a boundary, committed. Returns the reserved snapshot.
int32_t run_step(BlockManager& bm, uint64_t seq, const std::vector<int32_t>& t, int64_t done,
                 int64_t n) {
  const int32_t snap = bm.reserve_snapshot(seq, done + n);
  bm.commit(seq, t, done + n);
  bm.end_step();
  bm.check_consistency();
  return snap;
}

// Starts `seq` and runs its whole prompt in chunks of at most `chunk` (cut as the scheduler
// cuts them). Returns the Start of its first step.
BlockManager::Start run_prompt(BlockManager& bm, uint64_t seq, const std::vector<int32_t>& t,
                               int64_t chunk) {
  std::vector<KVBlockCopy> copies;
  const auto n = static_cast<int64_t>(t.size());
  const BlockManager::Start r = bm.start(seq, t, chunk, &copies);
  EXPECT_GE(r.num_cached, 0);
  EXPECT_TRUE(copies.empty());  // a state model's hit never ends inside a block
  int64_t done = r.num_cached;
  run_step(bm, seq, t, done, r.num_new);
  done += r.num_new;
  while (done < n) {
    const int64_t m = bm.snapshot_chunk(done, std::min(chunk, n - done), n);
    EXPECT_TRUE(bm.append(seq, done, m, &copies));
    run_step(bm, seq, t, done, m);
    done += m;
  }
  return r;
}

TEST(BlockManagerSnapshots, ChunksEndOnBoundariesWhereTheyCan) {
  BlockManager bm(32, kBs, true, kGroups, 2, 4);
  ASSERT_TRUE(bm.snapshots_enabled());
  EXPECT_EQ(bm.snapshot_chunk(0, 14, 14), 12);  // the prompt's last boundary first ...
  EXPECT_EQ(bm.snapshot_chunk(12, 2, 14), 2);   // ... then its tail
  EXPECT_EQ(bm.snapshot_chunk(0, 6, 14), 4);    // a chunk cut short: back to its boundary
  EXPECT_EQ(bm.snapshot_chunk(5, 2, 14), 2);    // no boundary crossed: as asked
  EXPECT_EQ(bm.snapshot_chunk(3, 5, 14), 5);    // ends on one already
  EXPECT_EQ(bm.snapshot_chunk(11, 1, 12), 1);   // decode
  // Without snapshots (prefix caching off, or none asked for) nothing is cut and nothing hits.
  BlockManager off(32, kBs, false, kGroups, 2, 4), none(32, kBs, true, kGroups, 2, 0);
  EXPECT_FALSE(off.snapshots_enabled());
  EXPECT_FALSE(none.snapshots_enabled());
  EXPECT_EQ(none.snapshot_chunk(0, 14, 14), 14);
  const auto t = iota_tokens(14);
  run_prompt(none, 1, t, 100);
  none.free(1);
  std::vector<KVBlockCopy> copies;
  EXPECT_EQ(none.start(2, t, 100, &copies).num_cached, 0);
  EXPECT_EQ(none.reserve_snapshot(2, 4), -1);
}

TEST(BlockManagerSnapshots, HitRestoresTheLastSnapshotBeforeTheLastToken) {
  BlockManager bm(32, kBs, true, kGroups, 2, 4);
  const auto t = iota_tokens(14);
  // Chunks of 6: cut to 4, 8 (boundaries, snapshots), then 12 (the last boundary), then 14.
  const BlockManager::Start r1 = run_prompt(bm, 1, t, 6);
  EXPECT_EQ(r1.num_cached, 0);
  EXPECT_EQ(r1.num_new, 4);
  EXPECT_EQ(r1.restore_snapshot, -1);
  EXPECT_EQ(bm.stats().snapshots_held, 3);  // at 4, 8 and 12
  bm.free(1);
  std::vector<KVBlockCopy> copies;
  // The same 12 tokens, then others: starts from the snapshot at 12.
  auto a = concat(iota_tokens(12), {90, 91, 92});
  BlockManager::Start r = bm.start(2, a, 100, &copies);
  EXPECT_EQ(r.num_cached, 12);
  EXPECT_EQ(r.num_new, 3);
  EXPECT_GE(r.restore_snapshot, 0);
  // Exactly the 12 tokens: a hit must leave one token, so it stops at the snapshot at 8.
  r = bm.start(3, iota_tokens(12), 100, &copies);
  EXPECT_EQ(r.num_cached, 8);
  EXPECT_EQ(r.num_new, 4);
  // The first 10 tokens shared: blocks 0-1 hit, the snapshot at 8.
  r = bm.start(4, concat(iota_tokens(10), {77, 78, 79, 80}), 100, &copies);
  EXPECT_EQ(r.num_cached, -1);  // no state slot left (2 slots, 2 sequences)
  bm.free(3);
  r = bm.start(4, concat(iota_tokens(10), {77, 78, 79, 80}), 100, &copies);
  EXPECT_EQ(r.num_cached, 8);
  EXPECT_EQ(r.num_new, 4);  // its prompt's last boundary (12) first
  EXPECT_TRUE(copies.empty());
  const BlockManagerStats st = bm.stats();
  EXPECT_EQ(st.snapshot_restores, 3);
  EXPECT_EQ(st.hits, 12 + 8 + 8);
  bm.check_consistency();
  bm.free(2);
  bm.free(4);
  bm.check_consistency();
}

// Decode steps that end on boundaries reserve rolling snapshots: each one tied releases the one
// before, so a finished sequence leaves its prompt's snapshots and the one at its last full block,
// from which a follow-up turn (prompt + answer + more) starts.
TEST(BlockManagerSnapshots, DecodeKeepsOneRollingSnapshotForTheNextTurn) {
  BlockManager bm(32, kBs, true, kGroups, 2, 8);
  auto t = iota_tokens(6);  // prompt: snapshot at 4
  run_prompt(bm, 1, t, 100);
  EXPECT_EQ(bm.stats().snapshots_held, 1);
  std::vector<KVBlockCopy> copies;
  // Decode 9 tokens one step at a time (token i is computed in the step after it is sampled).
  for (int32_t i = 0; i < 9; ++i) {
    const auto done = static_cast<int64_t>(t.size());
    t.push_back(100 + i);
    ASSERT_TRUE(bm.append(1, done, 1, &copies));
    const int32_t snap = bm.reserve_snapshot(1, done + 1, /*rolling=*/true);
    EXPECT_EQ(snap >= 0, (done + 1) % kBs == 0) << done;
    bm.commit(1, t, done + 1);
    bm.end_step();
    bm.check_consistency();
  }
  // 15 tokens computed: rolling snapshots were tied at 8 and 12; 12's released 8's.
  EXPECT_EQ(bm.stats().snapshots_held, 2);
  bm.free(1);
  // The next turn: everything so far, then a new question. It starts from the state at 12.
  const BlockManager::Start r = bm.start(2, concat(t, {7, 7, 7}), 100, &copies);
  EXPECT_EQ(r.num_cached, 12);
  EXPECT_GE(r.restore_snapshot, 0);
  // A prompt that branches at 10 finds no snapshot at 8 any more: the prompt's at 4.
  bm.free(2);
  auto b = iota_tokens(6);
  for (int32_t i = 0; i < 4; ++i) b.push_back(100 + i);
  b.push_back(55);
  b.push_back(56);
  const BlockManager::Start r2 = bm.start(3, b, 100, &copies);
  EXPECT_EQ(r2.num_cached, 4);
  bm.free(3);
  bm.check_consistency();
}

TEST(BlockManagerSnapshots, FirstChunkStopsWhereTheCachedPrefixBranches) {
  BlockManager bm(32, kBs, true, kGroups, 2, 8);
  // A 9-token document, then a question: one chunk ends at 16, its last boundary.
  const auto doc = iota_tokens(9);
  run_prompt(bm, 1, concat(doc, {50, 51, 52, 53, 54, 55, 56, 57, 58}), 100);
  bm.free(1);
  // Another question on the document: blocks 0-1 (8 tokens) hit as K/V, without a state there.
  const auto q2 = concat(doc, {60, 61, 62, 63, 64});
  std::vector<KVBlockCopy> copies;
  BlockManager::Start r = bm.start(2, q2, 100, &copies);
  EXPECT_EQ(r.num_cached, 0);
  EXPECT_EQ(r.num_new, 8);  // up to the branch point, whose state is saved
  EXPECT_GE(run_step(bm, 2, q2, 0, 8), 0);
  bm.free(2);
  // A third question starts from the branch point's snapshot.
  r = bm.start(3, concat(doc, {70, 71, 72, 73}), 100, &copies);
  EXPECT_EQ(r.num_cached, 8);
  EXPECT_GE(r.restore_snapshot, 0);
  bm.free(3);
  bm.check_consistency();
}

TEST(BlockManagerSnapshots, EvictingTheBlockFreesItsSnapshot) {
  BlockManager bm(6, kBs, true, kGroups, 2, 4);
  const auto t = iota_tokens(9);
  run_prompt(bm, 1, t, 100);  // snapshot at 8
  bm.free(1);
  EXPECT_EQ(bm.stats().snapshots_held, 1);
  EXPECT_EQ(bm.num_free_snapshots(), 3);
  // An unrelated prompt takes every block: the cached ones are evicted, their snapshot freed.
  std::vector<KVBlockCopy> copies;
  const auto other = iota_tokens(25, 100);
  ASSERT_EQ(bm.start(2, other, 100, &copies).num_cached, 0);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(bm.stats().snapshots_held, 0);
  EXPECT_EQ(bm.num_free_snapshots(), 4);
  bm.check_consistency();
  bm.free(2);
  // The first prompt again: a miss.
  EXPECT_EQ(bm.start(3, t, 100, &copies).num_cached, 0);
  bm.free(3);
  bm.check_consistency();
}

TEST(BlockManagerSnapshots, AFullPoolTakesTheLeastRecentlyUsedSnapshot) {
  BlockManager bm(32, kBs, true, kGroups, 2, 2);
  const auto a = iota_tokens(9), b = iota_tokens(9, 100), c = iota_tokens(9, 200);
  run_prompt(bm, 1, a, 100);
  bm.free(1);
  run_prompt(bm, 2, b, 100);
  bm.free(2);
  std::vector<KVBlockCopy> copies;
  // a's snapshot is used again (most recent now), so c's takes b's.
  EXPECT_EQ(bm.start(3, a, 100, &copies).num_cached, 8);
  bm.free(3);
  run_prompt(bm, 4, c, 100);
  bm.free(4);
  EXPECT_EQ(bm.stats().snapshots_held, 2);
  EXPECT_EQ(bm.start(5, b, 100, &copies).num_cached, 0);  // its K/V still cached, no state
  bm.free(5);
  EXPECT_EQ(bm.start(6, a, 100, &copies).num_cached, 8);
  EXPECT_EQ(bm.start(7, c, 100, &copies).num_cached, 8);
  bm.free(6);
  bm.free(7);
  bm.check_consistency();
}

TEST(BlockManagerSnapshots, FreeAndFailedStepsReturnReservations) {
  BlockManager bm(32, kBs, true, kGroups, 2, 2);
  const auto t = iota_tokens(9);
  std::vector<KVBlockCopy> copies;
  ASSERT_EQ(bm.start(1, t, 100, &copies).num_new, 8);
  EXPECT_GE(bm.reserve_snapshot(1, 8), 0);
  EXPECT_EQ(bm.num_free_snapshots(), 1);
  bm.check_consistency();
  bm.free(1);  // preempted or aborted before its step ran
  EXPECT_EQ(bm.num_free_snapshots(), 2);
  bm.end_step();
  bm.check_consistency();
  ASSERT_EQ(bm.start(2, t, 100, &copies).num_new, 8);
  EXPECT_GE(bm.reserve_snapshot(2, 8), 0);
  EXPECT_EQ(bm.reserve_snapshot(2, 6), -1);  // off a boundary
  bm.end_step();                             // the step failed: nothing committed
  EXPECT_EQ(bm.num_free_snapshots(), 2);
  EXPECT_EQ(bm.stats().snapshots_held, 0);
  bm.check_consistency();
  bm.free(2);
  EXPECT_EQ(bm.num_free_state_slots(), 2);
  bm.check_consistency();
  EXPECT_THROW(BlockManager(32, kBs, true, kGroups, 2, -1), Error);
}

// Sequences from a few prompt families (shared prefixes) start, run chunks of random sizes as the
// scheduler cuts them, fail steps, are freed midway (preemption, abort) or at the end, in a pool
// small enough to evict. Each snapshot's "state" is the tokens it was saved after; a restore must
// hand out exactly the hit's tokens.
TEST(BlockManagerSnapshots, RandomRunRestoresExactlyTheHitsTokens) {
  std::mt19937_64 rng(11);
  BlockManager bm(40, kBs, true, kGroups, 4, 5);
  std::vector<std::vector<int32_t>> families;
  for (int f = 0; f < 5; ++f) {
    std::vector<int32_t> p(6 + rng() % 30);
    for (auto& x : p) x = static_cast<int32_t>(rng() % 3);  // few symbols: many shared blocks
    families.push_back(p);
  }
  struct Live {
    std::vector<int32_t> tokens;
    int64_t done = 0;
  };
  std::unordered_map<uint64_t, Live> live;
  std::map<int32_t, std::vector<int32_t>> saved;  // snapshot -> the tokens its state is after
  uint64_t next = 0;
  int64_t restores = 0, hits = 0;
  std::vector<KVBlockCopy> copies;
  for (int op = 0; op < 4000; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 3 && live.size() < 4) {
      std::vector<int32_t> t = families[rng() % families.size()];
      t.resize(std::max<size_t>(2, t.size() - rng() % 6));
      for (int64_t extra = rng() % 9; extra-- > 0;) t.push_back(static_cast<int32_t>(rng() % 3));
      const uint64_t id = next++;
      const BlockManager::Start r = bm.start(id, t, 1 + rng() % 12, &copies);
      if (r.num_cached < 0) continue;
      ASSERT_TRUE(copies.empty());
      ASSERT_EQ(r.num_cached % kBs, 0);
      ASSERT_LT(r.num_cached, static_cast<int64_t>(t.size()));
      if (r.num_cached > 0) {
        ASSERT_GE(r.restore_snapshot, 0);
        ASSERT_EQ(saved.at(r.restore_snapshot),
                  std::vector<int32_t>(t.begin(), t.begin() + r.num_cached));
        ++restores;
        hits += r.num_cached;
      } else {
        ASSERT_EQ(r.restore_snapshot, -1);
      }
      const int32_t snap = bm.reserve_snapshot(id, r.num_cached + r.num_new);
      if (rng() % 8 == 0) {  // the step failed
        bm.end_step();
        bm.free(id);
        continue;
      }
      const int64_t end = r.num_cached + r.num_new;
      if (snap >= 0) saved[snap].assign(t.begin(), t.begin() + end);
      bm.commit(id, t, end);
      bm.end_step();
      live[id] = {t, end};
    } else if (kind < 8 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      Live& l = it->second;
      const auto n = static_cast<int64_t>(l.tokens.size());
      if (l.done == n) {  // decode: one more token
        l.tokens.push_back(static_cast<int32_t>(rng() % 3));
        if (!bm.append(it->first, l.done, 1, &copies)) continue;
        bm.commit(it->first, l.tokens, ++l.done);
        bm.end_step();
        continue;
      }
      const int64_t m = bm.snapshot_chunk(l.done, std::min<int64_t>(1 + rng() % 12, n - l.done), n);
      if (!bm.append(it->first, l.done, m, &copies)) continue;
      const int32_t snap = bm.reserve_snapshot(it->first, l.done + m);
      if (snap >= 0) saved[snap].assign(l.tokens.begin(), l.tokens.begin() + l.done + m);
      bm.commit(it->first, l.tokens, l.done + m);
      bm.end_step();
      l.done += m;
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      bm.free(it->first);
      live.erase(it);
    }
    bm.check_consistency();
  }
  for (const auto& [id, l] : live) bm.free(id);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_state_slots(), 4);
  EXPECT_EQ(bm.num_free_snapshots() + bm.stats().snapshots_held, 5);
  EXPECT_GT(restores, 50);
  EXPECT_EQ(bm.stats().snapshot_restores, restores);
  EXPECT_EQ(bm.stats().hits, hits);
}

}  // namespace
}  // namespace longctx
