// The prefill plan's work list, and the work split of the Hopper prefill's persistent CTAs
// (kernels/cuda/prefill_sm90.cu): host side.
//
// The kernel's units of work are (row tile, kv head) pairs of the plan's heaviest-first list, in
// the order of prefill_unit(), and unit u visits `tiles[u]` key tiles of 128. By default each of P
// persistent CTAs takes whole units in a snake order. When that leaves SMs idle (a last round of
// units that does not fill the GPU: a 2K chunk over 30K keys is 512 units of equal length on 132
// SMs, 3.88 rounds; or a few long units: 128 query rows over 1M keys is 8 units), stream-K cuts the
// units' concatenated key tiles into P nearly equal ranges instead, one per CTA, optionally after
// dp_rounds whole rounds of the snake (the hybrid of the Stream-K paper: most CTAs keep whole units
// that start at key tile 0 together and share K/V through L2, and only the last round's units are
// cut). A unit cut by a range boundary becomes pieces, each written as a partial state (fp32 o
// normalized by its own sum, and its lse) into a slot, and a merge kernel combines the pieces of
// each cut unit afterwards.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/host_device.h"
#include "longctx/kernels/kernel_tuning.h"  // PrefillSplitMode

namespace longctx::kernels {

// One work item of the prefill plan (PrefillPlan in kernels/cuda/prefill.h): packed rows
// [tile * tile_rows, (tile + 1) * tile_rows) of request b (row r = token r / group, q head
// r % group of the kv group), which see keys [0, end) at most.
struct PrefillWorkItem {
  int32_t b = 0, tile = 0;
  int64_t end = 0;
};

// The plan's work list: every row tile of every request (q_len * group packed rows), heaviest
// first by key tiles of cost_keys over [0, end), ties in request then tile order. Causal: a row
// of token t sees keys [0, kv_len - q_len + t + 1), clamped to [0, kv_len]. Host inputs:
// qo_indptr [batch + 1], kv_len [batch]. Throws Error(kInvalidArgument) on a negative length,
// Error(kUnsupported) on a kv_len above max_kv.
std::vector<PrefillWorkItem> prefill_work_items(const int32_t* qo_indptr, const int32_t* kv_len,
                                                int batch, int group, int tile_rows, bool causal,
                                                int cost_keys, int64_t max_kv);

// Unit u of the Hopper kernel: its work item and kv head. The units come in blocks of unit_heads
// kv heads (a divisor of num_kv_heads): block u / (num_items * unit_heads) covers heads
// [block * unit_heads, (block + 1) * unit_heads), its items in list order, their heads inner.
// unit_heads = num_kv_heads puts every head of an item side by side; fewer heads per block mean
// the CTAs in flight read the K/V of fewer heads, a working set L2 may hold at long contexts.
struct PrefillUnit {
  int32_t item, kv_head;
};
LONGCTX_HD inline PrefillUnit prefill_unit(int u, int num_items, int unit_heads) {
  const int per_block = num_items * unit_heads;
  const int block = u / per_block, r = u - block * per_block;
  return {r / unit_heads, block * unit_heads + r % unit_heads};
}

// The units of the Hopper kernel over `items` in prefill_unit()'s order: the key tiles of `keys`
// each visits, the split's input. Throws Error(kInvalidArgument) unless unit_heads divides
// num_kv_heads.
std::vector<int32_t> prefill_unit_tiles(const std::vector<PrefillWorkItem>& items, int num_kv_heads,
                                        int keys, int unit_heads);

// One CTA's range: units [unit_begin, unit_end) whole except that the first starts at key tile
// tile_begin and, when tile_end > 0, unit unit_end is processed too, up to key tile tile_end
// (exclusive). A piece that is not its whole unit writes partial slot slot_first (the CTA's first
// unit) or slot_last (its last unit); -1 where that unit is whole.
struct PrefillCtaRange {
  int32_t unit_begin = 0, tile_begin = 0, unit_end = 0, tile_end = 0;
  int32_t slot_first = -1, slot_last = -1;
};
inline constexpr int kPrefillCtaRangeInts = 6;

// The pieces of one cut unit: partial slots [slot_begin, slot_begin + count).
struct PrefillMergeGroup {
  int32_t unit = 0, slot_begin = 0, count = 0;
};
inline constexpr int kPrefillMergeGroupInts = 3;

struct PrefillSplit {
  // Units [0, dp_rounds * P) are whole, in the snake order (CTA x's unit of round k as in
  // prefill_snake_makespan), before each CTA's range; the ranges cover the units after them.
  int32_t dp_rounds = 0;
  std::vector<PrefillCtaRange> ctas;  // [P] (empty: keep whole units)
  std::vector<PrefillMergeGroup> merges;
  int32_t num_slots = 0;
  // Modelled busiest CTA, in key tiles plus unit_overhead per unit or piece (a range's times
  // range_cost): whole units in the snake order, and the split (the choice compares them).
  double whole_makespan = 0, split_makespan = 0;
};

// How many partial slots a split over num_ctas CTAs may use: each range boundary cuts at most
// one unit into two, so pieces <= 2 (P - 1).
inline int64_t prefill_split_max_slots(int num_ctas) { return 2 * int64_t(num_ctas); }

// The split of `tiles` (key tiles of each unit, in the list's order) over num_ctas persistent
// CTAs. unit_overhead: what starting a unit or piece costs, in key tiles (Q load, pipeline fill,
// epilogue). range_cost: what a key tile of a range costs against one of a whole unit in the
// snake (> 1: ranges start at different key tiles, so CTAs that read the same K/V no longer do
// it together). Of three candidates (stream-K over every unit; after every whole round; after
// every whole round but the last) the one with the least modelled makespan is taken. kAuto splits
// only when that drops the makespan by more than min_gain (a fraction); kAlways whenever a split
// exists (tests); kNever never. Units with 0 tiles are never cut. Pieces shorter than unit_overhead
// are avoided by snapping the cut to the unit's end.
PrefillSplit plan_prefill_split(const std::vector<int32_t>& tiles, int num_ctas,
                                int unit_overhead = 2, double min_gain = 0.1,
                                PrefillSplitMode mode = PrefillSplitMode::kAuto,
                                double range_cost = 1.0);

// Busiest CTA of whole units in the kernel's snake order: CTA x takes, in round k, unit
// k * P + x (k even) or k * P + P - 1 - x (k odd).
double prefill_snake_makespan(const std::vector<int32_t>& tiles, int num_ctas, int unit_overhead);

// The plan's cost model of the Hopper kernel's schedule.
struct PrefillScheduleModel {
  int num_ctas = 0;       // persistent CTAs (the SMs)
  int unit_overhead = 0;  // key tiles (plan_prefill_split)
  int64_t l2_bytes = 0;   // the device's L2
  // plan_prefill_split's threshold and range cost with every kv head of a row tile side by side,
  // and with one kv head per block of units (a range's neighbours read the same head's K/V).
  double min_gain = 0, range_cost = 1;
  double one_head_min_gain = 0, one_head_range_cost = 1;
};

// The Hopper kernel's model, its numbers measured on the H200 (prefill_schedule.cpp says how),
// for num_ctas persistent CTAs and l2_bytes of L2.
PrefillScheduleModel hopper_prefill_schedule_model(int num_ctas, int64_t l2_bytes);

// A schedule: the unit order (kv heads per block, prefill_unit) and the split over it.
struct PrefillSchedule {
  int unit_heads = 0;
  PrefillSplit split;
};

// The schedule of `items` (key tiles of `keys`) over num_kv_heads heads whose K and V take
// kv_bytes. Where they take at most 1.5 times the L2, or the heads side by side take stream-K over
// every unit (a few long units), the heads stay side by side with that split. Otherwise one head
// per block of units, so the CTAs in flight share one head's K/V through L2, where the model then
// cuts the last rounds after whole ones, or keeps whole units and the snake balances them within
// 1 % of the heads side by side; else the heads side by side. forced_unit_heads > 0 takes that
// order (a divisor of num_kv_heads) and its split (measurement). H200 (docs/benchmarks.md):
// causal 32K keys at head_dim 128 (128 MB of K/V) whole units 1-2 % faster one head at a time
// (L2 hits 97 % against 72 %); a 2K chunk over 30K keys (120 MB) cut after three whole rounds
// 2.5 % faster than whole units one head at a time, where heads side by side it ran 4 % slower;
// causal 8K keys (32 MB) one head at a time balanced worse in the snake (11 % slower as split);
// head_dim 64 over 32K keys (64 MB) 1.5 % slower; stream-K over the 64 units of 256 queries over
// 256K keys 17 % slower.
PrefillSchedule plan_prefill_schedule(const std::vector<PrefillWorkItem>& items, int num_kv_heads,
                                      int keys, int64_t kv_bytes, const PrefillScheduleModel& model,
                                      PrefillSplitMode mode, int forced_unit_heads = 0);

// The tuning's host-side choices of the paged prefill (kernels/cuda/prefill.cu, prefill_sm90.cu),
// here so that the CPU tests pin the defaults.
//
// Rows per work item: 192 where the Hopper kernel runs head_dim 64 (three consumer warpgroups;
// PrefillTuning::head_dim64_rows 128 keeps 128), else 128.
int prefill_tile_rows(int head_dim, bool sm90_path, const PrefillTuning& tuning);
// K/V stages of the Hopper kernel's lean tiling for a call, 0 for the full one: block-sparse calls
// need the full tiling's bitmaps; kAuto takes 3 stages at head_dim 128 under cp.async (no TMA),
// else 2 (measurements: prefill_sm90.cu's lean_stages). Head_dim 256 takes 2 whatever `lean` asks
// (a third stage of 64 keys passes sm_90's 227 KB of shared memory).
int prefill_lean_stages(bool block_mask, int head_dim, bool tma, PrefillLean lean);
// Keys per K/V tile of the Hopper kernel, the unit of its plan's split (plan_prefill_schedule's
// `keys`): 128, or 64 at head_dim 256 (its O accumulator leaves registers for 64-key scores only,
// Sm90Tiling in prefill_sm90.cu).
constexpr int prefill_sm90_tile_keys(int head_dim) { return head_dim == 256 ? 64 : 128; }

}  // namespace longctx::kernels
