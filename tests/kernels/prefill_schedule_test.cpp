// The stream-K split of the Hopper prefill's units (kernels/prefill_schedule.h): every key tile
// of every unit is covered exactly once by the whole rounds and the CTAs' ranges, decoded the way
// the kernel decodes them; cut units have consecutive slots that the merge groups name; pieces are
// never shorter than the overhead; and the automatic choice splits the shapes that leave many SMs
// idle (a few long units) and keeps whole units where the snake order is even or nearly so.
#include "kernels/prefill_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::kernels {
namespace {

struct Piece {
  int32_t unit, kb, ke, slot;
};

// The kernel's reading of one CTA's range (prefill_sm90.cu, split mode).
std::vector<Piece> pieces_of(const PrefillCtaRange& r, const std::vector<int32_t>& tiles) {
  std::vector<Piece> out;
  const int32_t count = r.unit_end - r.unit_begin + (r.tile_end > 0 ? 1 : 0);
  for (int32_t k = 0; k < count; ++k) {
    const int32_t u = r.unit_begin + k;
    const int32_t kb = k == 0 ? r.tile_begin : 0;
    const int32_t ke = u == r.unit_end ? r.tile_end : tiles[u];
    const bool partial = kb > 0 || ke < tiles[u];
    out.push_back({u, kb, ke, partial ? (k == 0 ? r.slot_first : r.slot_last) : -1});
  }
  return out;
}

// Checks the split's invariants; returns the number of pieces (cut units' parts).
int check_split(const PrefillSplit& s, const std::vector<int32_t>& tiles, int num_ctas,
                int overhead) {
  EXPECT_EQ(int(s.ctas.size()), num_ctas);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> cover(tiles.size());
  std::map<int32_t, std::vector<int32_t>> slots_of_unit;
  int pieces = 0;
  // The whole rounds before the ranges, in the snake order.
  EXPECT_GE(s.dp_rounds, 0);
  EXPECT_LE(int64_t(s.dp_rounds) * num_ctas, int64_t(tiles.size()));
  for (int32_t k = 0; k < s.dp_rounds; ++k)
    for (int x = 0; x < num_ctas; ++x) {
      const int32_t u = k * num_ctas + ((k & 1) ? num_ctas - 1 - x : x);
      cover[u].push_back({0, tiles[u]});
    }
  for (const PrefillCtaRange& r : s.ctas) {
    for (const Piece& p : pieces_of(r, tiles)) {
      EXPECT_GE(p.unit, 0);
      EXPECT_LT(p.unit, int32_t(tiles.size()));
      // A unit with no key tile is still visited once (its rows get o = 0, lse = -inf).
      if (tiles[p.unit] > 0) EXPECT_LT(p.kb, p.ke) << "empty piece of unit " << p.unit;
      cover[p.unit].push_back({p.kb, p.ke});
      if (p.slot >= 0) {
        ++pieces;
        EXPECT_GE(p.ke - p.kb, overhead) << "a piece shorter than the overhead";
        EXPECT_LT(p.slot, s.num_slots);
        slots_of_unit[p.unit].push_back(p.slot);
      }
    }
  }
  for (size_t u = 0; u < tiles.size(); ++u) {
    auto& c = cover[u];
    std::sort(c.begin(), c.end());
    if (tiles[u] == 0) {
      EXPECT_TRUE(c.size() == 1 && c[0] == std::make_pair(0, 0)) << "unit " << u;
      continue;
    }
    if (c.empty()) {
      ADD_FAILURE() << "unit " << u << " never visited";
      continue;
    }
    EXPECT_EQ(c.front().first, 0);
    EXPECT_EQ(c.back().second, tiles[u]);
    for (size_t i = 1; i < c.size(); ++i)
      EXPECT_EQ(c[i].first, c[i - 1].second) << "unit " << u << " gap or overlap";
  }
  EXPECT_EQ(pieces, s.num_slots);
  EXPECT_LE(s.num_slots, prefill_split_max_slots(num_ctas));
  // Merge groups: one per cut unit, its slots consecutive and exactly the unit's pieces.
  EXPECT_EQ(s.merges.size(), slots_of_unit.size());
  for (const PrefillMergeGroup& g : s.merges) {
    auto it = slots_of_unit.find(g.unit);
    if (it == slots_of_unit.end()) {
      ADD_FAILURE() << "merge group of uncut unit " << g.unit;
      continue;
    }
    std::vector<int32_t> sl = it->second;
    std::sort(sl.begin(), sl.end());
    EXPECT_GE(g.count, 2);
    if (int(sl.size()) != g.count) {
      ADD_FAILURE() << "unit " << g.unit << ": " << sl.size() << " pieces, group of " << g.count;
      continue;
    }
    for (int i = 0; i < g.count; ++i) EXPECT_EQ(sl[i], g.slot_begin + i);
  }
  return pieces;
}

TEST(PrefillSchedule, SnakeMakespanFollowsTheKernelsOrder) {
  // 5 units on 2 CTAs: rounds (0 -> x0, 1 -> x1), (2 -> x1, 3 -> x0), (4 -> x0).
  const std::vector<int32_t> tiles = {10, 9, 8, 7, 6};
  // x0: 10 + 7 + 6 (+ 3 overheads of 1) = 26; x1: 9 + 8 (+ 2) = 19.
  EXPECT_DOUBLE_EQ(prefill_snake_makespan(tiles, 2, 1), 26.0);
  EXPECT_DOUBLE_EQ(prefill_snake_makespan(tiles, 1, 0), 40.0);
}

TEST(PrefillSchedule, ChunkOverHistoryGainsTooLittleToSplit) {
  // The bench's chunk: 2048 queries x 4 (GQA) = 64 row tiles x 8 kv heads, 240 key tiles each:
  // 3.88 rounds, 3 % of the SMs' time idle, under the default 10 % (the H200 measured the split
  // 4 % slower there: it desynchronizes the CTAs sharing K/V through L2).
  const std::vector<int32_t> tiles(512, 240);
  EXPECT_TRUE(plan_prefill_split(tiles, 132, 2).ctas.empty());
  // What the model sees with a 1 % threshold: the split's makespan 3 % under the snake's.
  const PrefillSplit s = plan_prefill_split(tiles, 132, 2, 0.01);
  ASSERT_FALSE(s.ctas.empty());
  EXPECT_DOUBLE_EQ(s.whole_makespan, 4 * 242.0);
  EXPECT_LT(s.split_makespan, 0.975 * s.whole_makespan);
  EXPECT_GT(check_split(s, tiles, 132, 2), 0);
}

TEST(PrefillSchedule, ChunkOverHistoryCutsOnlyTheLastRound) {
  // The same chunk when ranges cost 8 % more than whole units (prefill.cu's model): stream-K
  // over all 512 units would be slower than the snake; three whole rounds and the last round's
  // 116 units cut over the 132 CTAs model ~1 % faster, under a 2 % threshold (the H200 measured
  // them 4 % slower).
  const std::vector<int32_t> tiles(512, 240);
  EXPECT_TRUE(plan_prefill_split(tiles, 132, 2, 0.02, PrefillSplitMode::kAuto, 1.08).ctas.empty());
  const PrefillSplit s = plan_prefill_split(tiles, 132, 2, 0.02, PrefillSplitMode::kAlways, 1.08);
  ASSERT_FALSE(s.ctas.empty());
  EXPECT_EQ(s.dp_rounds, 3);
  EXPECT_LT(s.split_makespan, s.whole_makespan);
  EXPECT_GT(s.split_makespan, 0.98 * s.whole_makespan);
  for (const PrefillCtaRange& r : s.ctas)
    if (r.unit_end > r.unit_begin || r.tile_end > 0) EXPECT_GE(r.unit_begin, 3 * 132);
  EXPECT_GT(check_split(s, tiles, 132, 2), 0);
}

TEST(PrefillSchedule, ShortLastRoundIsCutAfterTheWholeOne) {
  // 160 equal units on 132 CTAs (e.g. a 640-token chunk, GQA 4, 8 kv heads): the snake takes 2
  // rounds for 1.21 rounds of work. One whole round, then the 28 remaining units cut over every
  // CTA, beats both the snake and stream-K over all 160 units.
  const std::vector<int32_t> tiles(160, 240);
  const PrefillSplit s = plan_prefill_split(tiles, 132, 2, 0.02, PrefillSplitMode::kAuto, 1.08);
  ASSERT_FALSE(s.ctas.empty());
  EXPECT_EQ(s.dp_rounds, 1);
  EXPECT_DOUBLE_EQ(s.whole_makespan, 2 * 242.0);
  EXPECT_LT(s.split_makespan, 0.65 * s.whole_makespan);
  // Stream-K over everything: 160 x 242 / 132 tiles of ranges, at 1.08 each.
  EXPECT_LT(s.split_makespan, 1.08 * 160 * 242.0 / 132);
  check_split(s, tiles, 132, 2);
  EXPECT_EQ(s.merges.size(), 28u);
}

TEST(PrefillSchedule, FewLongUnitsSpreadOverEverySm) {
  // 128 query rows over 1M keys: 8 units of 8192 tiles on 132 SMs.
  const std::vector<int32_t> tiles(8, 8192);
  const PrefillSplit s = plan_prefill_split(tiles, 132, 2);
  ASSERT_FALSE(s.ctas.empty());
  EXPECT_LT(s.split_makespan, 8 * 8194.0 / 132 + 8);
  check_split(s, tiles, 132, 2);
  // Each unit spans ~16.5 CTAs: one merge group per unit.
  EXPECT_EQ(s.merges.size(), 8u);
}

TEST(PrefillSchedule, EvenCausalSnakeKeepsWholeUnits) {
  // Causal 32K, heaviest first: row tile t of 256 sees t + 1 key tiles, x 8 kv heads.
  std::vector<int32_t> tiles;
  for (int t = 255; t >= 0; --t)
    for (int h = 0; h < 8; ++h) tiles.push_back(t + 1);
  const PrefillSplit s = plan_prefill_split(tiles, 132, 2);
  EXPECT_TRUE(s.ctas.empty()) << "whole " << s.whole_makespan << " split " << s.split_makespan;
  EXPECT_EQ(s.num_slots, 0);
}

TEST(PrefillSchedule, ModesNeverAndAlways) {
  const std::vector<int32_t> tiles(512, 240);
  EXPECT_TRUE(plan_prefill_split(tiles, 132, 2, 0.01, PrefillSplitMode::kNever).ctas.empty());
  // Always: ranges even where nothing is cut (16 units, 16 CTAs: one whole unit each).
  const std::vector<int32_t> even(16, 50);
  const PrefillSplit s = plan_prefill_split(even, 16, 2, 0.01, PrefillSplitMode::kAlways);
  ASSERT_EQ(s.ctas.size(), 16u);
  EXPECT_EQ(check_split(s, even, 16, 2), 0);
  EXPECT_TRUE(s.merges.empty());
}

TEST(PrefillSchedule, EdgeShapes) {
  // More CTAs than units, empty units, one CTA, units shorter than the overhead.
  const std::vector<std::vector<int32_t>> cases = {{5},           {0, 0, 3},          {1, 1, 1, 1},
                                                   {100, 0, 100}, {3, 200, 1, 0, 57}, {}};
  for (const auto& tiles : cases)
    for (int p : {1, 2, 3, 7, 132}) {
      SCOPED_TRACE(::testing::Message() << tiles.size() << " units on " << p << " CTAs");
      const PrefillSplit s = plan_prefill_split(tiles, p, 2, 0.0, PrefillSplitMode::kAlways);
      if (tiles.empty()) {
        EXPECT_TRUE(s.ctas.empty());
        continue;
      }
      check_split(s, tiles, p, 2);
    }
}

TEST(PrefillSchedule, RandomInstancesCoverEveryTileOnce) {
  std::mt19937 rng(5);
  int hybrids = 0;  // splits with whole rounds before the ranges
  for (int trial = 0; trial < 300; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 400)(rng);
    const int p = std::uniform_int_distribution<int>(1, 140)(rng);
    const int overhead = std::uniform_int_distribution<int>(0, 4)(rng);
    const int max_len = std::uniform_int_distribution<int>(1, 3000)(rng);
    std::vector<int32_t> tiles(n);
    for (auto& t : tiles) t = std::uniform_int_distribution<int>(0, max_len)(rng);
    std::sort(tiles.rbegin(), tiles.rend());
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << n << " units, " << p
                                      << " CTAs, overhead " << overhead);
    const PrefillSplit s = plan_prefill_split(tiles, p, overhead, 0.0, PrefillSplitMode::kAlways);
    check_split(s, tiles, p, overhead);
    const PrefillSplit h =
        plan_prefill_split(tiles, p, overhead, 0.0, PrefillSplitMode::kAlways, 1.08);
    check_split(h, tiles, p, overhead);
    hybrids += h.dp_rounds > 0;
    // The line's cuts put no CTA far above the mean: at most one unit's overhead and a piece
    // rounding over total / P.
    double total = 0;
    for (int32_t t : tiles) total += t + overhead;
    EXPECT_LE(s.split_makespan, total / p + 3 * overhead + 2 + 1e-9);
  }
  EXPECT_GT(hybrids, 10);
}

// The visible keys of packed row r of a request (token r / group), as the kernels mask them.
int64_t row_keys(int64_t r, int group, int64_t q_len, int64_t kv_len, bool causal) {
  if (!causal) return kv_len;
  return std::clamp<int64_t>(kv_len - q_len + r / group + 1, 0, kv_len);
}

TEST(PrefillSchedule, WorkItemsTileEveryRequestHeaviestFirst) {
  // A token, a GQA group's worth, several tiles, an empty request, a short chunk over history.
  const std::vector<int32_t> q_lens = {1, 37, 200, 0, 5, 960};
  const std::vector<int32_t> kv_lens = {300, 37, 700, 50, 90, 2000};
  std::vector<int32_t> qo_indptr = {0};
  for (int32_t q : q_lens) qo_indptr.push_back(qo_indptr.back() + q);
  const int group = 4;
  for (int rows : {128, 192})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << "-row tiles, causal " << causal);
      const std::vector<PrefillWorkItem> items = prefill_work_items(
          qo_indptr.data(), kv_lens.data(), int(q_lens.size()), group, rows, causal, 64, 1 << 22);
      std::map<std::pair<int32_t, int32_t>, int> seen;
      for (const PrefillWorkItem& it : items) {
        ASSERT_GE(it.b, 0);
        ASSERT_LT(it.b, int32_t(q_lens.size()));
        ++seen[{it.b, it.tile}];
        // end: the most keys any row of the tile sees.
        const int64_t n_rows = int64_t(q_lens[it.b]) * group;
        int64_t end = 0;
        for (int64_t r = int64_t(it.tile) * rows; r < std::min(n_rows, int64_t(it.tile + 1) * rows);
             ++r)
          end = std::max(end, row_keys(r, group, q_lens[it.b], kv_lens[it.b], causal));
        EXPECT_EQ(it.end, end) << "request " << it.b << " tile " << it.tile;
      }
      for (size_t b = 0; b < q_lens.size(); ++b) {
        const int tiles = (q_lens[b] * group + rows - 1) / rows;
        for (int t = 0; t < tiles; ++t)
          EXPECT_EQ((seen[{int32_t(b), t}]), 1) << "request " << b << " tile " << t;
      }
      size_t expected = 0;
      for (int32_t q : q_lens) expected += (q * group + rows - 1) / rows;
      EXPECT_EQ(items.size(), expected);
      // Heaviest first by 64-key tiles; equal costs keep request, then tile order.
      for (size_t i = 1; i < items.size(); ++i) {
        const int64_t a = (items[i - 1].end + 63) / 64, c = (items[i].end + 63) / 64;
        EXPECT_GE(a, c);
        if (a == c)
          EXPECT_LT(std::make_pair(items[i - 1].b, items[i - 1].tile),
                    std::make_pair(items[i].b, items[i].tile));
      }
      // The Hopper kernel's units: kv heads inner, key tiles of 128.
      const std::vector<int32_t> units = prefill_unit_tiles(items, 8, 128, 8);
      ASSERT_EQ(units.size(), 8 * items.size());
      for (size_t u = 0; u < units.size(); ++u) EXPECT_EQ(units[u], (items[u / 8].end + 127) / 128);
    }
}

TEST(PrefillSchedule, WorkItemsRejectBadLengths) {
  const int32_t decreasing[] = {0, 5, 3};
  const int32_t kv[] = {10, 10};
  try {
    prefill_work_items(decreasing, kv, 2, 1, 128, false, 64, 1 << 22);
    ADD_FAILURE() << "a negative q_len was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("request 1 has q_len -2"), std::string::npos) << e.what();
  }
  const int32_t qo[] = {0, 5};
  const int32_t long_kv[] = {(1 << 22) + 1};
  try {
    prefill_work_items(qo, long_kv, 1, 1, 128, true, 64, 1 << 22);
    ADD_FAILURE() << "a kv_len above the maximum was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
}

// The Hopper kernel's model on an H200: 132 CTAs, 60 MB of L2 (what the H200 reports).
PrefillScheduleModel h200_model() { return hopper_prefill_schedule_model(132, int64_t(60) << 20); }

TEST(PrefillSchedule, ChunkOfFiveTilesTakesAWholeRoundFirst) {
  // The GPU split test's shapes (tests/gpu_kernels/prefill_test.cpp): 5 row tiles of tokens x 4
  // heads over 2000 keys, 8 kv heads, 160 units on 132 CTAs, with the Hopper kernel's model
  // (overhead 2, range cost 1.08, 5 % threshold). Equal units take one whole round, then cut the
  // other 28; causal at 192-row tiles the model cuts every unit instead.
  for (int rows : {128, 192})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << "-row tiles, causal " << causal);
      const int32_t qo[] = {0, 5 * rows};
      const int32_t kv[] = {2000};
      const std::vector<int32_t> tiles = prefill_unit_tiles(
          prefill_work_items(qo, kv, 1, 4, rows, causal, 64, 1 << 22), 8, 128, 8);
      ASSERT_EQ(tiles.size(), 160u);
      const PrefillScheduleModel m = h200_model();
      const PrefillSplit s = plan_prefill_split(tiles, m.num_ctas, m.unit_overhead, m.min_gain,
                                                PrefillSplitMode::kAuto, m.range_cost);
      ASSERT_FALSE(s.ctas.empty());
      EXPECT_EQ(s.dp_rounds, causal && rows == 192 ? 0 : 1);
      check_split(s, tiles, 132, 2);
    }
}

TEST(PrefillSchedule, UnitOrderCoversEveryItemAndHeadOnce) {
  // 7 items over 8 kv heads in blocks of 1, 2, 4 and 8 heads: a bijection onto (item, head), the
  // heads of a block inner, the blocks in head order.
  const int n = 7, heads = 8;
  for (int block : {1, 2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << block << " heads per block");
    std::set<std::pair<int, int>> seen;
    for (int u = 0; u < n * heads; ++u) {
      const PrefillUnit unit = prefill_unit(u, n, block);
      ASSERT_TRUE(unit.item >= 0 && unit.item < n && unit.kv_head >= 0 && unit.kv_head < heads);
      EXPECT_TRUE(seen.insert({unit.item, unit.kv_head}).second) << "unit " << u;
      EXPECT_EQ(unit.kv_head / block, u / (n * block));
      EXPECT_EQ(unit.kv_head % block, u % block);
      EXPECT_EQ(unit.item, (u % (n * block)) / block);
    }
  }
  // Every head of an item side by side (block = heads), one head after another (block = 1).
  EXPECT_EQ(prefill_unit(9, n, heads).item, 1);
  EXPECT_EQ(prefill_unit(9, n, heads).kv_head, 1);
  EXPECT_EQ(prefill_unit(9, n, 1).item, 2);
  EXPECT_EQ(prefill_unit(9, n, 1).kv_head, 1);

  // The split's input follows the same order.
  std::vector<PrefillWorkItem> items;
  for (int i = 0; i < n; ++i) items.push_back({0, i, int64_t(1000 - 100 * i)});
  for (int block : {1, 2, 4, 8}) {
    const std::vector<int32_t> tiles = prefill_unit_tiles(items, heads, 128, block);
    ASSERT_EQ(tiles.size(), size_t(n * heads));
    for (int u = 0; u < n * heads; ++u)
      EXPECT_EQ(tiles[u], (items[prefill_unit(u, n, block).item].end + 127) / 128) << u;
  }
  try {
    prefill_unit_tiles(items, heads, 128, 3);
    ADD_FAILURE() << "3 heads per block over 8 heads was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

// One request of q tokens over kv keys, 32 q / 8 kv heads, bf16, at the Hopper kernel's tiles.
PrefillSchedule schedule_of(int32_t q, int32_t kv, int head_dim, bool causal,
                            PrefillSplitMode mode = PrefillSplitMode::kAuto) {
  const int32_t qo[] = {0, q};
  const int32_t kv_len[] = {kv};
  const std::vector<PrefillWorkItem> items =
      prefill_work_items(qo, kv_len, 1, 4, head_dim == 64 ? 192 : 128, causal, 128, 1 << 22);
  return plan_prefill_schedule(items, 8, 128, int64_t(kv) * 8 * head_dim * 4, h200_model(), mode);
}

TEST(PrefillSchedule, OneHeadPerBlockWhereTheKvOutgrowsL2) {
  // The measured shapes (docs/benchmarks.md).
  PrefillSchedule s = schedule_of(32768, 32768, 128, true);  // 128 MB of K/V: whole units
  EXPECT_EQ(s.unit_heads, 1);
  EXPECT_TRUE(s.split.ctas.empty());
  s = schedule_of(8192, 8192, 128, true);  // 32 MB
  EXPECT_EQ(s.unit_heads, 8);
  EXPECT_TRUE(s.split.ctas.empty());
  s = schedule_of(32768, 32768, 64, true);  // 64 MB
  EXPECT_EQ(s.unit_heads, 8);
  s = schedule_of(2048, 30720, 128, false);  // 120 MB, 3.88 rounds: the last ones cut
  EXPECT_EQ(s.unit_heads, 1);
  ASSERT_FALSE(s.split.ctas.empty());
  EXPECT_EQ(s.split.dp_rounds, 3);
  s = schedule_of(256, 262144, 128, false);  // 64 long units: stream-K, heads side by side
  EXPECT_EQ(s.unit_heads, 8);
  ASSERT_FALSE(s.split.ctas.empty());
  EXPECT_EQ(s.split.dp_rounds, 0);
  s = schedule_of(2048, 30720, 128, false, PrefillSplitMode::kNever);
  EXPECT_EQ(s.unit_heads, 1);
  EXPECT_TRUE(s.split.ctas.empty());

  // Over the L2 but badly balanced one head at a time: 3 items of 100, 1 and 1 key tiles per head
  // on 8 CTAs. Heads side by side, the 8 long units go one to each CTA (busiest 102 tiles); one
  // head per block, a CTA takes the long units of two heads.
  PrefillScheduleModel m = h200_model();
  m.num_ctas = 8;
  m.unit_overhead = 0;
  const std::vector<PrefillWorkItem> items = {{0, 0, 100 * 128}, {0, 1, 128}, {0, 2, 128}};
  s = plan_prefill_schedule(items, 8, 128, 3 * m.l2_bytes, m, PrefillSplitMode::kNever);
  EXPECT_EQ(s.unit_heads, 8);
  // Balanced units one head at a time: 8 CTAs, 8 items of 5 key tiles (one round per head).
  const std::vector<PrefillWorkItem> even(8, PrefillWorkItem{0, 0, 5 * 128});
  s = plan_prefill_schedule(even, 8, 128, m.l2_bytes * 3 / 2 + 1, m, PrefillSplitMode::kNever);
  EXPECT_EQ(s.unit_heads, 1);
  s = plan_prefill_schedule(even, 8, 128, m.l2_bytes * 3 / 2, m, PrefillSplitMode::kNever);
  EXPECT_EQ(s.unit_heads, 8);
  // A forced order is taken as it is.
  s = plan_prefill_schedule(items, 8, 128, m.l2_bytes, m, PrefillSplitMode::kNever, 2);
  EXPECT_EQ(s.unit_heads, 2);
}

// Head_dim 256 (Qwen3-Next-80B's gated attention: 16 q / 2 kv heads; Gemma 3 12B: 16 / 8): the
// Hopper kernel's 64-key tiles are the split's unit, so every unit counts twice the tiles of a
// 128-key plan (rounded up), and the splits of the shapes that leave SMs idle still cover every
// 64-key tile exactly once and merge each cut unit's pieces.
TEST(PrefillSchedule, HeadDim256CountsTilesOf64Keys) {
  const int keys = prefill_sm90_tile_keys(256);
  ASSERT_EQ(keys, 64);
  const int32_t qo[] = {0, 300, 332};
  const int32_t kv_len[] = {4133, 60001};
  for (bool causal : {false, true}) {
    // GQA 8: 300 tokens = 19 row tiles, 32 tokens = 2.
    const std::vector<PrefillWorkItem> items =
        prefill_work_items(qo, kv_len, 2, 8, 128, causal, 64, 1 << 22);
    ASSERT_EQ(items.size(), 21u);
    const std::vector<int32_t> t64 = prefill_unit_tiles(items, 2, keys, 2);
    const std::vector<int32_t> t128 = prefill_unit_tiles(items, 2, 128, 2);
    ASSERT_EQ(t64.size(), 42u);
    for (size_t u = 0; u < t64.size(); ++u) {
      EXPECT_EQ(t64[u], (items[u / 2].end + 63) / 64) << "unit " << u;
      EXPECT_TRUE(t64[u] == 2 * t128[u] || t64[u] == 2 * t128[u] - 1) << "unit " << u;
    }
    // 42 units on 132 SMs, two of them 938 tiles long: split over every CTA.
    const PrefillSchedule s = plan_prefill_schedule(items, 2, keys, int64_t(64133) * 2 * 256 * 4,
                                                    h200_model(), PrefillSplitMode::kAuto);
    ASSERT_FALSE(s.split.ctas.empty());
    EXPECT_GT(check_split(s.split, prefill_unit_tiles(items, 2, keys, s.unit_heads), 132,
                          h200_model().unit_overhead),
              0);
  }
}

}  // namespace
}  // namespace longctx::kernels
