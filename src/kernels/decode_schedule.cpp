#include "kernels/decode_schedule.h"

#include <algorithm>
#include <cmath>

#include "longctx/core/error.h"

namespace longctx::kernels {

std::vector<int64_t> decode_lengths(const int32_t* kv_indptr, const int32_t* last_page_len,
                                    int batch, int page_size) {
  std::vector<int64_t> len(std::max(batch, 0));
  for (int b = 0; b < batch; ++b) {
    const int32_t pages = kv_indptr[b + 1] - kv_indptr[b];
    LONGCTX_CHECK(pages >= 0, ErrorCode::kInvalidArgument, "decode_plan: kv_indptr decreases at {}",
                  b);
    LONGCTX_CHECK(pages == 0 || (last_page_len[b] >= 1 && last_page_len[b] <= page_size),
                  ErrorCode::kInvalidArgument,
                  "decode_plan: kv_last_page_len[{}] = {} not in [1, {}]", b, last_page_len[b],
                  page_size);
    len[b] = pages == 0 ? 0 : int64_t(pages - 1) * page_size + last_page_len[b];
  }
  return len;
}

// Even splits (not chunk, chunk, ..., remainder).
DecodeSplit decode_split(int64_t len, int64_t chunk) {
  DecodeSplit s;
  s.count = std::max<int64_t>(1, (len + chunk - 1) / chunk);
  s.sub = std::max<int64_t>(64, ((len + s.count - 1) / s.count + 63) / 64 * 64);
  s.count = std::max<int64_t>(1, (len + s.sub - 1) / s.sub);
  return s;
}

namespace {

// The wave model over `slots` resident CTAs: the cost of chunk c is
// ceil(ctas(c) / slots) * (longest split + overhead). At batch 64 x 32K it avoids 512 CTAs over
// 396 slots (1.3 waves).
int64_t chunk_for_slots(const std::vector<int64_t>& len, int64_t max_items, int64_t ctas_per_item,
                        int64_t slots, int64_t overhead, int min_chunk_tokens) {
  const int64_t max_len = len.empty() ? 0 : *std::max_element(len.begin(), len.end());
  const int64_t floor_chunk = std::max<int64_t>(64, (int64_t(min_chunk_tokens) + 63) / 64 * 64);
  int64_t best = std::max<int64_t>(floor_chunk, (max_len + 63) / 64 * 64);
  double best_cost = INFINITY;
  int64_t prev = -1;
  for (int64_t k = 1;; ++k) {
    const int64_t c = std::max(floor_chunk, ((max_len + k - 1) / k + 63) / 64 * 64);
    if (c != prev) {
      prev = c;
      int64_t items = 0, longest = 0;
      for (int64_t x : len) {
        const DecodeSplit s = decode_split(x, c);
        items += s.count;
        longest = std::max(longest, std::min(x, s.sub));
      }
      if (items > max_items) break;  // items only grow as c shrinks
      const int64_t waves = (items * ctas_per_item + slots - 1) / slots;
      const double cost = double(waves) * double(longest + overhead);
      if (cost < best_cost) best_cost = cost, best = c;
    }
    if (c == floor_chunk) break;
  }
  return best;
}

}  // namespace

// Measured on the H200 (docs/benchmarks.md): when the whole grid fits in one wave of 2 CTAs per
// SM, 2 long CTAs per SM beat 3 shorter ones (batch 1, 32K keys: 2265 vs 1981 GB/s; fewer splits
// to merge, fewer pipeline fills); when it does not (batch 64), the 2-per-SM model would plan 512
// CTAs for 396 resident slots (1.3 waves: 2867 vs 3451 GB/s), so the full count is used.
int64_t decode_chunk(const std::vector<int64_t>& len, int64_t max_items, int64_t ctas_per_item,
                     const DecodeWaveModel& m) {
  if (m.slots_override > 0)
    return chunk_for_slots(len, max_items, ctas_per_item, int64_t(m.num_sms) * m.slots_override,
                           m.overhead, m.min_chunk_tokens);
  const int64_t two = int64_t(m.num_sms) * std::min(2, m.resident);
  const int64_t chunk =
      chunk_for_slots(len, max_items, ctas_per_item, two, m.overhead, m.min_chunk_tokens);
  int64_t items = 0;
  for (int64_t x : len) items += decode_split(x, chunk).count;
  if (items * ctas_per_item <= two || m.resident <= 2) return chunk;
  return chunk_for_slots(len, max_items, ctas_per_item, int64_t(m.num_sms) * m.resident, m.overhead,
                         m.min_chunk_tokens);
}

// The TMA kernel's stages are 12-19 % faster than the cp.async ring where TMA boxes fill them,
// and stages of 64 tokens 1-4 % faster than 32. Filled across pages by cp.async (pages of 16
// tokens), they measured 1-12 % slower than the ring for single launches (1-20 % faster back to
// back), hence opt-in there (docs/benchmarks.md).
int decode_loader(int page_size, int head_dim, bool tma, const DecodeTuning& tuning) {
  const int tile = decode_tile_tokens(head_dim);
  const bool boxes = page_size % tile == 0;  // a TMA box of a tile stays within one page
  const bool copy_stages = tuning.copy == DecodeStageCopy::kCpAsync;
  // head_dim 256 keeps the cp.async ring: its TMA stages are not instantiated.
  if (tuning.loader == DecodeLoader::kCpAsync || !tma || (!boxes && !copy_stages) || head_dim > 128)
    return 0;
  const bool doubled = !boxes || page_size % (2 * tile) == 0;
  return tuning.loader != DecodeLoader::kTmaTile && head_dim == 128 && doubled ? 2 : 1;
}

bool decode_cp_async_stages(int loader, int page_size, int head_dim, int64_t chunk,
                            const DecodeTuning& tuning) {
  if (loader < 1) return false;
  if (page_size % decode_tile_tokens(head_dim) != 0 || tuning.copy == DecodeStageCopy::kCpAsync)
    return true;
  return tuning.copy != DecodeStageCopy::kTmaBoxes && chunk >= kDecodeCpAsyncStagesMinChunk;
}

DecodeWaveModel decode_wave_model(const DecodeTuning& tuning, int num_sms, int resident,
                                  int min_chunk_tokens) {
  DecodeWaveModel m;
  m.num_sms = num_sms;
  m.resident = resident;
  m.slots_override = tuning.slots;
  m.overhead = tuning.overhead > 0 ? tuning.overhead : 64;
  m.min_chunk_tokens = min_chunk_tokens;
  return m;
}

std::vector<int32_t> decode_q_lens(const DecodeQueries& queries, int batch) {
  std::vector<int32_t> q_len(std::max(batch, 0), 1);
  if (queries.qo_indptr == nullptr) return q_len;
  LONGCTX_CHECK(batch <= 0 || queries.qo_indptr[0] == 0, ErrorCode::kInvalidArgument,
                "decode_plan: qo_indptr[0] = {} is not 0", queries.qo_indptr[0]);
  for (int b = 0; b < batch; ++b) {
    q_len[b] = queries.qo_indptr[b + 1] - queries.qo_indptr[b];
    LONGCTX_CHECK(q_len[b] >= 0 && q_len[b] <= kDecodeMaxQLen, ErrorCode::kInvalidArgument,
                  "decode_plan: request {} has {} queries (0 to {})", b, q_len[b], kDecodeMaxQLen);
  }
  return q_len;
}

std::vector<int64_t> decode_first_keys(const std::vector<int64_t>& len, int window,
                                       const std::vector<int32_t>& q_len, bool causal) {
  LONGCTX_CHECK(q_len.empty() || q_len.size() == len.size(), ErrorCode::kInternal,
                "decode first keys: {} query counts for {} requests", q_len.size(), len.size());
  std::vector<int64_t> first(len.size(), 0);
  if (window > 0)
    for (size_t b = 0; b < len.size(); ++b) {
      // The first query's end (the causal rule's smallest); at least 1 query is assumed.
      const int64_t tail = causal && !q_len.empty() ? std::max(q_len[b], 1) - 1 : 0;
      first[b] = std::max<int64_t>(0, len[b] - tail - window);
    }
  return first;
}

int64_t decode_max_partials(int64_t max_items, int64_t batch) {
  return std::max<int64_t>(0, std::min(max_items, 2 * (max_items - batch)));
}

std::vector<int64_t> decode_spans(const std::vector<int64_t>& len,
                                  const std::vector<int64_t>& first) {
  std::vector<int64_t> span(len.size());
  for (size_t b = 0; b < len.size(); ++b) span[b] = len[b] - first[b] / 64 * 64;
  return span;
}

DecodeWork decode_work_items(const std::vector<int64_t>& len, const std::vector<int64_t>& first,
                             const int32_t* kv_indptr, int real, int64_t chunk,
                             bool cp_async_stages, const DecodeQueries& queries,
                             const std::vector<int32_t>& q_len) {
  LONGCTX_CHECK(first.size() == len.size() && (q_len.empty() || q_len.size() == len.size()),
                ErrorCode::kInternal, "decode work: {} first keys, {} query counts for {} requests",
                first.size(), q_len.size(), len.size());
  DecodeWork w;
  for (int b = 0; b < int(len.size()); ++b) {
    const int64_t base = first[b] / 64 * 64, span = len[b] - base;
    const DecodeSplit sp =
        b < real ? decode_split(span, chunk) : DecodeSplit{1, std::max<int64_t>(span, 1)};
    const int32_t split = sp.count > 1 ? int32_t(sp.count) : 0;
    for (int64_t s = 0; s < sp.count; ++s) {
      const int32_t item[kDecodeWorkInts] = {b,
                                             int32_t(s == 0 ? first[b] : base + s * sp.sub),
                                             int32_t(std::min(len[b], base + (s + 1) * sp.sub)),
                                             split ? w.num_partials + int32_t(s) : -1,
                                             kv_indptr[b],
                                             w.num_partials,
                                             split,
                                             cp_async_stages ? 1 : 0,
                                             queries.qo_indptr ? queries.qo_indptr[b] : b,
                                             q_len.empty() ? 1 : q_len[b],
                                             int32_t(len[b]),
                                             queries.causal ? 1 : 0};
      w.items.insert(w.items.end(), item, item + kDecodeWorkInts);
    }
    w.num_partials += split;
  }
  return w;
}

}  // namespace longctx::kernels
