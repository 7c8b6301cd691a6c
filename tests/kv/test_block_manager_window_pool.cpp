// BlockManager's window pool (KV offload of a model with sliding groups): the sliding groups'
// ids come from a second pool after the main one, each pool with its own free list and LRU, so
// one running out refuses a sequence while the other has room, a sliding group's prefix hit
// and copy-on-write stay in its pool, and a random run ends with both pools free.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "kv/block_manager.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

constexpr KvGroupAlloc kFull{KvGroupKind::kFull, 0};
constexpr KvGroupAlloc kSliding{KvGroupKind::kSlidingWindow, 8};

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(BlockManagerWindowPool, SlidingGroupsTakeWindowIds) {
  BlockManager bm(10, 4, true, {kFull, kSliding}, 0, 0, /*num_window_blocks=*/6);
  EXPECT_EQ(bm.num_blocks(), 16);
  EXPECT_EQ(bm.pool_blocks(BlockPool::kMain), 10);
  EXPECT_EQ(bm.pool_blocks(BlockPool::kWindow), 6);
  EXPECT_EQ(bm.pool_of(0), BlockPool::kMain);
  EXPECT_EQ(bm.pool_of(1), BlockPool::kWindow);
  std::vector<KVBlockCopy> copies;
  const auto prompt = iota_tokens(16);
  auto r = bm.start(1, prompt, 100, &copies);
  ASSERT_EQ(r.num_new, 16);
  for (int32_t b : bm.table(1, 0)) EXPECT_LT(b, 10);
  for (int32_t b : bm.table(1, 1)) EXPECT_GE(b, 10);
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kMain), 6);
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kWindow), 2);
  bm.commit(1, prompt, 16);
  bm.check_consistency();
  // The window pool cannot give a second 16-token prompt its 4 blocks (2 free, none cached
  // idle), though the main pool could: refused, nothing changes.
  EXPECT_EQ(bm.start(2, iota_tokens(16, 100), 100, &copies).num_cached, -1);
  EXPECT_FALSE(bm.holds(2));
  // The same prompt hits in both pools: tokens 8..15 hit the window (queries from 15 see keys
  // > 7), the last block is copied on write, in its own pool.
  r = bm.start(3, prompt, 100, &copies);
  ASSERT_EQ(r.num_cached, 15);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_LT(copies[0].src, 10);
  EXPECT_LT(copies[0].dst, 10);
  EXPECT_GE(copies[1].src, 10);
  EXPECT_GE(copies[1].dst, 10);
  bm.end_step();
  bm.check_consistency();
  // Decoding drops window blocks back into the window pool only.
  const int64_t main_free = bm.num_free_blocks(BlockPool::kMain);
  ASSERT_TRUE(bm.append(1, 16, 1, &copies));
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kMain), main_free - 1);
  bm.free(1);
  bm.free(3);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kMain), 10);
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kWindow), 6);
  // A sequence's most blocks, per pool: the full group every token, the window its window, the
  // step and a straddled block.
  EXPECT_EQ(bm.max_blocks_held(64, 4), 16);
  EXPECT_EQ(bm.max_blocks_held(64, 4, BlockPool::kWindow), 4);
}

TEST(BlockManagerWindowPool, RandomRunEndsWithBothPoolsFree) {
  std::mt19937 rng(4);
  BlockManager bm(40, 4, true, {kFull, kSliding, kSliding}, 0, 0, 30);
  std::vector<KVBlockCopy> copies;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(iota_tokens(5 + rng() % 30, (i % 3) * 1000));
  std::vector<int64_t> done(prompts.size(), -1);
  for (int round = 0; round < 400; ++round) {
    const size_t s = rng() % prompts.size();
    const auto& p = prompts[s];
    if (done[s] < 0) {
      const auto r = bm.start(s, p, 1 + rng() % 8, &copies);
      if (r.num_cached >= 0) done[s] = r.num_cached + r.num_new;
    } else if (done[s] < static_cast<int64_t>(p.size())) {
      const int64_t n = std::min<int64_t>(1 + rng() % 8, p.size() - done[s]);
      if (bm.append(s, done[s], n, &copies)) done[s] += n;
    } else {
      bm.free(s);
      done[s] = -1;
    }
    if (done[s] > 0) bm.commit(s, p, done[s]);
    bm.end_step();
    copies.clear();
    bm.check_consistency();
    for (int64_t g = 0; g < 3 && done[s] > 0; ++g)
      for (int32_t b : bm.table(s, g))
        if (b != kNoBlock) EXPECT_EQ(b >= 40, g > 0);
  }
  for (size_t s = 0; s < prompts.size(); ++s) bm.free(s);
  bm.check_consistency();
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kMain), 40);
  EXPECT_EQ(bm.num_free_blocks(BlockPool::kWindow), 30);
}

}  // namespace
}  // namespace longctx
