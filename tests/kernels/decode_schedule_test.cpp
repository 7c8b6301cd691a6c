// The split-KV decode plan's host side (kernels/decode_schedule.h): even splits that cover each
// request in multiples of 64 keys; the wave model's chunks, held to the ones the H200 ran in
// docs/benchmarks.md (132 SMs, 8 kv heads of group 4); the loader and copy choices with their
// pins; the work list's layout; and clear errors on a malformed page table.
#include "kernels/decode_schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "longctx/core/error.h"

namespace longctx::kernels {
namespace {

// A page table's kv_indptr for `batch` requests (its values only travel into the work items).
std::vector<int32_t> zero_indptr(int batch) { return std::vector<int32_t>(batch + 1, 0); }

TEST(DecodeSchedule, SplitsAreEvenAndCoverTheRequest) {
  for (int64_t len : {0, 1, 63, 64, 65, 1000, 4097, 32768, 131072, 1 << 20})
    for (int64_t chunk : {64, 256, 1000, 1024, 4032, 32768}) {
      const DecodeSplit s = decode_split(len, chunk);
      SCOPED_TRACE(testing::Message() << "len " << len << " chunk " << chunk);
      EXPECT_GE(s.count, 1);
      EXPECT_EQ(s.sub % 64, 0);
      EXPECT_GE(s.count * s.sub, len);                              // every key in a split
      EXPECT_LT((s.count - 1) * s.sub, std::max<int64_t>(len, 1));  // no empty split
      if (len > 0) EXPECT_LE(s.count, (len + chunk - 1) / chunk);
    }
  const DecodeSplit s = decode_split(1000, 256);  // 4 even splits, not 256 x 3 + 232
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.sub, 256);
}

// The H200's decode shapes: 132 SMs, 8 kv heads x 1 head tile (group 4), the work-item bound of
// decode.cu (batch + 132), 256-key floor.
int64_t h200_chunk(const std::vector<int64_t>& len, int resident, int slots_override = 0) {
  DecodeWaveModel m;
  m.num_sms = 132;
  m.resident = resident;
  m.slots_override = slots_override;
  return decode_chunk(len, int64_t(len.size()) + 132, 8, m);
}

TEST(DecodeSchedule, ChunksAreTheOnesTheH200Ran) {
  // The TMA kernel's stages of 64 tokens: 2 CTAs per SM.
  EXPECT_EQ(h200_chunk({1024}, 2), 256);
  EXPECT_EQ(h200_chunk({4096}, 2), 256);
  EXPECT_EQ(h200_chunk({8192}, 2), 256);
  EXPECT_EQ(h200_chunk({16384}, 2), 512);
  EXPECT_EQ(h200_chunk({32768}, 2), 1024);  // 256 CTAs: one wave of 264 slots
  EXPECT_EQ(h200_chunk({131072}, 2), 4032);
  EXPECT_EQ(h200_chunk({1 << 20}, 2), 31808);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(2, 16384), 2), 1024);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(2, 32768), 2), 2048);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(4, 32768), 2), 4096);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(8, 32768), 2), 8192);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(16, 32768), 2), 16384);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(32, 32768), 2), 32768);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(64, 32768), 2), 32768);
  // The cp.async ring holds 3 CTAs per SM: batch 1 still takes 2 long CTAs per SM, batch 64 the
  // full count (1536 CTAs in 4 waves of 396 rather than 512 in 2).
  EXPECT_EQ(h200_chunk({32768}, 3), 1024);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(64, 32768), 3), 10944);
  // DecodeTuning::slots: the bench's s=1 and s=3 rows.
  EXPECT_EQ(h200_chunk({32768}, 2, 1), 2048);
  EXPECT_EQ(h200_chunk({32768}, 2, 3), 704);
  EXPECT_EQ(h200_chunk({131072}, 2, 3), 2688);
  EXPECT_EQ(h200_chunk(std::vector<int64_t>(2, 32768), 2, 3), 1408);
}

// Batch 1 at few kv heads (Qwen3-30B-A3B: 4 kv heads of group 8; Llama-3.1-8B: 8 of group 4)
// over 32K-128K keys on 132 SMs, with decode.cu's item bound (batch + 132 x 8 CTAs / CTAs per
// item): the plan fills one wave of the 2 x 132 slots it models, at least 90 % of them, and
// splits evenly (multiples of 64 keys; the last split at least half as long as the others).
TEST(DecodeSchedule, FewKvHeadsFillOneWaveAtBatchOne) {
  for (const int kv_heads : {4, 8})
    for (const int64_t len : {32768, 65536, 131072}) {
      DecodeWaveModel m;
      m.num_sms = 132;
      m.resident = 2;
      const int64_t items = 1 + (132 * 8 + kv_heads - 1) / kv_heads;
      const int64_t chunk = decode_chunk({len}, items, kv_heads, m);
      const DecodeSplit s = decode_split(len, chunk);
      SCOPED_TRACE(testing::Message() << kv_heads << " kv heads, " << len << " keys: chunk "
                                      << chunk << ", " << s.count << " splits");
      const int64_t ctas = s.count * kv_heads;
      EXPECT_LE(ctas, 2 * 132);
      EXPECT_GE(ctas, 9 * 2 * 132 / 10);
      EXPECT_EQ(s.sub % 64, 0);
      EXPECT_GE(len - (s.count - 1) * s.sub, s.sub / 2);  // the last split not much shorter
    }
  // Qwen3-30B-A3B at 32K: 64 splits of 512 keys per kv head (256 CTAs); 3 slots per SM (the
  // bench's s=3) take 86 splits of 384 (344 CTAs), 1 slot (s=1) 32 of 1024 (128 CTAs).
  DecodeWaveModel m;
  m.num_sms = 132;
  m.resident = 2;
  EXPECT_EQ(decode_chunk({32768}, 1 + 264, 4, m), 512);
  m.slots_override = 3;
  EXPECT_EQ(decode_chunk({32768}, 1 + 264, 4, m), 384);
  m.slots_override = 1;
  EXPECT_EQ(decode_chunk({32768}, 1 + 264, 4, m), 1024);
}

// The fused merge's levels (decode_merge_group): one level up to 32 splits (the 8-kv-head plans
// the H200 measured keep it: 32 splits of 1024 keys at 32K), groups of ceil(sqrt(n)) above (the
// 30B-A3B's 64 splits at 32K: 8 groups of 8), so neither level reads more than ~sqrt(n) states;
// a pin sets the group size (at least 2; at or above n: one level).
TEST(DecodeSchedule, MergesOfManySplitsTakeTwoLevels) {
  EXPECT_EQ(decode_merge_group(2, 0), 2);
  EXPECT_EQ(decode_merge_group(32, 0), 32);  // one level
  EXPECT_EQ(decode_merge_group(33, 0), 6);   // 6 groups, the last of 3
  EXPECT_EQ(decode_merge_group(64, 0), 8);   // 8 x 8
  EXPECT_EQ(decode_merge_group(66, 0), 9);
  EXPECT_EQ(decode_merge_group(130, 0), 12);
  for (int n = 1; n <= 2000; ++n) {
    const int g = decode_merge_group(n, 0);
    SCOPED_TRACE(testing::Message() << n << " splits: groups of " << g);
    ASSERT_GE(g, 1);
    ASSERT_LE(g, n);
    if (g == n) {
      EXPECT_LE(n, kDecodeMergeOneLevelMax);
      continue;
    }
    const int groups = (n + g - 1) / g;
    EXPECT_GE(groups, 2);
    EXPECT_LE(groups, g);             // the tail merges no more states than a group
    EXPECT_LT((g - 1) * (g - 1), n);  // the smallest such g
  }
  // Pins.
  EXPECT_EQ(decode_merge_group(64, 1), 2);  // at least 2
  EXPECT_EQ(decode_merge_group(64, 3), 3);
  EXPECT_EQ(decode_merge_group(64, 64), 64);
  EXPECT_EQ(decode_merge_group(64, 1000), 64);  // one level
  EXPECT_EQ(decode_merge_group(16, 5), 5);      // a pin may split below the one-level bound
  // The 30B-A3B's plan at 32K (64 splits of 512 keys a kv head) merges in two levels.
  DecodeWaveModel m;
  m.num_sms = 132;
  m.resident = 2;
  const int64_t chunk = decode_chunk({32768}, 1 + 264, 4, m);
  const int n = int(decode_split(32768, chunk).count);
  EXPECT_EQ(n, 64);
  EXPECT_EQ(decode_merge_group(n, 0), 8);
}

TEST(DecodeSchedule, ChunksRespectTheFloorAndTheItemBound) {
  DecodeWaveModel m;
  m.num_sms = 132;
  m.min_chunk_tokens = 1000;  // rounded up to whole 64-key tiles
  EXPECT_EQ(decode_chunk({1 << 20}, 1 + 132, 8, m) % 64, 0);
  EXPECT_GE(decode_chunk({4096}, 1 + 132, 8, m), 1024);
  EXPECT_EQ(decode_chunk({}, 132, 8, m), 1024);  // no request: the floor
  // At most max_items splits: 1M keys in at most 4 items.
  m.min_chunk_tokens = 64;
  const int64_t c = decode_chunk({1 << 20}, 4, 8, m);
  EXPECT_LE(decode_split(1 << 20, c).count, 4);
}

// The tuning's pins (DecodeTuning::loader / ::copy).
DecodeTuning pins(DecodeLoader loader, DecodeStageCopy copy) {
  DecodeTuning t;
  t.loader = loader;
  t.copy = copy;
  return t;
}
constexpr DecodeLoader kAutoLoader = DecodeLoader::kAuto;
constexpr DecodeStageCopy kAutoCopy = DecodeStageCopy::kAuto;

TEST(DecodeSchedule, LoaderFollowsPagesHeadDimAndPins) {
  const DecodeTuning none;
  EXPECT_EQ(decode_loader(128, 128, true, none), 2);  // stages of 64 tokens
  EXPECT_EQ(decode_loader(4096, 128, true, none), 2);
  EXPECT_EQ(decode_loader(32, 128, true, none), 1);  // whole 32-token tiles only
  EXPECT_EQ(decode_loader(96, 128, true, none), 1);
  EXPECT_EQ(decode_loader(16, 128, true, none), 0);  // no boxes: the ring
  EXPECT_EQ(decode_loader(1, 128, true, none), 0);
  EXPECT_EQ(decode_loader(128, 64, true, none), 1);    // no doubled stages at head_dim 64
  EXPECT_EQ(decode_loader(32, 64, true, none), 0);     // the 64-token tile spans pages
  EXPECT_EQ(decode_loader(128, 128, false, none), 0);  // no TMA on the device
  EXPECT_EQ(decode_loader(128, 128, true, pins(DecodeLoader::kCpAsync, kAutoCopy)), 0);
  EXPECT_EQ(decode_loader(128, 128, true, pins(DecodeLoader::kTmaTile, kAutoCopy)), 1);
  // Stages filled by cp.async: the TMA kernel across pages for any page size.
  const DecodeTuning copy = pins(kAutoLoader, DecodeStageCopy::kCpAsync);
  EXPECT_EQ(decode_loader(16, 128, true, copy), 2);
  EXPECT_EQ(decode_loader(1, 64, true, copy), 1);
  EXPECT_EQ(decode_loader(16, 128, false, copy), 0);
  EXPECT_EQ(decode_loader(16, 128, true, pins(kAutoLoader, DecodeStageCopy::kTmaBoxes)), 0);
  // head_dim 256 (Gemma 3): the cp.async ring of 32-token stages, whatever the pins.
  EXPECT_EQ(decode_tile_tokens(256), 32);
  EXPECT_EQ(decode_loader(128, 256, true, none), 0);
  EXPECT_EQ(decode_loader(128, 256, true, copy), 0);
  EXPECT_EQ(decode_loader(128, 256, true, pins(DecodeLoader::kTmaTile, kAutoCopy)), 0);
}

TEST(DecodeSchedule, StagesTakeCpAsyncOverLongSplits) {
  const DecodeTuning none;
  EXPECT_FALSE(decode_cp_async_stages(0, 16, 128, 1 << 20, none));  // the ring has no stages
  EXPECT_FALSE(decode_cp_async_stages(2, 128, 128, 256, none));     // TMA boxes start sooner
  EXPECT_FALSE(decode_cp_async_stages(2, 128, 128, 512, none));
  EXPECT_TRUE(decode_cp_async_stages(2, 128, 128, kDecodeCpAsyncStagesMinChunk, none));
  EXPECT_TRUE(decode_cp_async_stages(1, 128, 64, 31808, none));
  EXPECT_TRUE(decode_cp_async_stages(2, 16, 128, 256, none));  // no boxes across pages
  EXPECT_FALSE(
      decode_cp_async_stages(2, 128, 128, 32768, pins(kAutoLoader, DecodeStageCopy::kTmaBoxes)));
  EXPECT_TRUE(
      decode_cp_async_stages(2, 128, 128, 256, pins(kAutoLoader, DecodeStageCopy::kCpAsync)));
}

// The default tuning's wave model is the one the plan used before tuning was data (slots from
// the occupancy, 64 keys of overhead), and an override reaches it.
TEST(DecodeSchedule, DefaultTuningKeepsTheWaveModel) {
  const DecodeWaveModel m = decode_wave_model(DecodeTuning{}, 132, 3, 256);
  EXPECT_EQ(m.num_sms, 132);
  EXPECT_EQ(m.resident, 3);
  EXPECT_EQ(m.slots_override, 0);
  EXPECT_EQ(m.overhead, 64);
  EXPECT_EQ(m.min_chunk_tokens, 256);
  DecodeTuning t;
  t.slots = 2;
  t.overhead = 128;
  const DecodeWaveModel o = decode_wave_model(t, 132, 3, 256);
  EXPECT_EQ(o.slots_override, 2);
  EXPECT_EQ(o.overhead, 128);
  // Representative shapes: batch 1 over 32K keys at Llama-3.1-8B's 8 kv heads on an H200.
  EXPECT_EQ(decode_chunk({32768}, 1 + 132 * 4, 8, m), decode_chunk({32768}, 1 + 132 * 4, 8, [] {
              DecodeWaveModel w;
              w.num_sms = 132;
              w.resident = 3;
              return w;
            }()));
}

TEST(DecodeSchedule, WorkItemsNameRangesSlotsAndTheCopyMode) {
  // Request 0: 3000 keys split at 1024 (3 x 1024); request 1: 100 keys, whole; request 2: no
  // keys; request 3: a graph's padding of 5000 keys, whole although longer than the chunk.
  const std::vector<int64_t> len = {3000, 100, 0, 5000};
  const int32_t indptr[5] = {0, 24, 25, 25, 65};
  const DecodeWork w = decode_work_items(len, decode_first_keys(len, 0), indptr, 3, 1024, true);
  ASSERT_EQ(w.items.size(), size_t(6 * kDecodeWorkInts));
  EXPECT_EQ(w.num_partials, 3);
  auto item = [&](int i) {
    return std::vector<int32_t>(&w.items[i * kDecodeWorkInts], &w.items[i * kDecodeWorkInts + 8]);
  };
  EXPECT_EQ(item(0), (std::vector<int32_t>{0, 0, 1024, 0, 0, 0, 3, 1}));
  EXPECT_EQ(item(1), (std::vector<int32_t>{0, 1024, 2048, 1, 0, 0, 3, 1}));
  EXPECT_EQ(item(2), (std::vector<int32_t>{0, 2048, 3000, 2, 0, 0, 3, 1}));
  EXPECT_EQ(item(3), (std::vector<int32_t>{1, 0, 100, -1, 24, 3, 0, 1}));
  EXPECT_EQ(item(4), (std::vector<int32_t>{2, 0, 0, -1, 25, 3, 0, 1}));
  EXPECT_EQ(item(5), (std::vector<int32_t>{3, 0, 5000, -1, 25, 3, 0, 1}));
  const DecodeWork tma = decode_work_items({100}, {0}, indptr, 1, 1024, false);
  EXPECT_EQ(tma.items[7], 0);  // cp_async_stages
}

TEST(DecodeSchedule, SlidingWindowItemsStartAtTheWindowAndSkipEarlierTiles) {
  // Window 1000: request 0 (3000 keys) sees [2000, 3000): its splits cover [1984, 3000) (from
  // the multiple of 64 at or before 2000), the first item begins at 2000 exactly. Request 1 (700
  // keys) lies inside the window: [0, 700). Request 2 (1000 keys): exactly the window.
  const std::vector<int64_t> len = {3000, 700, 1000};
  const std::vector<int64_t> first = decode_first_keys(len, 1000);
  EXPECT_EQ(first, (std::vector<int64_t>{2000, 0, 0}));
  EXPECT_EQ(decode_spans(len, first), (std::vector<int64_t>{1016, 700, 1000}));
  EXPECT_EQ(decode_first_keys(len, 0), (std::vector<int64_t>{0, 0, 0}));
  const int32_t indptr[4] = {0, 188, 232, 295};
  const DecodeWork w = decode_work_items(len, first, indptr, 3, 512, false);
  auto item = [&](int i) {
    return std::vector<int32_t>(&w.items[i * kDecodeWorkInts], &w.items[i * kDecodeWorkInts + 8]);
  };
  ASSERT_EQ(w.items.size(), size_t(6 * kDecodeWorkInts));
  // 1016 keys at chunk 512: two splits of 512 from 1984.
  EXPECT_EQ(item(0), (std::vector<int32_t>{0, 2000, 2496, 0, 0, 0, 2, 0}));
  EXPECT_EQ(item(1), (std::vector<int32_t>{0, 2496, 3000, 1, 0, 0, 2, 0}));
  EXPECT_EQ(item(2), (std::vector<int32_t>{1, 0, 384, 2, 188, 2, 2, 0}));  // even splits
  EXPECT_EQ(item(3), (std::vector<int32_t>{1, 384, 700, 3, 188, 2, 2, 0}));
  EXPECT_EQ(item(4), (std::vector<int32_t>{2, 0, 512, 4, 232, 4, 2, 0}));
  EXPECT_EQ(item(5), (std::vector<int32_t>{2, 512, 1000, 5, 232, 4, 2, 0}));
}

TEST(DecodeSchedule, MalformedPageTablesAreClearErrors) {
  const int32_t indptr[3] = {0, 2, 5}, last[2] = {16, 1};
  EXPECT_EQ(decode_lengths(indptr, last, 2, 16), (std::vector<int64_t>{32, 33}));
  const int32_t empty[2] = {3, 3}, any[1] = {0};
  EXPECT_EQ(decode_lengths(empty, any, 1, 16), (std::vector<int64_t>{0}));  // no pages: 0 keys
  const int32_t decreasing[3] = {0, 4, 2};
  EXPECT_THROW(decode_lengths(decreasing, last, 2, 16), Error);
  const int32_t too_long[2] = {17, 1};
  EXPECT_THROW(decode_lengths(indptr, too_long, 2, 16), Error);
  const int32_t zero[2] = {0, 1};
  try {
    decode_lengths(indptr, zero, 2, 16);
    FAIL() << "a last page of 0 tokens was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("kv_last_page_len[0] = 0"), std::string::npos) << e.what();
  }
}

TEST(DecodeSchedule, QueryCountsComeFromQoIndptr) {
  EXPECT_EQ(decode_q_lens({}, 3), (std::vector<int32_t>{1, 1, 1}));
  const int32_t qo[5] = {0, 9, 10, 10, 26};
  EXPECT_EQ(decode_q_lens({qo, true}, 4), (std::vector<int32_t>{9, 1, 0, 16}));
  const int32_t too_many[2] = {0, kDecodeMaxQLen + 1};
  EXPECT_THROW(decode_q_lens({too_many, true}, 1), Error);
  const int32_t decreasing[3] = {0, 4, 2};
  EXPECT_THROW(decode_q_lens({decreasing, true}, 2), Error);
  const int32_t offset[2] = {1, 2};
  EXPECT_THROW(decode_q_lens({offset, true}, 1), Error);
}

TEST(DecodeSchedule, VerifyStepsWindowStartsAtTheFirstQuery) {
  // 9 queries over 3000 keys: the first query is key 2991's token, its window of 1000 starts at
  // 1992; without the causal rule every query sees [2000, 3000).
  const std::vector<int64_t> len = {3000, 5, 3000};
  EXPECT_EQ(decode_first_keys(len, 1000, {9, 9, 1}, true), (std::vector<int64_t>{1992, 0, 2000}));
  EXPECT_EQ(decode_first_keys(len, 1000, {9, 9, 1}, false), (std::vector<int64_t>{2000, 0, 2000}));
  EXPECT_EQ(decode_first_keys(len, 0, {9, 9, 1}, true), (std::vector<int64_t>{0, 0, 0}));
  // A request without queries is planned as one (its CTAs find no rows).
  EXPECT_EQ(decode_first_keys({3000}, 1000, {0}, true), (std::vector<int64_t>{2000}));
}

TEST(DecodeSchedule, WorkItemsNameTheQueryRows) {
  // Request 0: 9 queries at rows 0..8 over 3000 keys (split at 1024); request 1: one query at
  // row 9; request 2: 16 queries at rows 10..25, 64 keys.
  const std::vector<int64_t> len = {3000, 100, 64};
  const int32_t indptr[4] = {0, 24, 25, 26}, qo[4] = {0, 9, 10, 26};
  const DecodeQueries queries{qo, true};
  const std::vector<int32_t> q_len = decode_q_lens(queries, 3);
  const DecodeWork w = decode_work_items(len, decode_first_keys(len, 0, q_len, true), indptr, 3,
                                         1024, false, queries, q_len);
  ASSERT_EQ(w.items.size(), size_t(5 * kDecodeWorkInts));
  auto tail = [&](int i) {
    return std::vector<int32_t>(&w.items[i * kDecodeWorkInts + 8],
                                &w.items[(i + 1) * kDecodeWorkInts]);
  };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tail(i), (std::vector<int32_t>{0, 9, 3000, 1})) << i;
  EXPECT_EQ(tail(3), (std::vector<int32_t>{9, 1, 100, 1}));
  EXPECT_EQ(tail(4), (std::vector<int32_t>{10, 16, 64, 1}));
  // Without qo_indptr: row b, one query; the no-mask rule is named in the item.
  const DecodeWork plain = decode_work_items(len, decode_first_keys(len, 0), indptr, 3, 1 << 20,
                                             false, {nullptr, false});
  ASSERT_EQ(plain.items.size(), size_t(3 * kDecodeWorkInts));
  EXPECT_EQ(
      std::vector<int32_t>(&plain.items[kDecodeWorkInts + 8], &plain.items[2 * kDecodeWorkInts]),
      (std::vector<int32_t>{1, 1, 100, 0}));
}

TEST(DecodeSchedule, PartialSlotsStayWithinTheirBound) {
  // The workspace holds decode_max_partials(max_items, batch) partial slots: every chunk the
  // wave model picks under the item bound must fit, whatever the lengths.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + int(rng() % 40);
    std::vector<int64_t> len(batch);
    for (auto& x : len) x = rng() % 3 == 0 ? int64_t(rng() % 200) : int64_t(rng() % 200000);
    const int64_t ctas_per_item = int64_t(1) << (rng() % 7);  // 1 .. 64
    const int num_sms = 132;
    // max_work_items in decode.cu: the batch plus about 8 CTAs per SM of extra splits.
    const int64_t max_items = batch + (int64_t(num_sms) * 8 + ctas_per_item - 1) / ctas_per_item;
    DecodeWaveModel m;
    m.num_sms = num_sms;
    m.resident = 1 + int(rng() % 3);
    const int64_t chunk = decode_chunk(len, max_items, ctas_per_item, m);
    const DecodeWork w = decode_work_items(len, decode_first_keys(len, 0),
                                           zero_indptr(batch).data(), batch, chunk, false);
    ASSERT_LE(int64_t(w.items.size()) / kDecodeWorkInts, max_items);
    ASSERT_LE(w.num_partials, decode_max_partials(max_items, batch))
        << "batch " << batch << " ctas " << ctas_per_item << " chunk " << chunk;
  }
  EXPECT_EQ(decode_max_partials(10, 10), 0);  // no room for extra items: nothing is split
  EXPECT_EQ(decode_max_partials(12, 10), 4);
  EXPECT_EQ(decode_max_partials(30, 10), 30);
}

}  // namespace
}  // namespace longctx::kernels
