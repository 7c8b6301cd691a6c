// The CPU references of Quest's GPU kernels (kernels/cpu/quest_cpu.h) against the CPU engine's
// QuestPolicy (attention/sparse), which tests/attention/test_sparse_policy.cpp checks against brute
// force:
//   - quest_count (how many pages a sequence reads, the forced ranges) equals a direct count;
//   - metadata by quest_meta_update, then quest_select, give QuestPolicy's lists exactly, per KV
//     head and head-averaged, with pages equal to the blocks and with pages smaller than the
//     blocks (QuestPolicy run on the same keys re-blocked at the page size);
//   - quest_gather copies exactly the selected pages' rows from two memories;
//   - over an FP8 cache (codes + per-block scales) the metadata and the gather are those of the
//     dequantized keys (code x scale) in f32 and, exactly, in bf16; the touched pages of an FP8
//     step include a touched block's earlier pages;
//   - bad budgets and page sizes are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "attention/sparse/sparse_policy.h"
#include "kernels/cpu/quest_cpu.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using kernels::QuestBudget;
using kernels::QuestCount;

TEST(QuestReference, CountMatchesADirectCount) {
  for (int page : {1, 4, 16}) {
    for (int budget : {2, 17, 64, 100}) {
      for (int sink : {0, 3, 16}) {
        for (int window : {1, 5, 16}) {
          if (budget <= sink + window) continue;
          QuestBudget b{page, budget, sink, window};
          for (int kv = 1; kv < 300; kv += 7) {
            const QuestCount c = kernels::quest_count(kv, b);
            const int np = (kv + page - 1) / page;
            ASSERT_EQ(c.num_pages, np);
            const int budget_pages = std::max(1, budget / page);
            if (budget >= kv || budget_pages >= np) {
              EXPECT_TRUE(c.all);
              EXPECT_EQ(c.num_selected, np);
              continue;
            }
            int forced = 0;
            for (int j = 0; j < np; ++j) {
              const bool f = j * page < sink || (j + 1) * page > kv - window;
              forced += f;
              EXPECT_EQ(f, j < c.sink_pages || j >= c.window_first) << kv << " page " << j;
            }
            EXPECT_EQ(c.num_forced, forced);
            EXPECT_EQ(c.num_selected,
                      forced + std::min(np - forced, std::max(0, budget_pages - forced)));
            EXPECT_LE(c.num_selected, kernels::quest_max_selected(b));
          }
        }
      }
    }
  }
}

struct Geometry {
  int block_size, page, kv_len, hq, hkv, d;
  SparseOptions options;
};

// Random f32 keys of one sequence in a shuffled block table; per-page metadata via the reference
// kernel; the reference selection; QuestPolicy on the same keys blocked at the page size.
void check_select_matches_policy(const Geometry& g, std::mt19937& rng) {
  const int bs = g.block_size, page = g.page, ppb = bs / page, d = g.d, hkv = g.hkv;
  const int nb = (g.kv_len + bs - 1) / bs, num_blocks = nb + 2;
  const int64_t row = int64_t(hkv) * d;
  std::vector<float> pool(size_t(num_blocks) * bs * row);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (float& x : pool) x = n01(rng);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(ids.begin(), ids.begin() + nb);
  std::vector<float> q(size_t(g.hq) * d);
  for (float& x : q) x = n01(rng);

  // Metadata of every page the sequence holds, in random chunks as steps would touch them.
  std::vector<float> meta(size_t(num_blocks) * ppb * hkv * 2 * d, NAN);
  for (int t = 0; t < g.kv_len;) {
    const int n = std::min<int>(g.kv_len - t, 1 + rng() % 50);
    std::vector<int32_t> pages;
    for (int j = t / page; j <= (t + n - 1) / page; ++j) {
      const int rows = std::min(page, t + n - j * page);
      pages.insert(pages.end(), {table[j / ppb], table[j / ppb], j % ppb, rows});
    }
    kernels::QuestMetaParams m;
    m.k_cache = pool.data();
    m.block_stride = bs * row;
    m.meta = meta.data();
    m.pages = pages.data();
    m.num_pages = static_cast<int>(pages.size() / 4);
    m.num_kv_heads = hkv;
    m.head_dim = d;
    m.page_tokens = page;
    m.pages_per_block = ppb;
    m.dtype = DType::kF32;
    kernels::cpu::quest_meta_update(m);
    t += n;
  }

  QuestBudget b{page, int(g.options.budget_tokens), int(g.options.sink_tokens),
                int(g.options.window_tokens)};
  const int max_sel = kernels::quest_max_selected(b);
  std::vector<int32_t> indptr = {0, nb}, lens = {g.kv_len};
  std::vector<int32_t> selected(size_t(hkv) * max_sel, -1);
  kernels::QuestSelectParams s;
  s.q = q.data();
  s.meta = meta.data();
  s.block_indptr = indptr.data();
  s.block_tables = table.data();
  s.kv_lens = lens.data();
  s.selected = selected.data();
  s.batch = 1;
  s.num_qo_heads = g.hq;
  s.num_kv_heads = hkv;
  s.head_dim = d;
  s.pages_per_block = ppb;
  s.max_pages = (g.kv_len + page - 1) / page;
  s.max_selected = max_sel;
  s.budget = b;
  s.per_head = g.options.per_head;
  s.dtype = DType::kF32;
  kernels::cpu::quest_select(s);

  // The CPU engine's QuestPolicy over the same keys, blocks and pages: the same lists.
  sparse::KvShape shape{1, int64_t(num_blocks), bs, g.hq, hkv, d, 1.f / std::sqrt(float(d))};
  SparseOptions o = g.options;
  o.page_tokens = page;
  auto policy = sparse::make_sparse_policy(o, shape);
  const int np = (g.kv_len + page - 1) / page;
  std::vector<int64_t> slots(g.kv_len);
  for (int t = 0; t < g.kv_len; ++t) slots[t] = int64_t(table[t / bs]) * bs + t % bs;
  std::vector<float> keys(size_t(g.kv_len) * row);
  for (int t = 0; t < g.kv_len; ++t)
    std::copy_n(pool.data() + slots[t] * row, row, keys.data() + t * row);
  policy->on_keys_written(0, keys.data(), row, slots.data(), g.kv_len);
  const sparse::DecodeSelection want =
      policy->select_decode(0, q.data(), {table.data(), g.kv_len, pool.data()});
  if (!want.all()) EXPECT_EQ(want.page_tokens, page);
  const QuestCount c = kernels::quest_count(g.kv_len, b);
  for (int h = 0; h < hkv; ++h) {
    std::vector<int32_t> got(selected.begin() + h * max_sel,
                             selected.begin() + h * max_sel + c.num_selected);
    std::vector<int32_t> expect(np);
    std::iota(expect.begin(), expect.end(), 0);
    if (!want.all()) expect = want.per_kv_head[h];
    ASSERT_EQ(got, expect) << "kv_len " << g.kv_len << " block " << bs << " page " << page
                           << " head " << h << (g.options.per_head ? " per-head" : " averaged");
  }
}

TEST(QuestReference, SelectionEqualsTheCpuPolicy) {
  std::mt19937 rng(11);
  int cases = 0;
  for (int trial = 0; trial < 80; ++trial) {
    Geometry g;
    g.page = std::vector<int>{1, 2, 4, 16}[rng() % 4];
    g.block_size = g.page * std::vector<int>{1, 2, 8}[rng() % 3];
    g.kv_len = 1 + rng() % 700;
    g.hkv = 1 + rng() % 3;
    g.hq = g.hkv * (1 + rng() % 4);
    g.d = 1 + rng() % 40;
    g.options.policy = SparsePolicyKind::kQuest;
    g.options.sink_tokens = rng() % 20;
    g.options.window_tokens = 1 + rng() % 40;
    g.options.budget_tokens = g.options.sink_tokens + g.options.window_tokens + 1 + rng() % 200;
    g.options.per_head = rng() % 2;
    check_select_matches_policy(g, rng);
    ++cases;
  }
  EXPECT_EQ(cases, 80);
}

TEST(QuestReference, GatherCopiesTheSelectedPagesFromBothMemories) {
  std::mt19937 rng(5);
  const int bs = 8, page = 4, ppb = 2, hkv = 2, d = 3, nb = 5;
  const int64_t row = hkv * d;
  // Memory 0 holds blocks as [K, V] adjacent (the offload cache's layout), memory 1 separately.
  std::vector<float> m0(2 * nb * bs * row), k1(nb * bs * row), v1(nb * bs * row);
  for (auto* m : {&m0, &k1, &v1})
    for (float& x : *m) x = float(rng() % 1000);
  std::vector<int32_t> loc = {3, -2, 0, -5,
                              1};  // logical blocks: memory 0 block 3, memory 1 block 1, ...
  const int kv_len = 37;           // 10 pages
  QuestBudget b{page, 16, 4, 4};   // 4 pages: 1 sink, 2 window, 1 best-scored
  const QuestCount c = kernels::quest_count(kv_len, b);
  ASSERT_FALSE(c.all);
  const int max_sel = kernels::quest_max_selected(b);
  std::vector<int32_t> selected(hkv * max_sel);
  std::vector<int32_t> per_head[2] = {{0, 3, 8, 9}, {0, 5, 8, 9}};
  ASSERT_EQ(c.num_selected, 4);
  for (int h = 0; h < hkv; ++h)
    std::copy(per_head[h].begin(), per_head[h].end(), selected.begin() + h * max_sel);
  std::vector<int32_t> indptr = {0, 5}, lens = {kv_len};
  std::vector<float> ok(max_sel * page * row, -1.f), ov(max_sel * page * row, -1.f);
  kernels::QuestGatherParams g;
  g.k_base[0] = m0.data();
  g.v_base[0] = m0.data() + bs * row;
  g.block_stride[0] = 2 * bs * row;
  g.k_base[1] = k1.data();
  g.v_base[1] = v1.data();
  g.block_stride[1] = bs * row;
  g.block_indptr = indptr.data();
  g.block_loc = loc.data();
  g.kv_lens = lens.data();
  g.selected = selected.data();
  g.out_k = ok.data();
  g.out_v = ov.data();
  g.batch = 1;
  g.num_kv_heads = hkv;
  g.head_dim = d;
  g.pages_per_block = ppb;
  g.max_selected = max_sel;
  g.budget = b;
  g.dtype = DType::kF32;
  kernels::cpu::quest_gather(g);
  for (int h = 0; h < hkv; ++h)
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < page; ++r) {
        const int token = per_head[h][i] * page + r, l = loc[token / bs];
        const float* k =
            l >= 0 ? m0.data() + int64_t(l) * 2 * bs * row : k1.data() + int64_t(-l - 1) * bs * row;
        const float* v = l >= 0 ? k + bs * row : v1.data() + int64_t(-l - 1) * bs * row;
        for (int x = 0; x < d; ++x) {
          const int64_t at = (int64_t(i) * page + r) * row + h * d + x;
          const int64_t src = int64_t(token % bs) * row + h * d + x;
          ASSERT_EQ(ok[at], k[src]) << h << " " << i << " " << r;
          ASSERT_EQ(ov[at], v[src]);
        }
      }
}

// Random FP8 codes (no NaN) and power-of-two scales per (block, KV head): the metadata and the
// gather over them equal those over the dequantized f32 keys, in f32 and (exact) in bf16.
TEST(QuestReference, Fp8MetadataAndGatherAreThoseOfTheDequantizedKeys) {
  std::mt19937 rng(11);
  const int bs = 8, page = 4, ppb = 2, hkv = 2, d = 5, nb = 5;
  const int64_t row = hkv * d, blk = bs * row;
  auto code = [&] {
    uint8_t c;
    do c = static_cast<uint8_t>(rng());
    while ((c & 0x7f) == 0x7f);
    return c;
  };
  // Memory 0: blocks of [K, V] adjacent with scales [K, V][Hkv] per block (the offload cache's
  // layouts); memory 1: K and V pools apart, scales [blocks][Hkv] each (the resident pool's).
  std::vector<uint8_t> m0(2 * nb * blk), k1(nb * blk), v1(nb * blk);
  std::vector<float> s0(2 * nb * hkv), ks1(nb * hkv), vs1(nb * hkv);
  for (auto* m : {&m0, &k1, &v1})
    for (uint8_t& c : *m) c = code();
  for (auto* s : {&s0, &ks1, &vs1})
    for (float& x : *s) x = std::ldexp(1.f, static_cast<int>(rng() % 24) - 12);
  // The dequantized copies, in the same layouts.
  auto dq = [&](const std::vector<uint8_t>& codes, const float* scales, int64_t block_elems,
                int64_t scale_stride) {
    std::vector<float> out(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      const int64_t b = int64_t(i) / block_elems, h = int64_t(i) % row / d;
      const int64_t half = int64_t(i) % block_elems / blk;  // memory 0: K or V of the block
      out[i] = fp8e4m3_to_f32(codes[i]) * scales[b * scale_stride + half * hkv + h];
    }
    return out;
  };
  const std::vector<float> f0 = dq(m0, s0.data(), 2 * blk, 2 * hkv),
                           fk1 = dq(k1, ks1.data(), blk, hkv), fv1 = dq(v1, vs1.data(), blk, hkv);

  // Metadata of memory 0's keys: pages with partial rows, one block's earlier page whole.
  const std::vector<int32_t> pages = {3, 0, 1, 3, 1, 4, 0, 4, 1, 4, 1, 1};
  for (DType meta_dtype : {DType::kF32, DType::kBF16}) {
    const size_t n = size_t(nb) * ppb * hkv * 2 * d, es = dtype_size(meta_dtype);
    std::vector<uint8_t> want(n * es, 0xAB), got(n * es, 0xAB);
    kernels::QuestMetaParams m;
    m.block_stride = 2 * blk;
    m.pages = pages.data();
    m.num_pages = static_cast<int>(pages.size() / 4);
    m.num_kv_heads = hkv;
    m.head_dim = d;
    m.page_tokens = page;
    m.pages_per_block = ppb;
    m.dtype = meta_dtype;
    if (meta_dtype == DType::kF32) {
      m.k_cache = f0.data();
      m.meta = want.data();
      kernels::cpu::quest_meta_update(m);
    } else {  // the f32 metadata rounded to bf16 (exact: E4M3 values times powers of two)
      std::vector<float> f32(n, NAN);  // NaN: untouched (no code is NaN)
      m.k_cache = f0.data();
      m.meta = f32.data();
      m.dtype = DType::kF32;
      kernels::cpu::quest_meta_update(m);
      m.dtype = meta_dtype;
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(f32[i])) continue;  // pages the list does not name stay untouched
        const uint16_t b = f32_to_bf16(f32[i]);
        EXPECT_EQ(bf16_to_f32(b), f32[i]) << "inexact in bf16";
        std::memcpy(want.data() + i * 2, &b, 2);
      }
    }
    m.k_cache = m0.data();
    m.meta = got.data();
    m.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    m.k_scale = s0.data();
    m.scale_block_stride = 2 * hkv;
    kernels::cpu::quest_meta_update(m);
    EXPECT_EQ(got, want) << dtype_name(meta_dtype);
  }

  // The gather from both memories: the dequantized pages.
  const std::vector<int32_t> loc = {3, -2, 0, -5, 1};
  const int kv_len = 37;
  QuestBudget b{page, 16, 4, 4};
  const int max_sel = kernels::quest_max_selected(b);
  std::vector<int32_t> selected(hkv * max_sel, 0);
  const std::vector<int32_t> per_head[2] = {{0, 3, 8, 9}, {0, 5, 8, 9}};
  for (int h = 0; h < hkv; ++h)
    std::copy(per_head[h].begin(), per_head[h].end(), selected.begin() + h * max_sel);
  const std::vector<int32_t> indptr = {0, 5}, lens = {kv_len};
  const size_t out = size_t(max_sel) * page * row;
  std::vector<float> want_k(out, -1.f), want_v(out, -1.f), got_k(out, -1.f), got_v(out, -1.f);
  kernels::QuestGatherParams g;
  g.block_indptr = indptr.data();
  g.block_loc = loc.data();
  g.kv_lens = lens.data();
  g.selected = selected.data();
  g.batch = 1;
  g.num_kv_heads = hkv;
  g.head_dim = d;
  g.pages_per_block = ppb;
  g.max_selected = max_sel;
  g.budget = b;
  g.dtype = DType::kF32;
  g.k_base[0] = f0.data();
  g.v_base[0] = f0.data() + blk;
  g.block_stride[0] = 2 * blk;
  g.k_base[1] = fk1.data();
  g.v_base[1] = fv1.data();
  g.block_stride[1] = blk;
  g.out_k = want_k.data();
  g.out_v = want_v.data();
  kernels::cpu::quest_gather(g);
  g.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  g.k_base[0] = m0.data();
  g.v_base[0] = m0.data() + blk;
  g.k_scale[0] = s0.data();
  g.v_scale[0] = s0.data() + hkv;
  g.scale_block_stride[0] = 2 * hkv;
  g.k_base[1] = k1.data();
  g.v_base[1] = v1.data();
  g.k_scale[1] = ks1.data();
  g.v_scale[1] = vs1.data();
  g.scale_block_stride[1] = hkv;
  g.out_k = got_k.data();
  g.out_v = got_v.data();
  kernels::cpu::quest_gather(g);
  EXPECT_EQ(got_k, want_k);
  EXPECT_EQ(got_v, want_v);
}

// An FP8 step's touched pages: a row that may raise its block's scale re-encodes the block's
// earlier rows, so every earlier page of a touched block is recomputed, whole.
TEST(QuestReference, Fp8TouchedPagesIncludeTheBlocksEarlierPages) {
  // Blocks of 16, pages of 4: block 2's offsets 9 and 10, block 0's offset 0; padding (-1).
  const std::vector<int64_t> meta = {2 * 16 + 9, 2 * 16 + 10, 0, -1},
                             cache = {5 * 16 + 9, 5 * 16 + 10, 7 * 16, -1};
  EXPECT_EQ(kernels::cpu::quest_touched_pages(meta, cache, 16, 4),
            (std::vector<int32_t>{5, 2, 2, 3, 7, 0, 0, 1}));
  EXPECT_EQ(kernels::cpu::quest_touched_pages(meta, cache, 16, 4, /*block_prefix=*/true),
            (std::vector<int32_t>{5, 2, 0, 4, 5, 2, 1, 4, 5, 2, 2, 3, 7, 0, 0, 1}));
}

// A graph-shaped decode step (CUDA graphs, attention/backends/quest_cuda.h): its touched pages
// padded to batch x touched-per-token entries with fillers give the metadata the touched pages
// alone give (fillers write nothing: every other byte keeps its NaN), and a step that touched
// more than that is refused.
TEST(QuestReference, FixedPageCountsWriteTheSameMetadata) {
  const int bs = 16, page = 4, ppb = bs / page, hkv = 2, d = 8, num_blocks = 6;
  const int64_t row = hkv * d;
  std::mt19937 rng(9);
  std::normal_distribution<float> n01(0.f, 1.f);
  std::vector<float> pool(size_t(num_blocks) * bs * row);
  for (float& x : pool) x = n01(rng);
  // Three decoding tokens (blocks 1, 4, 5 at offsets 9, 2, 15), FP8's whole-block prefix too.
  const std::vector<int64_t> slots = {1 * bs + 9, 4 * bs + 2, 5 * bs + 15};
  for (bool prefix : {false, true}) {
    const std::vector<int32_t> pages =
        kernels::cpu::quest_touched_pages(slots, slots, bs, page, prefix);
    const int64_t per_token = prefix ? ppb : 1;
    const std::vector<int32_t> fixed = kernels::cpu::quest_fixed_pages(pages, 3, per_token);
    ASSERT_EQ(fixed.size(), size_t(4 * 3 * per_token));
    EXPECT_TRUE(std::equal(pages.begin(), pages.end(), fixed.begin()));
    auto meta_of = [&](const std::vector<int32_t>& list) {
      std::vector<float> meta(size_t(num_blocks) * ppb * hkv * 2 * d, NAN);
      kernels::QuestMetaParams m;
      m.k_cache = pool.data();
      m.block_stride = bs * row;
      m.meta = meta.data();
      m.pages = list.data();
      m.num_pages = static_cast<int>(list.size() / 4);
      m.num_kv_heads = hkv;
      m.head_dim = d;
      m.page_tokens = page;
      m.pages_per_block = ppb;
      m.dtype = DType::kF32;
      kernels::cpu::quest_meta_update(m);
      return meta;
    };
    const std::vector<float> a = meta_of(pages), b = meta_of(fixed);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << prefix;
    // Block 0 (a filler's {0, 0, 0, 0} names it) is untouched.
    for (int64_t i = 0; i < int64_t(ppb) * hkv * 2 * d; ++i) ASSERT_TRUE(std::isnan(b[i])) << i;
    EXPECT_THROW(kernels::cpu::quest_fixed_pages(pages, 2, 1), Error);
  }
}

// The decode step's arrays sit at offsets that depend on the maxima alone: aligned, in order,
// each region wide enough for its maximum, and nothing overlaps.
TEST(QuestReference, DecodeLayoutHoldsEveryArrayAtFixedOffsets) {
  for (int64_t seqs : {1, 3, 32}) {
    const int64_t entries = seqs * 1025, touched = seqs * 8;
    const kernels::cpu::QuestDecodeLayout l =
        kernels::cpu::quest_decode_layout(seqs, entries, touched);
    const std::vector<std::pair<int64_t, int64_t>> regions = {
        {l.lens, seqs},     {l.indptr, seqs + 1}, {l.dec_indptr, seqs + 1}, {l.dec_indices, seqs},
        {l.dec_last, seqs}, {l.qo, seqs + 1},     {l.pages, 4 * touched},   {l.tables, entries},
        {l.loc, entries},   {l.reuse_read, seqs}, {l.reuse_write, seqs}};
    int64_t end = 0;
    for (const auto& [at, words] : regions) {
      EXPECT_EQ(at % 4, 0) << at;
      EXPECT_GE(at, end);
      end = at + words;
    }
    EXPECT_GE(l.total, end);
    EXPECT_LT(l.total, end + 4);
    const kernels::cpu::QuestDecodeLayout again =
        kernels::cpu::quest_decode_layout(seqs, entries, touched);
    EXPECT_EQ(again.tables, l.tables);
    EXPECT_EQ(again.loc, l.loc);
  }
  EXPECT_THROW(kernels::cpu::quest_decode_layout(0, 1, 1), Error);
  EXPECT_THROW(kernels::cpu::quest_decode_layout(4, 2, 4), Error);
}

TEST(QuestReference, BadBudgetsAndPagesAreClearErrors) {
  auto msg = [](const QuestBudget& b, int bs) {
    try {
      kernels::cpu::check_quest_budget(b, bs);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({16, 4096, 64, 256}, 24).find("--sparse-page 16 must be positive and divide"),
            std::string::npos);
  EXPECT_NE(msg({0, 4096, 64, 256}, 16).find("--sparse-page 0"), std::string::npos);
  EXPECT_NE(msg({16, 300, 64, 256}, 128).find("--sparse-budget 300 must be more than"),
            std::string::npos);
  EXPECT_EQ(msg({16, 4096, 64, 256}, 128), "");
}

// Page reuse's slots on the GPU: the first `slots` real sequences of a decode step keep pages; a
// sequence that kept pages in the previous decode step reads and writes its slot, a new one
// writes a free slot; leaving the batch, falling past the first ones or a step that is not a
// decode step drops them.
TEST(QuestReference, ReuseSlotsFollowTheSequencesOfConsecutiveDecodeSteps) {
  kernels::cpu::QuestReuseSlots slots(2);
  std::vector<int32_t> read, write;
  auto step = [&](std::vector<uint64_t> ids, int64_t padding = 0) {
    slots.decode_step(ids, static_cast<int64_t>(ids.size()), padding, read, write);
  };
  step({7, 8, 9});
  EXPECT_EQ(read, (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(write, (std::vector<int32_t>{0, 1, -1}));
  step({8, 9, 7});  // 8 keeps slot 1, 9 takes the free slot 0, 7 (third) keeps nothing
  EXPECT_EQ(read, (std::vector<int32_t>{1, -1, -1}));
  EXPECT_EQ(write, (std::vector<int32_t>{1, 0, -1}));
  step({9, 7, 8});  // 8 (third) dropped its pages; 7 writes anew
  EXPECT_EQ(read, (std::vector<int32_t>{0, -1, -1}));
  EXPECT_EQ(write, (std::vector<int32_t>{0, 1, -1}));
  step({9, 8, 7});
  EXPECT_EQ(read, (std::vector<int32_t>{0, -1, -1}));
  EXPECT_EQ(write, (std::vector<int32_t>{0, 1, -1}));
  step({8}, 0);  // 9 left the batch
  EXPECT_EQ(read, (std::vector<int32_t>{1}));
  EXPECT_EQ(write, (std::vector<int32_t>{1}));
  slots.other_step();  // a prefill step
  step({8, 0, 0}, 2);  // padding keeps nothing
  EXPECT_EQ(read, (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(write, (std::vector<int32_t>{0, -1, -1}));
  slots.decode_step({}, 2, 0, read, write);  // a batch without ids keeps nothing
  EXPECT_EQ(write, (std::vector<int32_t>{-1, -1}));
  step({8});
  EXPECT_EQ(read, (std::vector<int32_t>{-1}));
  kernels::cpu::QuestReuseSlots none(0);
  none.decode_step(std::vector<uint64_t>{1, 2}, 2, 0, read, write);
  EXPECT_EQ(write, (std::vector<int32_t>{-1, -1}));
}

}  // namespace
}  // namespace longctx
