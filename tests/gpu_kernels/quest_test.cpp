// Quest's CUDA kernels (kernels/cuda/quest.h) against their CPU references (kernels/cpu/
// quest_cpu.h), whose selection tests/kv/test_quest_reference.cpp checks against the CPU
// engine's policy:
//   - metadata: byte-equal (the min / max are the keys' own bf16 values), pages with partial
//     rows, the offload cache's [K, V]-adjacent layout; untouched metadata stays as it was;
//   - selection: with integer-valued q and keys every score is exact in fp32 whatever the
//     summation order, so the lists must be equal (ties are common: the earlier page wins), per
//     KV head and head-averaged, batches of sequences from 1 key to 700K (past what the select
//     kernel stages in shared memory); with Gaussian data the
//     lists must be a top-k of the CPU scores up to 1e-4 relative; the edges of the select
//     kernel (SelectionEqualsTheReferenceAtTheEdges): one / all but one / no free page, all
//     scores equal, long runs of equal scores, 1M keys, NaN / Inf queries, repeated runs;
//   - gather: byte-equal, one source on the device and one in pinned host memory read in place;
//   - page reuse: the gather's copies from kept slots and the keep kernel byte-equal over two
//     decode steps, and equal to a gather without reuse;
//   - FP8 caches (codes + power-of-two scales per block and KV head): the metadata and the
//     gather (dequantized into bf16, exact) byte-equal to the references, the gather's 16-code
//     loads (head_dim 128) and its one-code path (head_dim 40), device and pinned host sources.
// Every output lives in a guarded buffer; the guards must survive.
#include "kernels/cuda/quest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/quest_cpu.h"
#include "longctx/core/cuda_check.h"

namespace longctx::gpu_test {
namespace {

using kernels::QuestBudget;
using kernels::QuestCount;

struct Shape {
  int block_size = 128, page = 16, hq = 32, hkv = 8, d = 128;
  std::vector<int> kv_lens = {5000};
  QuestBudget budget{16, 1024, 64, 256};
  bool per_head = true;
  bool integer = true;  // integer-valued keys and queries
  int value_range = 4;  // integers in [-value_range, value_range]
  // > 0: every key of page j is ((j / run_pages) % 3 + 1) in each dim, so the scores come in runs
  // of run_pages equal values (long ties around the threshold; integer queries).
  int run_pages = 0;
  enum class Query { kRandom, kZero, kNaN, kInf } query = Query::kRandom;
  int repeats = 1;  // selections on the same buffers (scratch scores poisoned between them)
  uint64_t seed = 1;
};

uint16_t bf16(float x) { return f32_to_bf16(x); }

// Keys of every sequence in one pool (shuffled blocks), their metadata computed on the CPU and
// on the GPU, then the selection on both.
void run_select_case(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "hq " << s.hq << " hkv " << s.hkv << " d " << s.d << " page " << s.page
               << " budget " << s.budget.budget_tokens << (s.per_head ? " per-head" : " averaged")
               << (s.integer ? " integer" : " gaussian") << " range " << s.value_range << " runs "
               << s.run_pages << " query " << static_cast<int>(s.query) << " lens "
               << ::testing::PrintToString(s.kv_lens));
  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  const int bs = s.block_size, ppb = bs / s.page, batch = static_cast<int>(s.kv_lens.size());
  const int64_t row = int64_t(s.hkv) * s.d;
  std::vector<int32_t> indptr = {0}, table, lens = s.kv_lens;
  int total_blocks = 0;
  for (int kv : s.kv_lens) {
    total_blocks += (kv + bs - 1) / bs;
    indptr.push_back(total_blocks);
  }
  const int num_blocks = total_blocks + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  table.assign(ids.begin(), ids.begin() + total_blocks);

  std::normal_distribution<float> n01(0.f, 1.f);
  const int span = 2 * s.value_range + 1;
  auto value = [&] { return s.integer ? float(int(rng() % span) - s.value_range) : n01(rng); };
  std::vector<uint16_t> keys(size_t(num_blocks) * bs * row), q(size_t(batch) * s.hq * s.d);
  for (auto& x : keys) x = bf16(value());
  for (auto& x : q) x = bf16(value());
  if (s.run_pages > 0)  // logical page j of every sequence: keys ((j / run_pages) % 3 + 1)
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < lens[b]; ++t) {
        const int64_t at = (int64_t(table[indptr[b] + t / bs]) * bs + t % bs) * row;
        const float v = float((t / s.page / s.run_pages) % 3 + 1);
        std::fill(keys.begin() + at, keys.begin() + at + row, bf16(v));
      }
  // Special queries: all zero (every score 0: all tie), or one NaN / Inf element per q head
  // (the lists are only checked to be well formed: the reference's sort has no order then).
  const bool exact =
      s.integer && (s.query == Shape::Query::kRandom || s.query == Shape::Query::kZero);
  for (size_t i = 0; i < q.size(); ++i)
    if (s.query == Shape::Query::kZero)
      q[i] = bf16(0.f);
    else if (i % s.d == 3 && s.query != Shape::Query::kRandom)
      q[i] = bf16(s.query == Shape::Query::kNaN ? NAN : (i / s.d) % 2 ? INFINITY : -INFINITY);

  // Every page of every sequence, whole or partial.
  std::vector<int32_t> pages;
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j * s.page < lens[b]; ++j)
      pages.insert(pages.end(), {table[indptr[b] + j / ppb], table[indptr[b] + j / ppb], j % ppb,
                                 std::min(s.page, lens[b] - j * s.page)});
  const size_t meta_bytes = size_t(num_blocks) * ppb * row * 2 * 2;
  std::vector<uint16_t> meta_ref(meta_bytes / 2, 0x7fc0);  // NaN: pages never written stay so
  kernels::QuestMetaParams m;
  m.block_stride = bs * row;
  m.num_pages = static_cast<int>(pages.size() / 4);
  m.num_kv_heads = s.hkv;
  m.head_dim = s.d;
  m.page_tokens = s.page;
  m.pages_per_block = ppb;
  m.dtype = DType::kBF16;
  m.k_cache = keys.data();
  m.meta = meta_ref.data();
  m.pages = pages.data();
  kernels::cpu::quest_meta_update(m);

  GuardedBuffer d_keys(keys.size() * 2), d_pages(pages.size() * 4), d_meta(meta_bytes, 0);
  d_keys.upload(keys.data());
  d_pages.upload(pages.data());
  std::vector<uint16_t> nan_meta(meta_bytes / 2, 0x7fc0);
  d_meta.upload(nan_meta.data());
  m.k_cache = d_keys.data();
  m.meta = d_meta.data();
  m.pages = static_cast<const int32_t*>(d_pages.data());
  kernels::cuda::quest_meta_run(m, nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_EQ(d_meta.download<uint16_t>(), meta_ref) << "metadata";
  ASSERT_TRUE(d_meta.guards_intact());

  int max_pages = 0;
  for (int kv : lens) max_pages = std::max(max_pages, (kv + s.page - 1) / s.page);
  const int max_sel = std::min(kernels::quest_max_selected(s.budget), max_pages);
  kernels::QuestSelectParams p;
  p.batch = batch;
  p.num_qo_heads = s.hq;
  p.num_kv_heads = s.hkv;
  p.head_dim = s.d;
  p.pages_per_block = ppb;
  p.max_pages = max_pages;
  p.max_selected = max_sel;
  p.budget = s.budget;
  p.per_head = s.per_head;
  p.dtype = DType::kBF16;
  std::vector<int32_t> sel_ref(size_t(batch) * s.hkv * max_sel, -1);
  p.q = q.data();
  p.meta = meta_ref.data();
  p.block_indptr = indptr.data();
  p.block_tables = table.data();
  p.kv_lens = lens.data();
  p.selected = sel_ref.data();
  kernels::cpu::quest_select(p);

  GuardedBuffer d_q(q.size() * 2), d_indptr(indptr.size() * 4), d_table(table.size() * 4 + 4),
      d_lens(lens.size() * 4), d_scores(size_t(batch) * s.hkv * max_pages * 4),
      d_sel(sel_ref.size() * 4);
  d_q.upload(q.data());
  d_indptr.upload(indptr.data());
  LONGCTX_CUDA_CHECK(
      cudaMemcpy(d_table.data(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  d_lens.upload(lens.data());
  std::vector<int32_t> minus(sel_ref.size(), -1);
  p.q = d_q.data();
  p.meta = d_meta.data();
  p.block_indptr = static_cast<const int32_t*>(d_indptr.data());
  p.block_tables = static_cast<const int32_t*>(d_table.data());
  p.kv_lens = static_cast<const int32_t*>(d_lens.data());
  p.scores = static_cast<float*>(d_scores.data());
  p.selected = static_cast<int32_t*>(d_sel.data());
  std::vector<int32_t> got;
  for (int rep = 0; rep < s.repeats; ++rep) {
    d_sel.upload(minus.data());
    LONGCTX_CUDA_CHECK(
        cudaMemset(d_scores.data(), rep % 2 ? 0xff : 0x7f, size_t(batch) * s.hkv * max_pages * 4));
    kernels::cuda::quest_select_run(p, nullptr);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> again = d_sel.download<int32_t>();
    ASSERT_TRUE(d_sel.guards_intact() && d_scores.guards_intact());
    if (rep > 0) ASSERT_EQ(again, got) << "selection " << rep << " on the same buffers";
    got = again;
  }
  p.q = q.data();  // back to host pointers for the scores
  p.meta = meta_ref.data();
  p.block_indptr = indptr.data();
  p.block_tables = table.data();
  p.kv_lens = lens.data();
  int64_t differing = 0;
  for (int b = 0; b < batch; ++b) {
    const QuestCount c = kernels::quest_count(lens[b], s.budget);
    for (int h = 0; h < s.hkv; ++h) {
      const size_t at = (size_t(b) * s.hkv + h) * max_sel;
      std::vector<int32_t> g(got.begin() + at, got.begin() + at + c.num_selected);
      std::vector<int32_t> r(sel_ref.begin() + at, sel_ref.begin() + at + c.num_selected);
      ASSERT_TRUE(std::is_sorted(g.begin(), g.end()) &&
                  std::adjacent_find(g.begin(), g.end()) == g.end())
          << "sequence " << b << " head " << h << ": not ascending";
      for (int i = c.num_selected; i < max_sel; ++i)
        ASSERT_EQ(got[at + i], -1) << "wrote past its " << c.num_selected << " pages";
      ASSERT_TRUE(g.empty() || (g.front() >= 0 && g.back() < c.num_pages));
      if (!c.all) {  // the sink and window pages, whatever the scores
        for (int j = 0; j < c.sink_pages; ++j) ASSERT_EQ(g[j], j);
        for (int j = std::max(c.window_first, c.sink_pages); j < c.num_pages; ++j)
          ASSERT_EQ(g[c.num_selected - (c.num_pages - j)], j) << "window page " << j;
      }
      if (!exact && s.integer) continue;  // NaN / Inf queries: well formed is all
      if (s.integer) {
        ASSERT_EQ(g, r) << "sequence " << b << " (" << lens[b] << " keys) head " << h;
        continue;
      }
      if (g == r) continue;
      ++differing;
      // A top-k of the CPU scores up to rounding: no unchosen candidate beats a chosen one.
      std::vector<bool> chosen(c.num_pages, false);
      for (int j : g) chosen[j] = true;
      float worst_chosen = INFINITY, best_left = -INFINITY;
      for (int j = c.sink_pages; j < c.window_first; ++j) {
        const float sc = kernels::cpu::quest_page_score(p, b, h, j);
        if (chosen[j])
          worst_chosen = std::min(worst_chosen, sc);
        else
          best_left = std::max(best_left, sc);
      }
      EXPECT_GE(worst_chosen, best_left - 1e-4f * (1.f + std::fabs(best_left)))
          << "sequence " << b << " head " << h;
    }
  }
  if (!s.integer)
    std::printf("  gaussian case: %lld of %d lists differ (near ties)\n",
                static_cast<long long>(differing), batch * s.hkv);
}

TEST(QuestKernels, SelectionEqualsTheReference) {
  std::vector<Shape> shapes;
  {
    Shape s;  // Llama-3.1-8B heads, a batch from one key to 40K
    s.kv_lens = {1, 17, 300, 1025, 4096, 4097, 9000, 40000, 130000};
    shapes.push_back(s);
    s.per_head = false;
    shapes.push_back(s);
  }
  {
    Shape s;  // the needle model's heads, pages of 8 in blocks of 64
    s.hq = 4, s.hkv = 2, s.d = 64, s.block_size = 64, s.page = 8;
    s.budget = {8, 500, 16, 64};
    s.kv_lens = {70, 600, 3333, 12000};
    shapes.push_back(s);
    s.per_head = false;
    shapes.push_back(s);
  }
  {
    Shape s;  // odd heads: head_dim 40 and 256, MHA, page = block
    s.hq = 3, s.hkv = 3, s.d = 40, s.block_size = 16, s.page = 16;
    s.budget = {16, 200, 0, 1};
    s.kv_lens = {5, 999, 2049};
    shapes.push_back(s);
    s.hq = 16, s.hkv = 2, s.d = 256, s.block_size = 32, s.page = 4;
    s.budget = {4, 97, 5, 7};
    shapes.push_back(s);
  }
  {
    Shape s;  // more pages than the select kernel stages in shared memory (it reads L2 then)
    s.hq = 4, s.hkv = 1, s.d = 32, s.block_size = 128, s.page = 16;
    s.budget = {16, 4096, 64, 256};
    s.kv_lens = {700000, 2000};
    shapes.push_back(s);
  }
  for (Shape s : shapes) {
    run_select_case(s);
    s.integer = false;
    s.seed = 7;
    run_select_case(s);
  }
}

// The budget that leaves `free_pages` candidates to pick at kv_len keys.
QuestBudget budget_for_free(QuestBudget b, int kv_len, int free_pages) {
  b.budget_tokens = kv_len;  // pages the window and sink force, whatever the budget
  QuestCount c = kernels::quest_count(kv_len, {b.page_tokens, 1, b.sink_tokens, b.window_tokens});
  b.budget_tokens = (c.num_forced + free_pages) * b.page_tokens;
  c = kernels::quest_count(kv_len, b);
  EXPECT_EQ(c.num_free, free_pages);
  EXPECT_FALSE(c.all);
  return b;
}

// The cases the select kernel's histogram narrowing and ranking make risky, each per KV head and
// head-averaged and run three times on the same buffers: every candidate but one, or one, picked;
// none (only the sink and window); every score equal (a zero query); scores in long runs of equal
// values (the threshold inside a run, across the ranges the histograms narrow to); integers spread
// so that the threshold's bin is small but has ties; a batch of 8 lengths; 1,048,656 keys (65,541
// pages, read from global memory on every pass); a NaN or an Inf in each q head (the kernel must
// end and write well-formed lists: the NaN dims count 0 in a bound, an Inf makes bounds +-Inf or
// NaN, and NaN scores are the largest keys).
TEST(QuestKernels, SelectionEqualsTheReferenceAtTheEdges) {
  std::vector<Shape> shapes;
  const QuestBudget base{16, 4096, 64, 256};
  for (int free_pages : {1, 8104, 0}) {  // 130,000 keys: 8,105 candidates
    Shape s;
    s.kv_lens = {130000};
    s.budget = budget_for_free(base, 130000, free_pages);
    shapes.push_back(s);
  }
  {
    Shape s;
    s.budget = base;
    s.kv_lens = {4097, 130000};
    s.query = Shape::Query::kZero;
    shapes.push_back(s);
    s.query = Shape::Query::kRandom;
    for (int run : {50, 7, 1000}) {
      s.run_pages = run;
      shapes.push_back(s);
    }
    s.run_pages = 0;
    s.value_range = 60;
    shapes.push_back(s);
    s.value_range = 4;
    s.kv_lens = {130000, 1, 65000, 4097, 129999, 300, 100000, 8200};
    shapes.push_back(s);
    s.kv_lens = {130000, 5000};
    s.query = Shape::Query::kNaN;
    shapes.push_back(s);
    s.query = Shape::Query::kInf;
    shapes.push_back(s);
  }
  {
    Shape s;  // 1M keys, one KV head of 32 dims (the reference's time)
    s.hq = 4, s.hkv = 1, s.d = 32;
    s.budget = base;
    s.kv_lens = {1048656, 3000};
    shapes.push_back(s);
    s.run_pages = 300;
    shapes.push_back(s);
  }
  for (Shape s : shapes) {
    s.repeats = 3;
    for (bool per_head : {true, false}) {
      s.per_head = per_head;
      run_select_case(s);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(QuestKernels, GatherReadsDeviceAndPinnedHostPages) {
  std::mt19937 rng(3);
  const int bs = 64, page = 16, ppb = 4, hkv = 8, d = 128, nb_dev = 6, nb_host = 9;
  const int64_t row = int64_t(hkv) * d, blk = int64_t(bs) * row;
  // Memory 0 (device): blocks of [K, V] adjacent; memory 1 (pinned host): K and V pools apart.
  std::vector<uint16_t> m0(2 * nb_dev * blk), k1(nb_host * blk), v1(nb_host * blk);
  for (auto* m : {&m0, &k1, &v1})
    for (auto& x : *m) x = static_cast<uint16_t>(rng());
  GuardedBuffer d_m0(m0.size() * 2);
  d_m0.upload(m0.data());
  void* host = nullptr;
  LONGCTX_CUDA_CHECK(cudaMallocHost(&host, 2 * k1.size() * 2));
  std::memcpy(host, k1.data(), k1.size() * 2);
  std::memcpy(static_cast<uint16_t*>(host) + k1.size(), v1.data(), v1.size() * 2);
  void* host_dev = nullptr;
  LONGCTX_CUDA_CHECK(cudaHostGetDevicePointer(&host_dev, host, 0));

  // Two sequences over both memories.
  const std::vector<int32_t> lens = {600, 333}, indptr = {0, 10, 16};
  std::vector<int32_t> loc = {2, -1, -4, 0, -9, 5, -2, 1, -3, 3, -8, 4, -5, -6, -7, 2};
  QuestBudget b{page, 200, 20, 40};
  const int max_sel = kernels::quest_max_selected(b);
  std::vector<int32_t> selected(2 * hkv * max_sel, -1);
  for (int s = 0; s < 2; ++s) {
    const QuestCount c = kernels::quest_count(lens[s], b);
    for (int h = 0; h < hkv; ++h) {
      std::vector<int32_t> pages(c.num_pages);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      pages.resize(c.num_selected);
      std::sort(pages.begin(), pages.end());
      std::copy(pages.begin(), pages.end(), selected.begin() + (s * hkv + h) * max_sel);
    }
  }
  kernels::QuestGatherParams g;
  g.block_stride[0] = 2 * blk;
  g.block_stride[1] = blk;
  g.batch = 2;
  g.num_kv_heads = hkv;
  g.head_dim = d;
  g.pages_per_block = ppb;
  g.max_selected = max_sel;
  g.budget = b;
  g.dtype = DType::kBF16;
  const size_t out_elems = size_t(2) * max_sel * page * row;
  std::vector<uint16_t> ref_k(out_elems, 0xAAAA), ref_v(out_elems, 0xAAAA);
  g.k_base[0] = m0.data();
  g.v_base[0] = m0.data() + blk;
  g.k_base[1] = k1.data();
  g.v_base[1] = v1.data();
  g.block_indptr = indptr.data();
  g.block_loc = loc.data();
  g.kv_lens = lens.data();
  g.selected = selected.data();
  g.out_k = ref_k.data();
  g.out_v = ref_v.data();
  kernels::cpu::quest_gather(g);

  GuardedBuffer d_indptr(indptr.size() * 4), d_loc(loc.size() * 4), d_lens(lens.size() * 4),
      d_sel(selected.size() * 4), d_k(out_elems * 2, 0xAA), d_v(out_elems * 2, 0xAA);
  d_indptr.upload(indptr.data());
  d_loc.upload(loc.data());
  d_lens.upload(lens.data());
  d_sel.upload(selected.data());
  g.k_base[0] = d_m0.data();
  g.v_base[0] = static_cast<uint16_t*>(d_m0.data()) + blk;
  g.k_base[1] = host_dev;
  g.v_base[1] = static_cast<uint16_t*>(host_dev) + k1.size();
  g.block_indptr = static_cast<const int32_t*>(d_indptr.data());
  g.block_loc = static_cast<const int32_t*>(d_loc.data());
  g.kv_lens = static_cast<const int32_t*>(d_lens.data());
  g.selected = static_cast<const int32_t*>(d_sel.data());
  g.out_k = d_k.data();
  g.out_v = d_v.data();
  kernels::cuda::quest_gather_run(g, nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_k.download<uint16_t>(), ref_k);
  EXPECT_EQ(d_v.download<uint16_t>(), ref_v);
  EXPECT_TRUE(d_k.guards_intact() && d_v.guards_intact());
  LONGCTX_CUDA_CHECK(cudaFreeHost(host));
}

// Page reuse: two decode steps of two sequences (slots swapped: sequence 0 keeps slot 1). Step 1
// gathers from memory and keeps (settled pages' rows and the lists); step 2 (one key more, new
// lists overlapping the old, sequence 0's block 2 now another block with other keys) copies the
// kept pages that are unchanged. The CUDA gather and keep equal the references byte for byte
// (compact buffers, kept rows and lists, the reuse counter), and step 2's compact buffers equal a
// gather without reuse: the kept bytes are the pages' bytes.
TEST(QuestKernels, GatherCopiesKeptPagesAndKeepWritesTheSlots) {
  std::mt19937 rng(5);
  const int bs = 64, page = 16, ppb = 4, hkv = 4, d = 64, nb = 24, slots = 2;
  const int64_t row = int64_t(hkv) * d, blk = int64_t(bs) * row;
  std::vector<uint16_t> m0(2 * nb * blk);  // blocks of [K, V] adjacent
  for (auto& x : m0) x = static_cast<uint16_t>(rng());
  GuardedBuffer d_m0(m0.size() * 2);
  d_m0.upload(m0.data());
  const QuestBudget b{page, 160, 16, 32};
  const int max_sel = kernels::quest_max_selected(b);
  std::vector<int32_t> lens = {600, 333};
  const std::vector<int32_t> indptr = {0, 10, 16};
  std::vector<int32_t> ids = {3, 7, 1, 0, 9, 5, 11, 2, 13, 4, 6, 8, 10, 12, 14, 15};
  auto select = [&](const std::vector<int32_t>* overlap) {
    std::vector<int32_t> sel(2 * hkv * max_sel, -1);
    for (int s = 0; s < 2; ++s) {
      const QuestCount c = kernels::quest_count(lens[s], b);
      for (int h = 0; h < hkv; ++h) {
        std::vector<int32_t> pages(c.num_pages);
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng);
        if (overlap != nullptr)  // half of the last lists first: reused if unchanged
          for (int i = 0; i < c.num_selected / 2; ++i) {
            const int32_t want = (*overlap)[(s * hkv + h) * max_sel + 2 * i];
            if (want >= 0 && want < c.num_pages)
              std::swap(pages[i], *std::find(pages.begin(), pages.end(), want));
          }
        pages.resize(c.num_selected);
        std::sort(pages.begin(), pages.end());
        std::copy(pages.begin(), pages.end(), sel.begin() + (s * hkv + h) * max_sel);
      }
    }
    return sel;
  };
  const size_t out_elems = size_t(2) * max_sel * page * row;
  const size_t kept_elems = size_t(slots) * max_sel * page * row;
  const size_t list = size_t(slots) * hkv * max_sel;
  const std::vector<int32_t> read0 = {-1, -1}, read1 = {1, 0}, write = {1, 0};
  // The reference's and the device's state.
  std::vector<uint16_t> kept_k(kept_elems, 0x1111), kept_v(kept_elems, 0x2222);
  std::vector<int32_t> kept_pages(list, 0), kept_blocks(list, -1);
  unsigned long long reused = 0;
  GuardedBuffer d_kk(kept_elems * 2), d_kv(kept_elems * 2), d_kp(list * 4), d_kb(list * 4),
      d_reused(8, 0);
  d_kk.upload(kept_k.data());
  d_kv.upload(kept_v.data());
  d_kp.upload(kept_pages.data());
  d_kb.upload(kept_blocks.data());
  std::vector<int32_t> sel = select(nullptr);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    if (step == 1) {
      for (int32_t& len : lens) ++len;
      sel = select(&sel);
      ids[2] = 17;  // sequence 0's block 2: another block now
    }
    const std::vector<int32_t>& read = step == 0 ? read0 : read1;
    kernels::QuestGatherParams g;
    g.block_stride[0] = 2 * blk;
    g.batch = 2;
    g.num_kv_heads = hkv;
    g.head_dim = d;
    g.pages_per_block = ppb;
    g.max_selected = max_sel;
    g.budget = b;
    g.dtype = DType::kBF16;
    g.k_base[0] = m0.data();
    g.v_base[0] = m0.data() + blk;
    g.block_indptr = indptr.data();
    g.block_loc = ids.data();  // resident: where a block is is its id
    g.kv_lens = lens.data();
    g.selected = sel.data();
    std::vector<uint16_t> plain_k(out_elems, 0xAAAA), plain_v(out_elems, 0xAAAA);
    g.out_k = plain_k.data();
    g.out_v = plain_v.data();
    kernels::cpu::quest_gather(g);  // without reuse
    std::vector<uint16_t> ref_k(out_elems, 0xAAAA), ref_v(out_elems, 0xAAAA);
    g.out_k = ref_k.data();
    g.out_v = ref_v.data();
    g.reuse_read = read.data();
    g.block_ids = ids.data();
    g.kept_pages = kept_pages.data();
    g.kept_blocks = kept_blocks.data();
    g.kept_k = kept_k.data();
    g.kept_v = kept_v.data();
    g.reused_pages = &reused;
    kernels::cpu::quest_gather(g);
    EXPECT_EQ(ref_k, plain_k);
    EXPECT_EQ(ref_v, plain_v);
    kernels::QuestKeepParams k;
    k.compact_k = ref_k.data();
    k.compact_v = ref_v.data();
    k.kept_k = kept_k.data();
    k.kept_v = kept_v.data();
    k.kept_pages = kept_pages.data();
    k.kept_blocks = kept_blocks.data();
    k.reuse_write = write.data();
    k.selected = sel.data();
    k.block_indptr = indptr.data();
    k.block_ids = ids.data();
    k.kv_lens = lens.data();
    k.batch = 2;
    k.num_kv_heads = hkv;
    k.head_dim = d;
    k.pages_per_block = ppb;
    k.max_selected = max_sel;
    k.budget = b;
    k.dtype = DType::kBF16;
    kernels::cpu::quest_keep(k);

    GuardedBuffer d_indptr(indptr.size() * 4), d_ids(ids.size() * 4), d_lens(lens.size() * 4),
        d_sel(sel.size() * 4), d_read(8), d_write(8), d_k(out_elems * 2, 0xAA),
        d_v(out_elems * 2, 0xAA);
    d_indptr.upload(indptr.data());
    d_ids.upload(ids.data());
    d_lens.upload(lens.data());
    d_sel.upload(sel.data());
    d_read.upload(read.data());
    d_write.upload(write.data());
    g.k_base[0] = d_m0.data();
    g.v_base[0] = static_cast<uint16_t*>(d_m0.data()) + blk;
    g.block_indptr = static_cast<const int32_t*>(d_indptr.data());
    g.block_loc = static_cast<const int32_t*>(d_ids.data());
    g.block_ids = static_cast<const int32_t*>(d_ids.data());
    g.kv_lens = static_cast<const int32_t*>(d_lens.data());
    g.selected = static_cast<const int32_t*>(d_sel.data());
    g.reuse_read = static_cast<const int32_t*>(d_read.data());
    g.kept_pages = static_cast<const int32_t*>(d_kp.data());
    g.kept_blocks = static_cast<const int32_t*>(d_kb.data());
    g.kept_k = d_kk.data();
    g.kept_v = d_kv.data();
    g.reused_pages = static_cast<unsigned long long*>(d_reused.data());
    g.out_k = d_k.data();
    g.out_v = d_v.data();
    kernels::cuda::quest_gather_run(g, nullptr);
    k.compact_k = d_k.data();
    k.compact_v = d_v.data();
    k.kept_k = d_kk.data();
    k.kept_v = d_kv.data();
    k.kept_pages = static_cast<int32_t*>(d_kp.data());
    k.kept_blocks = static_cast<int32_t*>(d_kb.data());
    k.reuse_write = static_cast<const int32_t*>(d_write.data());
    k.selected = g.selected;
    k.block_indptr = g.block_indptr;
    k.block_ids = g.block_ids;
    k.kv_lens = g.kv_lens;
    kernels::cuda::quest_keep_run(k, nullptr);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_k.download<uint16_t>(), ref_k);
    EXPECT_EQ(d_v.download<uint16_t>(), ref_v);
    EXPECT_EQ(d_kk.download<uint16_t>(), kept_k);
    EXPECT_EQ(d_kv.download<uint16_t>(), kept_v);
    EXPECT_EQ(d_kp.download<int32_t>(), kept_pages);
    EXPECT_EQ(d_kb.download<int32_t>(), kept_blocks);
    EXPECT_EQ(d_reused.download<unsigned long long>()[0], reused);
    EXPECT_TRUE(d_k.guards_intact() && d_v.guards_intact() && d_kk.guards_intact() &&
                d_kv.guards_intact() && d_kp.guards_intact() && d_kb.guards_intact());
  }
  EXPECT_GT(reused, 0u) << "step 2 copied no kept page";
}

TEST(QuestKernels, Fp8MetadataAndGatherEqualTheReference) {
  for (const int d : {128, 40}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << d);
    std::mt19937 rng(static_cast<uint32_t>(d));
    const int bs = 64, page = 16, ppb = 4, hkv = 4, nb_dev = 6, nb_host = 9;
    const int64_t row = int64_t(hkv) * d, blk = bs * row;
    auto code = [&] {
      uint8_t c;
      do c = static_cast<uint8_t>(rng());
      while ((c & 0x7f) == 0x7f);  // no NaN codes
      return c;
    };
    // Memory 0 (device): blocks of [K, V] adjacent, scales [K, V][Hkv] per block (the offload
    // cache); memory 1 (pinned host): K and V pools apart, scales [blocks][Hkv] each.
    std::vector<uint8_t> m0(2 * nb_dev * blk), k1(nb_host * blk), v1(nb_host * blk);
    std::vector<float> s0(2 * nb_dev * hkv), ks1(nb_host * hkv), vs1(nb_host * hkv);
    for (auto* m : {&m0, &k1, &v1})
      for (uint8_t& c : *m) c = code();
    for (auto* s : {&s0, &ks1, &vs1})
      for (float& x : *s) x = std::ldexp(1.f, static_cast<int>(rng() % 24) - 12);

    // Metadata of memory 0's blocks (meta block = nb_dev - 1 - cache block): whole and partial
    // pages.
    std::vector<int32_t> pages;
    for (int b = 0; b < nb_dev; ++b)
      for (int p = 0; p < ppb; ++p)
        if (rng() % 3 != 0)
          pages.insert(pages.end(), {b, nb_dev - 1 - b, p, 1 + static_cast<int>(rng() % page)});
    const size_t meta_elems = size_t(nb_dev) * ppb * row * 2;
    std::vector<uint16_t> meta_ref(meta_elems, 0x7fc0);  // NaN: pages never written stay so
    kernels::QuestMetaParams m;
    m.block_stride = 2 * blk;
    m.num_pages = static_cast<int>(pages.size() / 4);
    m.num_kv_heads = hkv;
    m.head_dim = d;
    m.page_tokens = page;
    m.pages_per_block = ppb;
    m.dtype = DType::kBF16;
    m.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    m.scale_block_stride = 2 * hkv;
    m.k_cache = m0.data();
    m.k_scale = s0.data();
    m.meta = meta_ref.data();
    m.pages = pages.data();
    kernels::cpu::quest_meta_update(m);
    GuardedBuffer d_m0(m0.size()), d_s0(s0.size() * 4), d_pages(pages.size() * 4),
        d_meta(meta_elems * 2);
    d_m0.upload(m0.data());
    d_s0.upload(s0.data());
    d_pages.upload(pages.data());
    const std::vector<uint16_t> nan_meta(meta_elems, 0x7fc0);
    d_meta.upload(nan_meta.data());
    m.k_cache = d_m0.data();
    m.k_scale = static_cast<const float*>(d_s0.data());
    m.meta = d_meta.data();
    m.pages = static_cast<const int32_t*>(d_pages.data());
    kernels::cuda::quest_meta_run(m, nullptr);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_meta.download<uint16_t>(), meta_ref) << "metadata";
    EXPECT_TRUE(d_meta.guards_intact());

    // The gather: two sequences over both memories.
    void* host = nullptr;  // codes: K pool, V pool; then scales: K, V
    const size_t codes_bytes = 2 * k1.size(), scale_bytes = 2 * ks1.size() * 4;
    LONGCTX_CUDA_CHECK(cudaMallocHost(&host, codes_bytes + scale_bytes));
    uint8_t* hb = static_cast<uint8_t*>(host);
    std::memcpy(hb, k1.data(), k1.size());
    std::memcpy(hb + k1.size(), v1.data(), v1.size());
    std::memcpy(hb + codes_bytes, ks1.data(), ks1.size() * 4);
    std::memcpy(hb + codes_bytes + ks1.size() * 4, vs1.data(), vs1.size() * 4);
    void* host_dev = nullptr;
    LONGCTX_CUDA_CHECK(cudaHostGetDevicePointer(&host_dev, host, 0));
    uint8_t* hd = static_cast<uint8_t*>(host_dev);
    const std::vector<int32_t> lens = {600, 333}, indptr = {0, 10, 16};
    const std::vector<int32_t> loc = {2, -1, -4, 0, -9, 5, -2, 1, -3, 3, -8, 4, -5, -6, -7, 2};
    const QuestBudget b{page, 200, 20, 40};
    const int max_sel = kernels::quest_max_selected(b);
    std::vector<int32_t> selected(2 * hkv * max_sel, -1);
    for (int s = 0; s < 2; ++s) {
      const QuestCount c = kernels::quest_count(lens[s], b);
      for (int h = 0; h < hkv; ++h) {
        std::vector<int32_t> ps(c.num_pages);
        std::iota(ps.begin(), ps.end(), 0);
        std::shuffle(ps.begin(), ps.end(), rng);
        ps.resize(c.num_selected);
        std::sort(ps.begin(), ps.end());
        std::copy(ps.begin(), ps.end(), selected.begin() + (s * hkv + h) * max_sel);
      }
    }
    kernels::QuestGatherParams g;
    g.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    g.block_stride[0] = 2 * blk;
    g.block_stride[1] = blk;
    g.scale_block_stride[0] = 2 * hkv;
    g.scale_block_stride[1] = hkv;
    g.batch = 2;
    g.num_kv_heads = hkv;
    g.head_dim = d;
    g.pages_per_block = ppb;
    g.max_selected = max_sel;
    g.budget = b;
    g.dtype = DType::kBF16;
    const size_t out_elems = size_t(2) * max_sel * page * row;
    std::vector<uint16_t> ref_k(out_elems, 0xAAAA), ref_v(out_elems, 0xAAAA);
    g.k_base[0] = m0.data();
    g.v_base[0] = m0.data() + blk;
    g.k_scale[0] = s0.data();
    g.v_scale[0] = s0.data() + hkv;
    g.k_base[1] = k1.data();
    g.v_base[1] = v1.data();
    g.k_scale[1] = ks1.data();
    g.v_scale[1] = vs1.data();
    g.block_indptr = indptr.data();
    g.block_loc = loc.data();
    g.kv_lens = lens.data();
    g.selected = selected.data();
    g.out_k = ref_k.data();
    g.out_v = ref_v.data();
    kernels::cpu::quest_gather(g);

    GuardedBuffer d_indptr(indptr.size() * 4), d_loc(loc.size() * 4), d_lens(lens.size() * 4),
        d_sel(selected.size() * 4), d_k(out_elems * 2, 0xAA), d_v(out_elems * 2, 0xAA);
    d_indptr.upload(indptr.data());
    d_loc.upload(loc.data());
    d_lens.upload(lens.data());
    d_sel.upload(selected.data());
    const float* s0_dev = static_cast<const float*>(d_s0.data());
    g.k_base[0] = d_m0.data();
    g.v_base[0] = static_cast<const uint8_t*>(d_m0.data()) + blk;
    g.k_scale[0] = s0_dev;
    g.v_scale[0] = s0_dev + hkv;
    g.k_base[1] = hd;
    g.v_base[1] = hd + k1.size();
    g.k_scale[1] = reinterpret_cast<const float*>(hd + codes_bytes);
    g.v_scale[1] = reinterpret_cast<const float*>(hd + codes_bytes) + ks1.size();
    g.block_indptr = static_cast<const int32_t*>(d_indptr.data());
    g.block_loc = static_cast<const int32_t*>(d_loc.data());
    g.kv_lens = static_cast<const int32_t*>(d_lens.data());
    g.selected = static_cast<const int32_t*>(d_sel.data());
    g.out_k = d_k.data();
    g.out_v = d_v.data();
    kernels::cuda::quest_gather_run(g, nullptr);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_k.download<uint16_t>(), ref_k);
    EXPECT_EQ(d_v.download<uint16_t>(), ref_v);
    EXPECT_TRUE(d_k.guards_intact() && d_v.guards_intact());
    LONGCTX_CUDA_CHECK(cudaFreeHost(host));
  }
}

}  // namespace
}  // namespace longctx::gpu_test
