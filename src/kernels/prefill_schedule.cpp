#include "kernels/prefill_schedule.h"

#include <algorithm>
#include <cmath>

#include "longctx/core/error.h"

namespace longctx::kernels {

std::vector<PrefillWorkItem> prefill_work_items(const int32_t* qo_indptr, const int32_t* kv_len,
                                                int batch, int group, int tile_rows, bool causal,
                                                int cost_keys, int64_t max_kv) {
  std::vector<PrefillWorkItem> items;
  for (int b = 0; b < batch; ++b) {
    const int64_t q_len = qo_indptr[b + 1] - qo_indptr[b];
    const int64_t kv = kv_len[b];
    LONGCTX_CHECK(q_len >= 0 && kv >= 0, ErrorCode::kInvalidArgument,
                  "paged prefill plan: request {} has q_len {} kv_len {}", b, q_len, kv);
    LONGCTX_CHECK(kv <= max_kv, ErrorCode::kUnsupported,
                  "paged prefill plan: request {} kv_len {} above {}", b, kv, max_kv);
    const int64_t rows = q_len * group;
    for (int64_t tile = 0; tile * tile_rows < rows; ++tile) {
      int64_t end = kv;
      if (causal) {
        const int64_t tok_max = (std::min(rows, (tile + 1) * tile_rows) - 1) / group;
        end = std::clamp<int64_t>(kv - q_len + tok_max + 1, 0, kv);
      }
      items.push_back({int32_t(b), int32_t(tile), end});
    }
  }
  std::stable_sort(
      items.begin(), items.end(), [cost_keys](const PrefillWorkItem& a, const PrefillWorkItem& b) {
        return (a.end + cost_keys - 1) / cost_keys > (b.end + cost_keys - 1) / cost_keys;
      });
  return items;
}

std::vector<int32_t> prefill_unit_tiles(const std::vector<PrefillWorkItem>& items, int num_kv_heads,
                                        int keys, int unit_heads) {
  LONGCTX_CHECK(unit_heads > 0 && num_kv_heads % unit_heads == 0, ErrorCode::kInvalidArgument,
                "paged prefill plan: {} kv heads per unit block does not divide {} kv heads",
                unit_heads, num_kv_heads);
  const int n = int(items.size());
  std::vector<int32_t> tiles(size_t(n) * num_kv_heads);
  for (int u = 0; u < int(tiles.size()); ++u)
    tiles[u] = int32_t((items[prefill_unit(u, n, unit_heads).item].end + keys - 1) / keys);
  return tiles;
}

namespace {

// The CTA of p that takes unit u in the kernel's snake order: round k = u / p forward when even,
// backward when odd (item_at in prefill_sm90.cu).
int64_t snake_cta(int64_t u, int64_t p) {
  const int64_t k = u / p, r = u % p;
  return (k & 1) ? p - 1 - r : r;
}

}  // namespace

double prefill_snake_makespan(const std::vector<int32_t>& tiles, int num_ctas, int unit_overhead) {
  if (num_ctas <= 0) return 0;
  std::vector<double> load(num_ctas, 0.0);
  for (int64_t u = 0; u < int64_t(tiles.size()); ++u)
    load[snake_cta(u, num_ctas)] += double(tiles[u]) + unit_overhead;
  return *std::max_element(load.begin(), load.end());
}

namespace {

// A point of the concatenated key tiles: unit u from key tile t (t < tiles[u], or (N, 0)).
struct Cut {
  int32_t u = 0, t = 0;
  bool operator==(const Cut&) const = default;
};

// Stream-K over units [first, n): the P - 1 inner cuts of the line on which every unit first
// pays its overhead, at equal fractions of it, snapped to a unit's start or end where the piece
// on either side would be shorter than the overhead (the snap is monotone in the position, so
// the cuts stay ordered). Fills ctas, merges, num_slots; load[x] += CTA x's share of the line.
void stream_k(const std::vector<int32_t>& tiles, int32_t first, int num_ctas, double c0,
              PrefillSplit& out, std::vector<double>& load) {
  const int32_t n = int32_t(tiles.size());
  double total = 0;
  for (int32_t u = first; u < n; ++u) total += c0 + std::max(tiles[u], 0);
  std::vector<Cut> cut(num_ctas + 1);
  cut[0] = {first, 0};
  cut[num_ctas] = {n, 0};
  int32_t u = first;
  double start = 0;
  for (int x = 1; x < num_ctas; ++x) {
    const double at = total * x / num_ctas;
    while (u < n && start + c0 + std::max(tiles[u], 0) <= at) start += c0 + std::max(tiles[u++], 0);
    if (u == n) {
      cut[x] = {n, 0};
      continue;
    }
    const int32_t len = std::max(tiles[u], 0);
    int32_t t = int32_t(std::lround(std::clamp(at - start - c0, 0.0, double(len))));
    if (t < c0) t = 0;
    if (len - t < c0) t = len;
    // Two cuts in one unit: no piece between them shorter than the overhead either (this CTA's
    // range is empty then).
    const Cut prev = cut[x - 1];
    if (prev.u == u && t > prev.t && t - prev.t < c0) t = prev.t;
    cut[x] = t == len ? Cut{u + 1, 0} : Cut{u, t};
  }

  out.ctas.assign(num_ctas, PrefillCtaRange{});
  for (int x = 0; x < num_ctas; ++x) {
    const Cut b = cut[x], e = cut[x + 1];
    PrefillCtaRange& r = out.ctas[x];
    if (b == e) continue;  // an empty range: (0, 0, 0, 0), no unit
    r.unit_begin = b.u;
    r.tile_begin = b.t;
    r.unit_end = e.u;
    r.tile_end = e.t;
    const int32_t last = e.t > 0 ? e.u : e.u - 1;
    for (int32_t v = b.u; v <= last; ++v) {
      const int32_t len = std::max(tiles[v], 0);
      const int32_t kb = v == b.u ? b.t : 0, ke = v == e.u ? e.t : len;
      load[x] += c0 + (ke - kb);
      if (kb == 0 && ke == len) continue;
      // Pieces are numbered in CTA order, and a CTA's first piece comes before its last, so the
      // pieces of one unit (on consecutive CTAs) get consecutive slots.
      const int32_t slot = out.num_slots++;
      (v == b.u ? r.slot_first : r.slot_last) = slot;
      if (v == last && v == b.u) r.slot_last = slot;
      if (out.merges.empty() || out.merges.back().unit != v) out.merges.push_back({v, slot, 0});
      ++out.merges.back().count;
    }
  }
}

}  // namespace

PrefillSplit plan_prefill_split(const std::vector<int32_t>& tiles, int num_ctas, int unit_overhead,
                                double min_gain, PrefillSplitMode mode, double range_cost) {
  PrefillSplit out;
  const int32_t n = int32_t(tiles.size());
  out.whole_makespan = prefill_snake_makespan(tiles, num_ctas, unit_overhead);
  if (mode == PrefillSplitMode::kNever || num_ctas <= 0 || n == 0) return out;
  const double c0 = std::max(unit_overhead, 0);
  const int64_t p = num_ctas;

  // Candidates: stream-K over every unit (dp_rounds 0), or whole rounds first and stream-K over
  // the rest: the partial last round alone, or it and the round before (a tail of one round or
  // less can leave a CTA with little; one more round evens it out).
  const int32_t full_rounds = int32_t(n / p);
  std::vector<int32_t> candidates = {0};
  for (int32_t r : {full_rounds - 1, full_rounds})
    if (r > 0 && int64_t(r) * p < n) candidates.push_back(r);
  bool have = false;
  for (int32_t rounds : candidates) {
    PrefillSplit s;
    s.whole_makespan = out.whole_makespan;
    s.dp_rounds = rounds;
    std::vector<double> dp(num_ctas, 0.0), sk(num_ctas, 0.0);
    for (int64_t u = 0; u < int64_t(rounds) * p; ++u)
      dp[snake_cta(u, p)] += double(std::max(tiles[u], 0)) + c0;
    stream_k(tiles, int32_t(rounds * p), num_ctas, c0, s, sk);
    s.split_makespan = 0;
    for (int x = 0; x < num_ctas; ++x)
      s.split_makespan = std::max(s.split_makespan, dp[x] + range_cost * sk[x]);
    // Ties go to more whole rounds (fewer pieces, more CTAs reading K/V in step).
    if (!have || s.split_makespan <= out.split_makespan) {
      out = std::move(s);
      have = true;
    }
  }
  const bool take =
      mode == PrefillSplitMode::kAlways
          ? true
          : out.num_slots > 0 && out.split_makespan < out.whole_makespan * (1.0 - min_gain);
  if (!take) {
    out.ctas.clear();
    out.merges.clear();
    out.num_slots = 0;
    out.dp_rounds = 0;
  }
  return out;
}

PrefillScheduleModel hopper_prefill_schedule_model(int num_ctas, int64_t l2_bytes) {
  PrefillScheduleModel m;
  m.num_ctas = num_ctas;
  m.l2_bytes = l2_bytes;
  // What starting a unit costs in key tiles (Q load, pipeline fill, epilogue; the producer
  // overlaps most of it with the previous unit).
  m.unit_overhead = 2;
  // A key tile of a range costs more than one of a whole unit: whole units all start at key tile
  // 0, so the CTAs that read the same head's K/V stay in step and share it through L2, and ranges
  // do not (unshared, a 128-row tile's K/V at the tensor cores' pace is about the H200's whole
  // DRAM bandwidth). 8 % makes the H200's choices on every measured shape (docs/benchmarks.md):
  // stream-K over all 512 units of the 2K chunk over 30K keys ran 4 % slower than whole units
  // (modelled 3 % faster without the cost), three whole rounds and the last round's 116 units cut
  // 4 % slower (modelled 1 % faster: not taken), one whole round and 28 cut units of a 640-token
  // chunk 1.50x faster, and 64 units over 256K keys cut 1.84x faster. The model is that coarse,
  // so a split must promise 5 % (those two: 38 % and 48 %).
  m.range_cost = 1.08;
  m.min_gain = 0.05;
  // With one kv head per block of units the CTAs of neighbouring ranges read the same head's
  // K/V, and cutting the last rounds paid as modelled without a range cost: the 2K chunk over 30K
  // keys, modelled 2.8 % faster after three whole rounds, ran 2.5 % faster.
  m.one_head_range_cost = 1.0;
  m.one_head_min_gain = 0.02;
  return m;
}

PrefillSchedule plan_prefill_schedule(const std::vector<PrefillWorkItem>& items, int num_kv_heads,
                                      int keys, int64_t kv_bytes, const PrefillScheduleModel& m,
                                      PrefillSplitMode mode, int forced_unit_heads) {
  auto split_of = [&](int unit_heads, double min_gain, double range_cost) {
    return plan_prefill_split(prefill_unit_tiles(items, num_kv_heads, keys, unit_heads), m.num_ctas,
                              m.unit_overhead, min_gain, mode, range_cost);
  };
  if (forced_unit_heads > 0)
    return {forced_unit_heads, split_of(forced_unit_heads, m.min_gain, m.range_cost)};
  PrefillSchedule side{num_kv_heads, split_of(num_kv_heads, m.min_gain, m.range_cost)};
  const bool stream_k_only = !side.split.ctas.empty() && side.split.dp_rounds == 0;
  if (num_kv_heads == 1 || 2 * kv_bytes <= 3 * m.l2_bytes || stream_k_only) return side;
  PrefillSchedule one{1, split_of(1, m.one_head_min_gain, m.one_head_range_cost)};
  if (!one.split.ctas.empty() && one.split.dp_rounds > 0) return one;
  if (!side.split.ctas.empty()) return side;
  // Whole units either way: one head per block where the snake balances them as well.
  if (one.split.whole_makespan <= 1.01 * side.split.whole_makespan) {
    const double whole = one.split.whole_makespan;
    one.split = PrefillSplit{};  // no stream-K over every unit one head at a time
    one.split.whole_makespan = whole;
    return one;
  }
  return side;
}

int prefill_tile_rows(int head_dim, bool sm90_path, const PrefillTuning& tuning) {
  if (head_dim != 64 || !sm90_path) return 128;
  return tuning.head_dim64_rows == 128 ? 128 : 192;
}

int prefill_lean_stages(bool block_mask, int head_dim, bool tma, PrefillLean lean) {
  if (block_mask) return 0;
  switch (lean) {
    case PrefillLean::kFull:
      return 0;
    case PrefillLean::kLean2:
      return 2;
    case PrefillLean::kLean3:
      return head_dim == 256 ? 2 : 3;
    case PrefillLean::kAuto:
      break;
  }
  return head_dim == 128 && !tma ? 3 : 2;
}

}  // namespace longctx::kernels
