// StreamingLLM's selection (attention/sparse/streaming.cpp) against brute-force references that
// test each key by the definition:
//   - decode: a page is read iff it holds a sink key (index < sink) or a window key (index >=
//     kv_len - window); everything (no selection) when sink + window covers the context;
//   - prefill: key block j is kept for query block i iff it holds a sink key or a key in the
//     window of some query of block i (t - window < k <= t); no mask when every causal block is
//     kept;
//   - the registry: the name parses, both phases select, bad options are errors naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "attention/sparse/sparse_policy.h"
#include "kernels/attention_params.h"
#include "longctx/core/error.h"

namespace longctx::sparse {
namespace {

constexpr int64_t kB = kernels::kSparseBlock;

SparseOptions streaming(int64_t sink, int64_t window, int64_t page) {
  SparseOptions o;
  o.policy = parse_sparse_policy("streaming");
  o.sink_tokens = sink;
  o.window_tokens = window;
  o.page_tokens = page;
  return o;
}

TEST(StreamingPolicy, IsRegisteredForBothPhases) {
  const SparseOptions o = streaming(4, 64, 16);
  EXPECT_EQ(o.policy, SparsePolicyKind::kStreaming);
  EXPECT_EQ(sparse_policy_name(o.policy), "streaming");
  auto p = make_sparse_policy(o, {1, 8, 16, 4, 2, 8, 0.3f});
  EXPECT_TRUE(p->selects(Phase::kDecode));
  EXPECT_TRUE(p->selects(Phase::kPrefill));
  EXPECT_EQ(p->name(), "streaming");
  EXPECT_FALSE(policy_def(o.policy).decode_graphs);
}

TEST(StreamingPolicy, DecodePagesAreTheBruteForceReference) {
  std::mt19937 rng(17);
  int selected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t bs = int64_t(1) << (2 + rng() % 4);              // 4 .. 32
    const int64_t page = std::max<int64_t>(1, bs >> (rng() % 4));  // divides the block
    const int64_t sink = rng() % 3 == 0 ? 0 : rng() % 40, window = 1 + rng() % 80;
    const int64_t kv_len = 1 + rng() % 400, hkv = 1 + rng() % 3;
    auto p = make_sparse_policy(streaming(sink, window, page),
                                {1, (kv_len + bs - 1) / bs, bs, hkv * 2, hkv, 8, 0.3f});
    std::vector<int32_t> table((kv_len + bs - 1) / bs);
    for (size_t j = 0; j < table.size(); ++j) table[j] = int32_t(j);
    std::vector<float> q(hkv * 2 * 8, 1.f);
    const DecodeSelection sel = p->select_decode(0, q.data(), {table.data(), kv_len, nullptr});
    std::vector<int32_t> want;
    for (int64_t pg = 0; pg * page < kv_len; ++pg) {
      bool keep = false;
      for (int64_t k = pg * page; k < std::min(kv_len, (pg + 1) * page); ++k)
        keep = keep || k < sink || k >= kv_len - window;
      if (keep) want.push_back(int32_t(pg));
    }
    const int64_t num_pages = (kv_len + page - 1) / page;
    if (sink + window >= kv_len) {
      EXPECT_TRUE(sel.all()) << "trial " << trial << ": every key is a sink or window key";
      continue;
    }
    // Every page holds a kept key (a page longer than the context's gap): every key is read,
    // with or without a list.
    if (int64_t(want.size()) == num_pages && sel.all()) continue;
    ASSERT_FALSE(sel.all()) << "trial " << trial;
    EXPECT_EQ(sel.page_tokens, page);
    ASSERT_EQ(sel.per_kv_head.size(), size_t(hkv));
    for (const auto& l : sel.per_kv_head)
      EXPECT_EQ(l, want) << "trial " << trial << " kv_len " << kv_len << " sink " << sink
                         << " window " << window << " page " << page;
    selected += int64_t(want.size()) < num_pages;
  }
  EXPECT_GT(selected, 100);
}

TEST(StreamingPolicy, PrefillMaskIsTheBruteForceReference) {
  std::mt19937 rng(29);
  int sparse_masks = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t kv_len = 1 + rng() % 900, n = 2 + rng() % std::max<int64_t>(1, kv_len - 1);
    if (n > kv_len) continue;
    const int64_t sink = rng() % 3 == 0 ? 0 : rng() % 200, window = 1 + rng() % 300;
    const int64_t hq = 1 + rng() % 4, p0 = kv_len - n;
    auto p = make_sparse_policy(streaming(sink, window, 16),
                                {1, (kv_len + 15) / 16, 16, hq, 1, 8, 0.3f});
    std::vector<int32_t> table((kv_len + 15) / 16);
    for (size_t j = 0; j < table.size(); ++j) table[j] = int32_t(j);
    std::vector<float> q(n * hq * 8, 1.f);
    const PrefillMask m =
        p->select_prefill(0, q.data(), hq * 8, n, {table.data(), kv_len, nullptr});
    const int64_t qb = (n + kB - 1) / kB, kb = (kv_len + kB - 1) / kB;
    std::vector<uint8_t> want(qb * kb, 0);
    bool dense = true;
    for (int64_t i = 0; i < qb; ++i) {
      const int64_t t0 = p0 + i * kB, t1 = std::min(kv_len, p0 + (i + 1) * kB);  // queries
      for (int64_t j = 0; j < kb; ++j) {
        bool causal = false, keep = false;
        for (int64_t k = j * kB; k < std::min(kv_len, (j + 1) * kB); ++k)
          for (int64_t t = t0; t < t1; ++t) {
            if (k > t) continue;
            causal = true;
            keep = keep || k < sink || k > t - window;
          }
        want[i * kb + j] = keep;
        dense = dense && (keep || !causal);
      }
    }
    if (dense) {
      EXPECT_TRUE(m.all()) << "trial " << trial;
      continue;
    }
    ASSERT_FALSE(m.all()) << "trial " << trial;
    ASSERT_EQ(m.q_blocks, qb);
    ASSERT_EQ(m.k_blocks, kb);
    ASSERT_EQ(m.mask.size(), size_t(hq * qb * kb));
    for (int64_t h = 0; h < hq; ++h)
      EXPECT_TRUE(std::equal(want.begin(), want.end(), m.mask.begin() + h * qb * kb))
          << "trial " << trial << " head " << h << " n " << n << " kv_len " << kv_len << " sink "
          << sink << " window " << window;
    ++sparse_masks;
  }
  EXPECT_GT(sparse_masks, 20);
}

TEST(StreamingPolicy, BadOptionsAreClearErrors) {
  auto fails = [](SparseOptions o, int64_t block, const char* needle) {
    try {
      make_sparse_policy(o, {1, 8, block, 2, 1, 8, 0.3f});
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails(streaming(-1, 8, 16), 16, "--sparse-sink");
  fails(streaming(4, 0, 16), 16, "--sparse-window");
  fails(streaming(4, 8, 0), 16, "--sparse-page");
  fails(streaming(4, 8, 16), 8, "--sparse-page 16 must divide the KV block size 8");
  // No budget: sink + window is what it reads.
  SparseOptions o = streaming(4, 8, 16);
  o.budget_tokens = 1;
  EXPECT_NO_THROW(make_sparse_policy(o, {1, 8, 16, 2, 1, 8, 0.3f}));
}

}  // namespace
}  // namespace longctx::sparse
