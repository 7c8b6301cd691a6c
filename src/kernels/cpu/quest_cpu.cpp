// Quest's decode kernels on the CPU, written for reading: one (page, head) at a time.
#include "kernels/cpu/quest_cpu.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include "kernels/cpu/decode_elem.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu {

using decode_detail::load_f32;
using decode_detail::load_kv_f32;
using decode_detail::store_f32;

void check_quest_budget(const QuestBudget& b, int block_size) {
  LONGCTX_CHECK(b.page_tokens >= 1 && block_size >= 1 && block_size % b.page_tokens == 0,
                ErrorCode::kInvalidArgument,
                "quest: --sparse-page {} must be positive and divide the KV block size {}",
                b.page_tokens, block_size);
  LONGCTX_CHECK(b.sink_tokens >= 0 && b.window_tokens >= 1 &&
                    b.budget_tokens > b.sink_tokens + b.window_tokens,
                ErrorCode::kInvalidArgument,
                "quest: --sparse-budget {} must be more than --sparse-sink {} + --sparse-window {} "
                "(window >= 1)",
                b.budget_tokens, b.sink_tokens, b.window_tokens);
}

void quest_meta_update(const QuestMetaParams& p) {
  const int64_t d = p.head_dim, hkv = p.num_kv_heads, row = hkv * d;
  const size_t es = dtype_size(p.dtype);
  const bool fp8 = p.kv_format == KvCacheFormat::kFp8E4M3;
  for (int e = 0; e < p.num_pages; ++e) {
    const int32_t* pg = p.pages + 4 * e;
    const int64_t src_block = pg[0], meta_block = pg[1], page = pg[2], rows = pg[3];
    if (rows <= 0) continue;  // a filler entry (a graph-shaped step's fixed count)
    const int64_t first = src_block * p.block_stride + page * p.page_tokens * row;
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t m = ((meta_block * p.pages_per_block + page) * hkv + h) * 2 * d;
      if (fp8) {  // the dequantized keys' min / max (the scale is positive, or 0 for a page of
                  // zeros: order is kept)
        const float scale = p.k_scale[src_block * p.scale_block_stride + h];
        for (int64_t i = 0; i < d; ++i) {
          float lo = fp8e4m3_to_f32(static_cast<const uint8_t*>(p.k_cache)[first + h * d + i]);
          float hi = lo;
          for (int64_t r = 1; r < rows; ++r) {
            const float x =
                fp8e4m3_to_f32(static_cast<const uint8_t*>(p.k_cache)[first + r * row + h * d + i]);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
          }
          store_f32(p.meta, m + i, lo * scale, p.dtype);
          store_f32(p.meta, m + d + i, hi * scale, p.dtype);
        }
        continue;
      }
      for (int64_t i = 0; i < d; ++i) {
        // Copy the extreme element itself: no conversion, so the metadata is the keys' bits.
        int64_t lo = first + h * d + i, hi = lo;
        for (int64_t r = 1; r < rows; ++r) {
          const int64_t at = first + r * row + h * d + i;
          if (load_f32(p.k_cache, at, p.dtype) < load_f32(p.k_cache, lo, p.dtype)) lo = at;
          if (load_f32(p.k_cache, at, p.dtype) > load_f32(p.k_cache, hi, p.dtype)) hi = at;
        }
        const char* k = static_cast<const char*>(p.k_cache);
        char* meta = static_cast<char*>(p.meta);
        std::memcpy(meta + (m + i) * es, k + lo * es, es);
        std::memcpy(meta + (m + d + i) * es, k + hi * es, es);
      }
    }
  }
}

float quest_page_score(const QuestSelectParams& p, int b, int h, int page) {
  const int64_t d = p.head_dim, hkv = p.num_kv_heads, group = p.num_qo_heads / hkv;
  const int32_t block = p.block_tables[p.block_indptr[b] + page / p.pages_per_block];
  auto bound = [&](int64_t qh) {
    const int64_t m =
        ((int64_t(block) * p.pages_per_block + page % p.pages_per_block) * hkv + qh / group) * 2 *
        d;
    float s = 0.f;
    for (int64_t i = 0; i < d; ++i) {
      const float q = load_f32(p.q, (int64_t(b) * p.num_qo_heads + qh) * d + i, p.dtype);
      s += std::max(q * load_f32(p.meta, m + i, p.dtype), q * load_f32(p.meta, m + d + i, p.dtype));
    }
    return s;
  };
  if (!p.per_head) {
    float sum = 0.f;
    for (int64_t qh = 0; qh < p.num_qo_heads; ++qh) sum += bound(qh);
    return sum / static_cast<float>(p.num_qo_heads);
  }
  float best = bound(h * group);
  for (int64_t g = 1; g < group; ++g) best = std::max(best, bound(h * group + g));
  return best;
}

void quest_select(const QuestSelectParams& p) {
  for (int b = 0; b < p.batch; ++b) {
    const QuestCount c = quest_count(p.kv_lens[b], p.budget);
    LONGCTX_CHECK(c.num_selected <= p.max_selected && c.num_pages <= p.max_pages,
                  ErrorCode::kInvalidArgument,
                  "quest select: sequence {} of {} keys selects {} of {} pages (limits {} / {})", b,
                  p.kv_lens[b], c.num_selected, c.num_pages, p.max_selected, p.max_pages);
    for (int h = 0; h < p.num_kv_heads; ++h) {
      int32_t* out = p.selected + (int64_t(b) * p.num_kv_heads + h) * p.max_selected;
      std::vector<int32_t> pick;
      if (c.all) {
        pick.resize(c.num_pages);
        std::iota(pick.begin(), pick.end(), 0);
      } else {
        std::vector<int32_t> cand;
        std::vector<float> score(c.num_pages);
        for (int j = 0; j < c.num_pages; ++j) {
          if (j < c.sink_pages || j >= c.window_first) {
            pick.push_back(j);
            continue;
          }
          cand.push_back(j);
          score[j] = quest_page_score(p, b, h, j);
        }
        std::stable_sort(cand.begin(), cand.end(),
                         [&](int32_t x, int32_t y) { return score[x] > score[y]; });
        pick.insert(pick.end(), cand.begin(), cand.begin() + c.num_free);
        std::sort(pick.begin(), pick.end());
      }
      std::copy(pick.begin(), pick.end(), out);
    }
  }
}

std::vector<int32_t> quest_touched_pages(std::span<const int64_t> meta_slots,
                                         std::span<const int64_t> cache_slots, int block_size,
                                         int page_tokens, bool block_prefix) {
  LONGCTX_CHECK(meta_slots.size() == cache_slots.size(), ErrorCode::kInternal,
                "quest: {} cache slots for {} new tokens", cache_slots.size(), meta_slots.size());
  // (cache block, meta block, page) -> rows up to the highest new row.
  std::map<std::tuple<int64_t, int64_t, int64_t>, int32_t> touched;
  for (size_t t = 0; t < meta_slots.size(); ++t) {
    if (meta_slots[t] < 0) continue;
    const int64_t off = meta_slots[t] % block_size;
    const int64_t cache_block = cache_slots[t] / block_size,
                  meta_block = meta_slots[t] / block_size;
    int32_t& rows = touched[{cache_block, meta_block, off / page_tokens}];
    rows = std::max<int32_t>(rows, static_cast<int32_t>(off % page_tokens + 1));
    if (block_prefix)  // the block's earlier pages whole
      for (int64_t page = 0; page < off / page_tokens; ++page)
        touched[{cache_block, meta_block, page}] = page_tokens;
  }
  std::vector<int32_t> pages;
  for (const auto& [key, rows] : touched) {
    const auto [cache_block, meta_block, page] = key;
    pages.insert(pages.end(), {static_cast<int32_t>(cache_block), static_cast<int32_t>(meta_block),
                               static_cast<int32_t>(page), rows});
  }
  return pages;
}

int quest_compact_len(int kv_len, const QuestBudget& budget) {
  const QuestCount c = quest_count(kv_len, budget);
  const int p = budget.page_tokens;
  // Every list ends with the sequence's last page (the window is never empty).
  return (c.num_selected - 1) * p + (kv_len - (c.num_pages - 1) * p);
}

std::vector<int32_t> quest_fixed_pages(std::vector<int32_t> pages, int64_t batch,
                                       int64_t touched_per_token) {
  const int64_t fixed = batch * touched_per_token;
  LONGCTX_CHECK(static_cast<int64_t>(pages.size()) <= 4 * fixed && pages.size() % 4 == 0,
                ErrorCode::kInternal,
                "quest: {} touched pages in a decode step of {} sequences (at most {} each)",
                pages.size() / 4, batch, touched_per_token);
  pages.resize(static_cast<size_t>(4 * fixed), 0);  // {0, 0, 0, 0}: rows 0, skipped
  return pages;
}

QuestDecodeLayout quest_decode_layout(int64_t max_seqs, int64_t max_entries, int64_t max_touched) {
  LONGCTX_CHECK(max_seqs >= 1 && max_entries >= max_seqs && max_touched >= max_seqs,
                ErrorCode::kInvalidArgument,
                "quest: a decode layout for {} sequences, {} table entries, {} touched pages",
                max_seqs, max_entries, max_touched);
  QuestDecodeLayout l;
  l.max_seqs = max_seqs;
  l.max_entries = max_entries;
  l.max_touched = max_touched;
  int64_t at = 0;
  auto next = [&](int64_t words) {
    const int64_t here = at;
    at = (at + words + 3) / 4 * 4;
    return here;
  };
  l.lens = next(max_seqs);
  l.indptr = next(max_seqs + 1);
  l.dec_indptr = next(max_seqs + 1);
  l.dec_indices = next(max_seqs);
  l.dec_last = next(max_seqs);
  l.qo = next(max_seqs + 1);
  l.pages = next(4 * max_touched);
  l.tables = next(max_entries);
  l.loc = next(max_entries);
  l.reuse_read = next(max_seqs);
  l.reuse_write = next(max_seqs);
  l.total = at;
  return l;
}

QuestReuseSlots::QuestReuseSlots(int64_t slots) : slots_(slots) {
  LONGCTX_CHECK(slots >= 0, ErrorCode::kInvalidArgument, "quest reuse: {} slots", slots);
}

void QuestReuseSlots::decode_step(std::span<const uint64_t> seq_ids, int64_t num_seqs,
                                  int64_t num_padding, std::vector<int32_t>& read,
                                  std::vector<int32_t>& write) {
  const int64_t n = num_seqs;
  const int64_t keeping =
      static_cast<int64_t>(seq_ids.size()) == n ? std::min(n - num_padding, slots_) : 0;
  read.assign(static_cast<size_t>(n), -1);
  write.assign(static_cast<size_t>(n), -1);
  std::unordered_map<uint64_t, int32_t> next;
  std::vector<uint8_t> taken(static_cast<size_t>(slots_), 0);
  for (int64_t s = 0; s < keeping; ++s) {
    const auto it = slot_of_.find(seq_ids[s]);
    if (it == slot_of_.end()) continue;
    read[s] = write[s] = it->second;
    taken[it->second] = 1;
    next.emplace(seq_ids[s], it->second);
  }
  int32_t free_slot = 0;
  for (int64_t s = 0; s < keeping; ++s) {
    if (write[s] >= 0) continue;
    while (taken[free_slot]) ++free_slot;
    write[s] = free_slot;
    taken[free_slot] = 1;
    next.emplace(seq_ids[s], free_slot);
  }
  slot_of_ = std::move(next);
}

void quest_gather(const QuestGatherParams& p) {
  const int64_t d = p.head_dim, hkv = p.num_kv_heads, row = hkv * d, pt = p.budget.page_tokens;
  const size_t es = dtype_size(p.dtype);
  const bool fp8 = p.kv_format == KvCacheFormat::kFp8E4M3;
  for (int b = 0; b < p.batch; ++b) {
    const QuestCount c = quest_count(p.kv_lens[b], p.budget);
    for (int h = 0; h < hkv; ++h) {
      const int32_t* sel = p.selected + (int64_t(b) * hkv + h) * p.max_selected;
      for (int i = 0; i < c.num_selected; ++i) {
        const int page = sel[i];
        const int64_t dst = (int64_t(b) * p.max_selected + i) * pt * row;
        if (p.reuse_read != nullptr && p.reuse_read[b] >= 0) {  // kept last step, unchanged?
          const int64_t list = (int64_t(p.reuse_read[b]) * hkv + h) * p.max_selected;
          const int j = quest_kept_index(p.kept_pages + list, p.max_selected, page);
          if (j >= 0 && p.kept_blocks[list + j] ==
                            p.block_ids[p.block_indptr[b] + page / p.pages_per_block]) {
            const int64_t src = (int64_t(p.reuse_read[b]) * p.max_selected + j) * pt * row;
            for (int64_t r = 0; r < pt; ++r) {
              const int64_t s = (src + r * row + h * d) * es, t = (dst + r * row + h * d) * es;
              std::memcpy(static_cast<char*>(p.out_k) + t, static_cast<const char*>(p.kept_k) + s,
                          d * es);
              std::memcpy(static_cast<char*>(p.out_v) + t, static_cast<const char*>(p.kept_v) + s,
                          d * es);
            }
            if (p.reused_pages != nullptr) ++*p.reused_pages;
            continue;
          }
        }
        const int32_t loc = p.block_loc[p.block_indptr[b] + page / p.pages_per_block];
        const int mem = loc >= 0 ? 0 : 1;
        const int64_t block = loc >= 0 ? loc : -int64_t(loc) - 1;
        if (mem == 1 && p.memory1_pages != nullptr) ++*p.memory1_pages;
        const int64_t src = block * p.block_stride[mem] + (page % p.pages_per_block) * pt * row;
        if (fp8) {  // code x the block's scale, in the output dtype
          const float ks = p.k_scale[mem][block * p.scale_block_stride[mem] + h];
          const float vs = p.v_scale[mem][block * p.scale_block_stride[mem] + h];
          for (int64_t r = 0; r < pt; ++r)
            for (int64_t e = 0; e < d; ++e) {
              const int64_t s = src + r * row + h * d + e, t = dst + r * row + h * d + e;
              store_f32(p.out_k, t, load_kv_f32(p.k_base[mem], s, p.kv_format, p.dtype) * ks,
                        p.dtype);
              store_f32(p.out_v, t, load_kv_f32(p.v_base[mem], s, p.kv_format, p.dtype) * vs,
                        p.dtype);
            }
          continue;
        }
        for (int64_t r = 0; r < pt; ++r) {
          const int64_t s = (src + r * row + h * d) * es, t = (dst + r * row + h * d) * es;
          std::memcpy(static_cast<char*>(p.out_k) + t, static_cast<const char*>(p.k_base[mem]) + s,
                      d * es);
          std::memcpy(static_cast<char*>(p.out_v) + t, static_cast<const char*>(p.v_base[mem]) + s,
                      d * es);
        }
      }
    }
  }
}

void quest_keep(const QuestKeepParams& p) {
  const int64_t d = p.head_dim, hkv = p.num_kv_heads, row = hkv * d, pt = p.budget.page_tokens;
  const size_t es = dtype_size(p.dtype);
  for (int b = 0; b < p.batch; ++b) {
    const int slot = p.reuse_write[b];
    if (slot < 0) continue;
    const QuestCount c = quest_count(p.kv_lens[b], p.budget);
    for (int h = 0; h < hkv; ++h) {
      const int32_t* sel = p.selected + (int64_t(b) * hkv + h) * p.max_selected;
      const int64_t list = (int64_t(slot) * hkv + h) * p.max_selected;
      for (int i = 0; i < p.max_selected; ++i) {
        if (i >= c.num_selected) {
          p.kept_pages[list + i] = std::numeric_limits<int32_t>::max();
          p.kept_blocks[list + i] = -1;
          continue;
        }
        const int page = sel[i];
        p.kept_pages[list + i] = page;
        if (!quest_page_settled(page, p.kv_lens[b], static_cast<int>(pt), p.pages_per_block,
                                p.whole_blocks)) {
          p.kept_blocks[list + i] = -1;  // rows may still change: never a hit, not copied
          continue;
        }
        p.kept_blocks[list + i] = p.block_ids[p.block_indptr[b] + page / p.pages_per_block];
        const int64_t src = (int64_t(b) * p.max_selected + i) * pt * row;
        const int64_t dst = (int64_t(slot) * p.max_selected + i) * pt * row;
        for (int64_t r = 0; r < pt; ++r) {
          const int64_t s = (src + r * row + h * d) * es, t = (dst + r * row + h * d) * es;
          std::memcpy(static_cast<char*>(p.kept_k) + t, static_cast<const char*>(p.compact_k) + s,
                      d * es);
          std::memcpy(static_cast<char*>(p.kept_v) + t, static_cast<const char*>(p.compact_v) + s,
                      d * es);
        }
      }
    }
  }
}

}  // namespace longctx::kernels::cpu
