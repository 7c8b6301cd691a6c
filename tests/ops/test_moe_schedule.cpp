// The tiling of the CUDA MoE kernels (ops/moe_schedule.h) checked on the CPU: the path choice
// (with the cuBLASLt threshold and refusals), the cuBLASLt path's per-expert row counts,
// the launch's tile bound against per-expert padding of many routings (tight where it can be),
// the tensor-core tile's weight rows (every gate row with its up row, each once over the grid),
// the warps' accumulator columns against the rows they were multiplied with, and the decode grid.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "ops/moe_schedule.h"

using namespace longctx::ops;

namespace {

TEST(MoeSchedule, PathChoice) {
  EXPECT_EQ(moe_path(1, 2048, 768, true, true), MoePath::kDecode);
  EXPECT_EQ(moe_path(kMoeDecodeMaxTokens, 2048, 768, false, false), MoePath::kDecode);
  EXPECT_EQ(moe_path(kMoeDecodeMaxTokens + 1, 2048, 768, true, true), MoePath::kTensorCore);
  EXPECT_EQ(moe_path(32768, 200, 136, true, true), MoePath::kTensorCore);
  EXPECT_EQ(moe_path(300, 2048, 768, false, true), MoePath::kSimt);  // f32 / mixed operands
  EXPECT_EQ(moe_path(300, 2048, 768, true, false), MoePath::kSimt);  // unaligned data
  EXPECT_EQ(moe_path(300, 130, 768, true, true), MoePath::kSimt);    // hidden % 8 != 0
  EXPECT_EQ(moe_path(300, 2048, 50, true, true), MoePath::kSimt);    // inter % 8 != 0
  EXPECT_EQ(moe_tile_rows(MoePath::kTensorCore), kMoeTcRows);
  EXPECT_EQ(moe_tile_rows(MoePath::kSimt), kMoeSimtRows);
}

// The automatic path takes cuBLASLt from kMoeLtMinRowsPerExpert rows per expert on average, only
// where its operands allow it and never under graph capture; decode stays on the GEMVs.
TEST(MoeSchedule, CublasLtChoice) {
  // Qwen3-30B-A3B: 128 experts, top-8; 1024 rows per expert from 16384 tokens
  const int64_t first = kMoeLtMinRowsPerExpert * 128 / 8;
  EXPECT_EQ(first, 16384);
  EXPECT_EQ(moe_auto_path(first, 8, 128, 2048, 768, true, true, false), MoePath::kCublasLt);
  EXPECT_EQ(moe_auto_path(32768, 8, 128, 2048, 768, true, true, false), MoePath::kCublasLt);
  EXPECT_EQ(moe_auto_path(first - 1, 8, 128, 2048, 768, true, true, false), MoePath::kTensorCore);
  EXPECT_EQ(moe_auto_path(4096, 8, 128, 2048, 768, true, true, false), MoePath::kTensorCore);
  EXPECT_EQ(moe_auto_path(32768, 8, 128, 2048, 768, true, true, true), MoePath::kTensorCore);
  EXPECT_EQ(moe_auto_path(32768, 8, 128, 2048, 768, false, true, false), MoePath::kSimt);
  EXPECT_EQ(moe_auto_path(32768, 8, 128, 2048, 768, true, false, false), MoePath::kSimt);
  EXPECT_EQ(moe_auto_path(32768, 8, 128, 130, 768, true, true, false), MoePath::kSimt);
  // decode stays on the GEMVs; few experts reach the threshold sooner
  EXPECT_EQ(moe_auto_path(kMoeDecodeMaxTokens, 8, 8, 64, 32, true, true, false), MoePath::kDecode);
  EXPECT_EQ(moe_auto_path(kMoeDecodeMaxTokens + 1, 1, 8, 64, 32, true, true, false),
            MoePath::kTensorCore);
  EXPECT_EQ(moe_auto_path(8192, 1, 8, 64, 32, true, true, false), MoePath::kCublasLt);
  // the refusals name their reason; none where the path can run
  EXPECT_STREQ(moe_lt_refusal(2048, 768, true, true, false), "");
  EXPECT_NE(std::string(moe_lt_refusal(2048, 768, false, true, false)).find("16-bit"),
            std::string::npos);
  EXPECT_NE(std::string(moe_lt_refusal(2048, 768, true, false, false)).find("16-byte"),
            std::string::npos);
  EXPECT_NE(std::string(moe_lt_refusal(2048, 50, true, true, false)).find("16-byte"),
            std::string::npos);
  EXPECT_NE(std::string(moe_lt_refusal(2048, 768, true, true, true)).find("capturing"),
            std::string::npos);
}

// An expert's cuBLASLt rows: at least its count, multiples of 16, at most 15 or count / 16 more,
// a fixed point, non-decreasing, and at most 16 distinct values per power of two (the bound on
// the GEMM shapes linear_cuda plans).
TEST(MoeSchedule, CublasLtRows) {
  EXPECT_EQ(moe_lt_rows(0), 0);
  EXPECT_EQ(moe_lt_rows(1), 16);
  EXPECT_EQ(moe_lt_rows(511), 512);
  EXPECT_EQ(moe_lt_rows(513), 544);    // step 32 from 512
  EXPECT_EQ(moe_lt_rows(2049), 2176);  // step 128 from 2048
  int64_t prev = 0;
  for (int64_t c = 1; c <= (int64_t(1) << 20); ++c) {
    const int64_t r = moe_lt_rows(c);
    ASSERT_GE(r, c);
    ASSERT_EQ(r % 16, 0) << c;
    ASSERT_TRUE(r - c < 16 || (r - c) * 16 < c) << c << " -> " << r;
    ASSERT_EQ(moe_lt_rows(r), r) << c;
    ASSERT_GE(r, prev) << c;
    prev = r;
  }
  for (int p = 0; p < 20; ++p) {
    std::set<int64_t> sizes;
    for (int64_t c = (int64_t(1) << p) + 1; c <= (int64_t(2) << p); ++c)
      sizes.insert(moe_lt_rows(c));
    EXPECT_LE(sizes.size(), 16u) << "counts (2^" << p << ", 2^" << p + 1 << "]";
  }
}

// Tiles the align step writes for these per-expert counts.
int64_t padded_tiles(const std::vector<int64_t>& counts, int rows) {
  int64_t tiles = 0;
  for (int64_t c : counts) tiles += (c + rows - 1) / rows;
  return tiles;
}

TEST(MoeSchedule, MaxTilesBoundsEveryRouting) {
  std::mt19937 rng(7);
  for (int rows : {kMoeTcRows, kMoeTcSmallRows, kMoeSimtRows}) {
    for (int64_t experts : {1, 8, 60, 128, 512}) {
      for (int64_t slots : {1, 5, 17, 127, 128, 129, 2400, 32768, 262144}) {
        // uniform, skewed (a few experts take most), and one expert per slot where possible
        std::vector<int64_t> uniform(experts), skewed(experts), spread(experts);
        std::uniform_int_distribution<int64_t> pick(0, experts - 1);
        for (int64_t s = 0; s < slots; ++s) {
          ++uniform[pick(rng)];
          ++skewed[pick(rng) % std::min<int64_t>(experts, 3)];
          ++spread[s % experts];
        }
        const int64_t bound = moe_max_tiles(slots, experts, rows);
        for (const auto* c : {&uniform, &skewed, &spread})
          EXPECT_LE(padded_tiles(*c, rows), bound)
              << "rows " << rows << " experts " << experts << " slots " << slots;
      }
    }
    // Tight: one expert takes q whole tiles plus one slot, every other expert one slot.
    for (int64_t experts : {8, 60, 127}) {
      const int64_t q = 5, slots = q * rows + experts;
      std::vector<int64_t> counts(experts, 1);
      counts[0] = q * rows + 1;
      if (experts < rows)
        EXPECT_EQ(padded_tiles(counts, rows), moe_max_tiles(slots, experts, rows));
    }
  }
  // 32K tokens x top-8 over 128 experts fit the launch's 65535 row tiles.
  EXPECT_LE(moe_max_tiles(32768 * 8, 128, kMoeTcRows), 65535);
}

// The tensor-core row tile: small where the routed experts average at most kMoeTcSmallRows / 2
// rows (batch decode, short chunks), large from there on, for good as the tokens grow; and
// wherever the small tile is chosen its launch fits the grid's 65535 row tiles (up to the align
// step's 8192 experts).
TEST(MoeSchedule, TcTileChoice) {
  // Qwen3-Next-80B-A3B at 32 tokens: ~240 routed experts of ~1.3 rows
  EXPECT_EQ(moe_tc_rows(32, 10, 512), kMoeTcSmallRows);
  // Qwen3-30B-A3B at 8 and 32 tokens (~1.2, ~2.3 rows), 240 (15 rows), 300 (18.75), 512, 32K
  EXPECT_EQ(moe_tc_rows(8, 8, 128), kMoeTcSmallRows);
  EXPECT_EQ(moe_tc_rows(32, 8, 128), kMoeTcSmallRows);
  EXPECT_EQ(moe_tc_rows(240, 8, 128), kMoeTcSmallRows);
  EXPECT_EQ(moe_tc_rows(300, 8, 128), kMoeTcRows);
  EXPECT_EQ(moe_tc_rows(512, 8, 128), kMoeTcRows);
  EXPECT_EQ(moe_tc_rows(32768, 8, 128), kMoeTcRows);
  // top-k = E: every expert takes every token
  EXPECT_EQ(moe_tc_rows(16, 8, 8), kMoeTcSmallRows);
  EXPECT_EQ(moe_tc_rows(17, 8, 8), kMoeTcRows);
  for (int64_t experts : {1, 8, 60, 128, 512, 8192})
    for (int64_t k : {1, 2, 8, 10}) {
      if (k > experts) continue;
      bool large = false;
      for (int64_t t = 1; t <= 70000; t += 1 + t / 64) {
        const int rows = moe_tc_rows(t, k, experts);
        ASSERT_TRUE(rows == kMoeTcRows || rows == kMoeTcSmallRows);
        if (large) ASSERT_EQ(rows, kMoeTcRows) << experts << " " << k << " " << t;
        large = rows == kMoeTcRows;
        // the routed experts average at most 16 rows: no more slots than 16 per expert
        if (rows == kMoeTcSmallRows) {
          ASSERT_LE(2 * t * k, kMoeTcSmallRows * experts) << experts << " " << k << " " << t;
          ASSERT_LE(moe_max_tiles(t * k, experts, kMoeTcSmallRows), 65535);
        }
      }
    }
}

// moe_route's logits per lane: the smallest power of two from 4 whose 32 lanes hold E experts,
// up to kMoeRouteSortMaxExperts; above, 0 (the per-pick kernel). 32 per lane is the CTA's sort
// size, so its shared keys hold the power of two >= E the sort runs over.
TEST(MoeSchedule, RouteSortPerLane) {
  EXPECT_EQ(moe_route_sort_per_lane(1), 4);
  EXPECT_EQ(moe_route_sort_per_lane(128), 4);
  EXPECT_EQ(moe_route_sort_per_lane(129), 8);
  EXPECT_EQ(moe_route_sort_per_lane(512), 16);  // Qwen3-Next-80B-A3B
  EXPECT_EQ(moe_route_sort_per_lane(kMoeRouteSortMaxExperts), 32);
  EXPECT_EQ(moe_route_sort_per_lane(kMoeRouteSortMaxExperts + 1), 0);
  for (int64_t e = 1; e <= kMoeRouteSortMaxExperts; ++e) {
    const int r = moe_route_sort_per_lane(e);
    ASSERT_TRUE(r == 4 || r == 8 || r == 16 || r == 32) << e;
    ASSERT_GE(32 * r, e);
    ASSERT_TRUE(r == 4 || 16 * r < e) << e;
  }
}

// gate/up: over the column tiles, each gate row and each up row is read once, at the same tile
// row modulo the half, and rows past inter are -1.
TEST(MoeSchedule, TensorCoreGateUpRows) {
  constexpr int kHalf = kMoeTcWRows / 2;
  for (int64_t inter : {8, 64, 136, 200, 768}) {
    std::vector<int> seen(2 * inter, 0);
    const int64_t tiles = moe_gate_up_col_tiles(MoePath::kTensorCore, inter);
    EXPECT_EQ(tiles, (inter + kHalf - 1) / kHalf);
    for (int64_t ct = 0; ct < tiles; ++ct)
      for (int r = 0; r < kMoeTcWRows; ++r) {
        const int64_t w = moe_tc_w_row(true, ct, r, inter);
        const int64_t col = ct * kHalf + r % kHalf;
        if (col >= inter) {
          EXPECT_EQ(w, -1);
          continue;
        }
        ASSERT_GE(w, 0);
        ASSERT_LT(w, 2 * inter);
        ++seen[w];
        EXPECT_EQ(w, r < kHalf ? col : inter + col);
      }
    for (int64_t i = 0; i < 2 * inter; ++i)
      EXPECT_EQ(seen[i], 1) << "inter " << inter << " row " << i;
  }
}

TEST(MoeSchedule, TensorCoreDownRows) {
  for (int64_t hidden : {8, 128, 200, 2048}) {
    std::vector<int> seen(hidden, 0);
    const int64_t tiles = moe_down_col_tiles(MoePath::kTensorCore, hidden);
    for (int64_t ct = 0; ct < tiles; ++ct)
      for (int r = 0; r < kMoeTcWRows; ++r) {
        const int64_t w = moe_tc_w_row(false, ct, r, hidden);
        if (ct * kMoeTcWRows + r >= hidden) {
          EXPECT_EQ(w, -1);
        } else {
          ASSERT_EQ(w, ct * kMoeTcWRows + r);
          ++seen[w];
        }
      }
    for (int64_t i = 0; i < hidden; ++i) EXPECT_EQ(seen[i], 1);
  }
}

// The warps' n-tiles cover the weight tile's rows once, and each accumulator column is written
// to the output column of the weight row it was multiplied with (gate/up: its gate row, and
// n-tile ni + 2 holds the matching up row).
TEST(MoeSchedule, TensorCoreAccumulatorColumns) {
  for (bool gate_up : {true, false}) {
    const int64_t n = 1000, ct = 2;  // a middle tile: no column is past n
    std::vector<int> rows_seen(kMoeTcWRows, 0);
    std::set<int64_t> cols;
    for (int wn = 0; wn < 4; ++wn)
      for (int ni = 0; ni < 4; ++ni) {
        const int base = moe_tc_warp_w_row(gate_up, wn, ni);
        ASSERT_EQ(base % 8, 0);
        for (int c = 0; c < 8; ++c) ++rows_seen[base + c];
        if (gate_up && ni >= 2) continue;  // the up accumulators: no column of their own
        for (int c2 = 0; c2 < 4; ++c2)
          for (int e = 0; e < 2; ++e) {
            const int64_t col = moe_tc_out_col(gate_up, ct, wn, ni, c2, e);
            EXPECT_TRUE(cols.insert(col).second) << "column " << col << " written twice";
            const int tile_row = base + c2 * 2 + e;
            EXPECT_EQ(moe_tc_w_row(gate_up, ct, tile_row, n), col);
            if (gate_up) {
              const int up_row = moe_tc_warp_w_row(true, wn, ni + 2) + c2 * 2 + e;
              EXPECT_EQ(moe_tc_w_row(true, ct, up_row, n), n + col);
            }
          }
      }
    for (int r = 0; r < kMoeTcWRows; ++r) EXPECT_EQ(rows_seen[r], 1) << "tile row " << r;
    const int64_t width = gate_up ? kMoeTcWRows / 2 : kMoeTcWRows;
    ASSERT_EQ(int64_t(cols.size()), width);
    EXPECT_EQ(*cols.begin(), ct * width);
    EXPECT_EQ(*cols.rbegin(), ct * width + width - 1);
  }
}

TEST(MoeSchedule, DecodeGridAndSharedMemory) {
  for (int64_t n : {1, 31, 32, 33, 768, 2048}) {
    const int64_t blocks = moe_decode_blocks(n);
    EXPECT_GE(blocks * kMoeDecodeRowsPerBlock, n);
    EXPECT_LT((blocks - 1) * kMoeDecodeRowsPerBlock, n);
  }
  // 30B-A3B at batch 1: 8 slots x 48 gate/up blocks, several per SM; down + combine: 512 blocks
  // of one token's 4 rows, a warp per slot.
  EXPECT_EQ(8 * moe_decode_blocks(768), 384);
  EXPECT_EQ(moe_combine_blocks(2048), 512);
  EXPECT_EQ(moe_combine_warps(8), 8);
  EXPECT_EQ(moe_combine_warps(10), 10);  // Qwen3-Next-80B-A3B: a warp per slot
  for (int64_t n : {1, 3, 4, 5, 2047}) {
    const int64_t blocks = moe_combine_blocks(n);
    EXPECT_GE(blocks * kMoeDecodeRowsPerWarp, n);
    EXPECT_LT((blocks - 1) * kMoeDecodeRowsPerWarp, n);
  }
  // Fewer slots than warps: one warp per slot; more: every slot taken by some warp.
  EXPECT_EQ(moe_combine_warps(1), 1);
  EXPECT_EQ(moe_combine_warps(kMoeDecodeMaxTopK), kMoeCombineWarps);
  // The down kernel's partial rows of the largest top-k fit the opt-in shared memory.
  EXPECT_LE(kMoeDecodeMaxTopK * kMoeDecodeRowsPerWarp * 4, 227 * 1024);
  // Two tensor-core CTAs per SM fit an H100/H200's 227 KB of shared memory (plus 1 KB static).
  EXPECT_LE(2 * (kMoeTcSmemBytes + kMoeTcRows * 8), 227 * 1024);
  EXPECT_EQ(moe_tc_smem_bytes(kMoeTcRows), kMoeTcSmemBytes);
  EXPECT_LT(moe_tc_smem_bytes(kMoeTcSmallRows), kMoeTcSmemBytes);
  EXPECT_EQ(kMoeTcK, 64);  // 8 chunks per row: the swizzle of mma_device.cuh
}

}  // namespace
