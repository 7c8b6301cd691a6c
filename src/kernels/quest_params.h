// Parameter structs of Quest's decode-time kernels (docs/sparse.md), shared by the CPU references
// (kernels/cpu/quest_cpu.h) and the CUDA kernels (kernels/cuda/quest.h). Raw pointers and plain
// integers, as kernels/attention_params.h.
//
// Quest selects pages of page_tokens keys (a KV block holds pages_per_block pages). Per page and
// KV head it keeps the elementwise min and max of the page's keys ("metadata", in the cache's
// dtype: the min and max of bf16 keys are bf16 keys, so no rounding), laid out
//   meta [num_blocks][pages_per_block][num_kv_heads][2 (min, max)][head_dim]
// for one layer, indexed by the engine's block id. A decode query scores each page by
// sum_d max(q_d min_d, q_d max_d) (the upper bound of q.k over the page's keys) and reads, per
// KV head, the sink pages, the window pages and the best-scored others within the budget. The
// selected pages' K and V are gathered into one compact buffer that the split-KV decode kernel
// reads as one page per sequence.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/kv_format.h"
#include "longctx/core/dtype.h"

namespace longctx::kernels {

// What one sequence of kv_len keys selects (the same for every KV head).
struct QuestCount {
  int num_pages = 0;     // ceil(kv_len / page_tokens)
  int sink_pages = 0;    // pages [0, sink_pages) are forced
  int window_first = 0;  // pages [window_first, num_pages) are forced
  int num_forced = 0;    // their union
  int num_free = 0;      // best-scored others picked (0 when all is set)
  int num_selected = 0;  // per KV head
  bool all = false;      // the budget covers the sequence: every page, in order
};

struct QuestBudget {
  int page_tokens = 16;
  int budget_tokens = 4096;  // per KV head, sink and window included (whole pages)
  int sink_tokens = 64;
  int window_tokens = 256;  // >= 1, so the last (partial) page is always read
};

LONGCTX_HD inline QuestCount quest_count(int kv_len, const QuestBudget& b) {
  QuestCount c;
  const int p = b.page_tokens;
  c.num_pages = (kv_len + p - 1) / p;
  const int budget_pages = b.budget_tokens / p > 1 ? b.budget_tokens / p : 1;
  if (b.budget_tokens >= kv_len || budget_pages >= c.num_pages) {
    c.all = true;
    c.num_selected = c.num_pages;
    return c;
  }
  const int sink = (b.sink_tokens + p - 1) / p;
  c.sink_pages = sink < c.num_pages ? sink : c.num_pages;
  const int wf = (kv_len - b.window_tokens) / p;
  c.window_first = kv_len > b.window_tokens ? wf : 0;
  const int window_start = c.window_first > c.sink_pages ? c.window_first : c.sink_pages;
  c.num_forced = c.sink_pages + (c.num_pages - window_start);
  const int candidates = c.num_pages - c.num_forced;
  const int free_pages = budget_pages > c.num_forced ? budget_pages - c.num_forced : 0;
  c.num_free = free_pages < candidates ? free_pages : candidates;
  c.num_selected = c.num_forced + c.num_free;
  return c;
}

// The most pages quest_count() selects for any kv_len under `b` (the compact buffer's size).
inline int quest_max_selected(const QuestBudget& b) {
  const int p = b.page_tokens;
  const int budget_pages = b.budget_tokens / p > 1 ? b.budget_tokens / p : 1;
  const int forced = (b.sink_tokens + p - 1) / p + (b.window_tokens + p - 1) / p + 1;
  // "all" selects at most budget pages + 1 (a budget that is not a whole number of pages).
  const int all = (b.budget_tokens + p - 1) / p;
  int m = budget_pages > forced ? budget_pages : forced;
  return m > all ? m : all;
}

// Device bytes of Quest's GPU buffers: per KV block its pages' metadata (every layer), and the
// fixed part (per sequence of a step: the scores, the lists and the compact K / V buffers; per
// sequence that keeps its pages across decode steps, reuse_seqs, and layer: a kept slot's lists
// and K / V rows, QuestKeepParams).
struct QuestBytes {
  int64_t per_block = 0;
  int64_t fixed = 0;
};
inline QuestBytes quest_gpu_bytes(const QuestBudget& b, int64_t num_layers, int64_t block_size,
                                  int64_t num_kv_heads, int64_t head_dim, int64_t elem_size,
                                  int64_t max_seqs, int64_t max_model_len, int64_t reuse_seqs = 0) {
  QuestBytes q;
  const int64_t p = b.page_tokens;
  q.per_block = num_layers * (block_size / p) * num_kv_heads * 2 * head_dim * elem_size;
  const int64_t max_pages = (max_model_len + p - 1) / p;
  const int64_t sel = quest_max_selected(b) < max_pages ? quest_max_selected(b) : max_pages;
  q.fixed = max_seqs * num_kv_heads * (max_pages + sel) * 4 +
            2 * max_seqs * sel * p * num_kv_heads * head_dim * elem_size;
  q.fixed += reuse_seqs * num_layers *
             (2 * num_kv_heads * sel * 4 + 2 * sel * p * num_kv_heads * head_dim * elem_size);
  return q;
}

// Recomputes the metadata of num_pages pages of one layer from the keys in k_cache. Entry e of
// `pages` is {cache block, meta block, page in block, rows}: rows [0, rows) of that page (of
// the cache block's keys, rows num_kv_heads * head_dim elements apart) are the page's keys; an
// entry of rows 0 is skipped (fillers that keep a CUDA graph's launch at a fixed count).
// An FP8 cache (kv_format kFp8E4M3) holds codes, and cache block b's scale of KV head h is
// k_scale[b * scale_block_stride + h]: the metadata is the min / max of the dequantized keys
// (code x scale), stored in `dtype` (exact in bf16 and f32: an E4M3 value times a power of two).
struct QuestMetaParams {
  const void* k_cache =
      nullptr;               // block b's keys at element b * block_stride: [block_size, Hkv, d]
  int64_t block_stride = 0;  // elements between cache blocks
  void* meta = nullptr;      // [num_blocks][pages_per_block][Hkv][2][d] (one layer)
  const int32_t* pages = nullptr;  // [num_pages][4]
  int num_pages = 0;
  int num_kv_heads = 0, head_dim = 0, page_tokens = 0, pages_per_block = 0;
  DType dtype = DType::kBF16;  // of meta, and of k_cache unless FP8
  KvCacheFormat kv_format = KvCacheFormat::kDtype;
  const float* k_scale = nullptr;  // FP8: [blocks][scale_block_stride], head h at + h
  int64_t scale_block_stride = 0;  // floats between cache blocks' scales
};

// Selection of a batch of decoding sequences (one query each): per sequence b and KV head h the
// ascending logical page indices it reads, selected[(b * Hkv + h) * max_selected + i] for
// i < quest_count(kv_lens[b]).num_selected. Per KV head, a page's score is the largest bound
// among the q heads of h's group; head-averaged (per_head = false) it is the mean bound over all
// q heads and every KV head reads the same list. Ties go to the earlier page.
struct QuestSelectParams {
  const void* q = nullptr;                // [batch, Hq, d]
  const void* meta = nullptr;             // one layer's, as QuestMetaParams::meta
  const int32_t* block_indptr = nullptr;  // [batch + 1] into block_tables
  const int32_t* block_tables = nullptr;  // meta block ids of each sequence's logical blocks
  const int32_t* kv_lens = nullptr;       // [batch]
  float* scores = nullptr;  // CUDA scratch [batch][Hkv][max_pages] (the CPU reference ignores it)
  int32_t* selected = nullptr;  // [batch][Hkv][max_selected]
  int batch = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  int pages_per_block = 0, max_pages = 0, max_selected = 0;
  QuestBudget budget;
  bool per_head = true;
  DType dtype = DType::kBF16;  // of q and meta
};

// Gather of the selected pages of one layer into the compact buffers: page i of (b, h) lands at
// rows [i * page_tokens, (i + 1) * page_tokens) of sequence b's region of max_selected *
// page_tokens rows, head h. A logical block's keys are in one of two memories: block_loc >= 0 is
// block block_loc of memory 0, block_loc < 0 block -block_loc - 1 of memory 1 (with offload: the
// GPU cache and the host pool, read in place through mapped pinned memory). An FP8 cache
// (kv_format kFp8E4M3): the bases hold codes (block_stride in bytes), block b's K scale of head h
// is k_scale[mem][b * scale_block_stride[mem] + h] (V's from v_scale), and the gather writes the
// dequantized keys and values (code x scale) in `dtype`: the compact buffer is one page per
// sequence that mixes blocks of different scales, so it cannot stay FP8.
struct QuestGatherParams {
  const void* k_base[2] = {nullptr, nullptr};  // [blocks][block_size, Hkv, d] at block_stride
  const void* v_base[2] = {nullptr, nullptr};
  int64_t block_stride[2] = {0, 0};       // elements between blocks
  const int32_t* block_indptr = nullptr;  // [batch + 1] into block_loc
  const int32_t* block_loc = nullptr;     // per logical block, encoded as above
  const int32_t* kv_lens = nullptr;       // [batch]
  const int32_t* selected = nullptr;      // as QuestSelectParams::selected
  void* out_k = nullptr;                  // [batch][max_selected * page_tokens][Hkv][d]
  void* out_v = nullptr;
  unsigned long long* memory1_pages = nullptr;  // optional counter: += pages read from memory 1
  int batch = 0, num_kv_heads = 0, head_dim = 0, pages_per_block = 0, max_selected = 0;
  QuestBudget budget;
  DType dtype = DType::kBF16;  // of out_k / out_v, and of the bases unless FP8
  KvCacheFormat kv_format = KvCacheFormat::kDtype;
  const float* k_scale[2] = {nullptr, nullptr};  // FP8: per memory, as above
  const float* v_scale[2] = {nullptr, nullptr};
  int64_t scale_block_stride[2] = {0, 0};  // floats between blocks' scales
  // Page reuse across decode steps (reuse_read set; QuestKeepParams keeps the slots): a page that
  // sequence b's kept slot reuse_read[b] >= 0 lists for head h, with the block id its logical
  // block has now (block_ids), is copied from the slot's kept rows instead of read from memory.
  const int32_t* reuse_read = nullptr;   // [batch] kept slot, -1: none
  const int32_t* block_ids = nullptr;    // per logical block its engine block id (as block_loc)
  const int32_t* kept_pages = nullptr;   // as QuestKeepParams::kept_pages
  const int32_t* kept_blocks = nullptr;  // as QuestKeepParams::kept_blocks
  const void* kept_k = nullptr;          // as QuestKeepParams::kept_k
  const void* kept_v = nullptr;
  unsigned long long* reused_pages = nullptr;  // optional counter: += pages copied from a slot
};

// After a layer's decode: sequence b with reuse_write[b] >= 0 keeps, in slot reuse_write[b], its
// selected pages of each KV head as the gather wrote them. kept_pages[slot][h][i] is page i of
// (b, h) (INT32_MAX past its num_selected: the list stays ascending over max_selected entries);
// kept_blocks[slot][h][i] the engine block id of that page's logical block when the page's rows
// can no longer change (all page_tokens rows written; whole_blocks (an FP8 cache, where a later
// row of the block may raise the block's scale and re-encode it): its whole block written), else
// -1, never a hit; the rows of those pages are copied from the compact buffer to the slot's rows
// [i * page_tokens, (i + 1) * page_tokens).
struct QuestKeepParams {
  const void* compact_k = nullptr;  // as QuestGatherParams::out_k
  const void* compact_v = nullptr;
  void* kept_k = nullptr;  // [slots][max_selected * page_tokens][Hkv][d]
  void* kept_v = nullptr;
  int32_t* kept_pages = nullptr;          // [slots][Hkv][max_selected]
  int32_t* kept_blocks = nullptr;         // [slots][Hkv][max_selected]
  const int32_t* reuse_write = nullptr;   // [batch] slot, -1: keeps nothing
  const int32_t* selected = nullptr;      // as QuestSelectParams::selected
  const int32_t* block_indptr = nullptr;  // [batch + 1] into block_ids
  const int32_t* block_ids = nullptr;     // per logical block its engine block id
  const int32_t* kv_lens = nullptr;       // [batch]
  int batch = 0, num_kv_heads = 0, head_dim = 0, pages_per_block = 0, max_selected = 0;
  QuestBudget budget;
  DType dtype = DType::kBF16;  // of the compact and kept buffers
  bool whole_blocks = false;
};

// Where page `page` is in a kept list of n ascending entries (-1: absent).
LONGCTX_HD inline int quest_kept_index(const int32_t* list, int n, int page) {
  int lo = 0, hi = n;  // the first entry >= page is in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (list[mid] < page)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && list[lo] == page ? lo : -1;
}

// Whether page `page` of a sequence of kv_len keys can no longer change (QuestKeepParams).
LONGCTX_HD inline bool quest_page_settled(int page, int kv_len, int page_tokens,
                                          int pages_per_block, bool whole_blocks) {
  const int64_t end =
      whole_blocks ? (int64_t(page / pages_per_block) + 1) * pages_per_block : int64_t(page) + 1;
  return end * page_tokens <= kv_len;
}

}  // namespace longctx::kernels
