// The sparse policies' selections against brute-force references on small random cases:
//   - Quest's bound is an upper bound of every q.k in the block;
//   - Quest's page lists (per KV head and head-averaged, pages of a block or smaller) are exactly
//     what a reference picks from min/max recomputed from the keys, with the metadata built by the
//     write hooks as the engine calls them (chunks, partial blocks, a copy-on-write copy);
//   - XAttention's mask keeps the sink and the diagonal, reaches the threshold of an
//     independently computed estimate, and is the fewest blocks that do;
//   - bad options are clear errors; a budget that covers the context selects everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "attention/sparse/sparse_policy.h"
#include "kernels/attention_params.h"
#include "longctx/core/error.h"

namespace longctx::sparse {
namespace {

struct Case {
  KvShape shape;
  std::vector<float> pool;     // [blocks, block_size, Hkv, d]
  std::vector<int32_t> table;  // the sequence's blocks
  int64_t kv_len = 0;

  const float* key(int64_t j, int64_t h) const {
    const int64_t bs = shape.block_size, row = shape.num_kv_heads * shape.head_dim;
    return pool.data() + (int64_t(table[j / bs]) * bs + j % bs) * row + h * shape.head_dim;
  }
  SeqKeys keys() const { return {table.data(), kv_len, pool.data()}; }
};

// Random keys (a few "hot" blocks per head, so selections are not ties) in a shuffled table.
Case make_case(std::mt19937& rng, int64_t bs, int64_t kv_len, int64_t hq, int64_t hkv, int64_t d) {
  Case c;
  const int64_t nb = (kv_len + bs - 1) / bs;
  c.shape = {1, nb + 3, bs, hq, hkv, d, 1.f / std::sqrt(float(d))};
  c.kv_len = kv_len;
  c.pool.resize(static_cast<size_t>(c.shape.num_blocks * bs * hkv * d));
  std::normal_distribution<float> n01(0.f, 1.f);
  for (float& x : c.pool) x = n01(rng);
  std::vector<int32_t> ids(c.shape.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.table.assign(ids.begin(), ids.begin() + nb);
  for (int64_t j = 0; j < nb; ++j) {
    if (rng() % 4) continue;
    float* b = c.pool.data() + int64_t(c.table[j]) * bs * hkv * d;
    for (int64_t i = 0; i < bs * hkv * d; ++i) b[i] *= 3.f;
  }
  return c;
}

// Feeds the case's keys to the policy's write hook in random chunks, in token order.
void write_keys(SparsePolicy& p, const Case& c, std::mt19937& rng) {
  const int64_t row = c.shape.num_kv_heads * c.shape.head_dim, bs = c.shape.block_size;
  for (int64_t t = 0; t < c.kv_len;) {
    const int64_t n = std::min<int64_t>(c.kv_len - t, 1 + rng() % 40);
    std::vector<float> k(n * row);
    std::vector<int64_t> slots(n);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(c.key(t + i, 0), row, k.data() + i * row);
      slots[i] = int64_t(c.table[(t + i) / bs]) * bs + (t + i) % bs;
    }
    p.on_keys_written(0, k.data(), row, slots.data(), n);
    t += n;
  }
}

double dot(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += double(a[i]) * b[i];
  return s;
}

TEST(SparsePolicy, QuestBoundIsAnUpperBoundOfEveryKey) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.f, 2.f);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t d = 1 + rng() % 96, rows = 1 + rng() % 40;
    std::vector<float> k(rows * d), q(d), mn(d, INFINITY), mx(d, -INFINITY);
    for (float& x : k) x = n01(rng);
    for (float& x : q) x = n01(rng);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i) {
        mn[i] = std::min(mn[i], k[r * d + i]);
        mx[i] = std::max(mx[i], k[r * d + i]);
      }
    const float ub = quest_upper_bound(q.data(), mn.data(), mx.data(), d);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_GE(ub, dot(q.data(), k.data() + r * d, d) - 1e-4 * (1 + std::fabs(ub)))
          << "trial " << trial << " row " << r;
  }
}

// The reference: per page of o.page_tokens keys the min/max from the keys, score per KV head (max
// over its q heads) or averaged over all q heads, the sink and window forced, the best others up to
// the budget.
std::vector<std::vector<int32_t>> quest_reference(const Case& c, const SparseOptions& o,
                                                  const std::vector<float>& q) {
  const int64_t bs = o.page_tokens, d = c.shape.head_dim, hkv = c.shape.num_kv_heads;
  const int64_t hq = c.shape.num_qo_heads, group = hq / hkv;
  const int64_t nb = (c.kv_len + bs - 1) / bs;
  auto ub = [&](int64_t j, int64_t qh) {
    const int64_t h = qh / group;
    double s = 0;
    for (int64_t i = 0; i < d; ++i) {
      float mn = INFINITY, mx = -INFINITY;
      for (int64_t r = j * bs; r < std::min(c.kv_len, (j + 1) * bs); ++r) {
        mn = std::min(mn, c.key(r, h)[i]);
        mx = std::max(mx, c.key(r, h)[i]);
      }
      s += std::max(double(q[qh * d + i]) * mn, double(q[qh * d + i]) * mx);
    }
    return s;
  };
  std::vector<bool> forced(nb, false);
  for (int64_t j = 0; j < nb; ++j)
    forced[j] = j * bs < o.sink_tokens || (j + 1) * bs > c.kv_len - o.window_tokens;
  const int64_t budget = std::max<int64_t>(1, o.budget_tokens / bs);
  const int64_t n_forced = std::count(forced.begin(), forced.end(), true);
  std::vector<std::vector<int32_t>> out(hkv);
  for (int64_t h = 0; h < hkv; ++h) {
    std::vector<std::pair<double, int32_t>> scored;
    for (int64_t j = 0; j < nb; ++j) {
      if (forced[j]) continue;
      double s = 0;
      if (o.per_head) {
        s = -INFINITY;
        for (int64_t g = 0; g < group; ++g) s = std::max(s, ub(j, h * group + g));
      } else {
        for (int64_t qh = 0; qh < hq; ++qh) s += ub(j, qh);
        s /= double(hq);
      }
      scored.emplace_back(-s, int32_t(j));
    }
    std::sort(scored.begin(), scored.end());
    for (int64_t j = 0; j < nb; ++j)
      if (forced[j]) out[h].push_back(int32_t(j));
    for (int64_t i = 0; i < std::min<int64_t>(budget - n_forced, scored.size()); ++i)
      out[h].push_back(scored[i].second);
    std::sort(out[h].begin(), out[h].end());
  }
  return out;
}

TEST(SparsePolicy, QuestPicksWhatTheReferencePicks) {
  std::mt19937 rng(11);
  int selected = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t bs = int64_t(1) << (2 + rng() % 4);  // 4 .. 32
    const int64_t hkv = 1 + rng() % 3, hq = hkv * (1 + rng() % 4), d = 8 * (1 + rng() % 4);
    const int64_t kv_len = 20 + rng() % 700;
    Case c = make_case(rng, bs, kv_len, hq, hkv, d);
    SparseOptions o;
    o.policy = SparsePolicyKind::kQuest;
    o.sink_tokens = rng() % 3 * bs / 2;
    o.window_tokens = 1 + rng() % (2 * bs);
    o.budget_tokens = o.sink_tokens + o.window_tokens + 1 + rng() % 200;
    o.per_head = trial % 2 == 0;
    o.page_tokens = std::max<int64_t>(1, bs >> (rng() % 3));  // pages inside blocks too
    auto p = make_sparse_policy(o, c.shape);
    EXPECT_TRUE(p->selects(Phase::kDecode));
    EXPECT_FALSE(p->selects(Phase::kPrefill));
    write_keys(*p, c, rng);
    std::vector<float> q(hq * d);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (float& x : q) x = n01(rng);
    const DecodeSelection sel = p->select_decode(0, q.data(), c.keys());
    const int64_t pt = o.page_tokens, np = (kv_len + pt - 1) / pt;
    if (o.budget_tokens >= kv_len || std::max<int64_t>(1, o.budget_tokens / pt) >= np) {
      EXPECT_TRUE(sel.all()) << "trial " << trial;
      continue;
    }
    ASSERT_FALSE(sel.all()) << "trial " << trial;
    EXPECT_EQ(sel.page_tokens, pt);
    EXPECT_EQ(sel.per_kv_head, quest_reference(c, o, q)) << "trial " << trial;
    if (!o.per_head)
      for (const auto& l : sel.per_kv_head) EXPECT_EQ(l, sel.per_kv_head[0]);
    ++selected;
  }
  EXPECT_GT(selected, 20);
}

TEST(SparsePolicy, QuestMetadataFollowsACopiedBlock) {
  std::mt19937 rng(5);
  Case c = make_case(rng, 16, 300, 4, 2, 16);
  SparseOptions o;
  o.policy = SparsePolicyKind::kQuest;
  o.sink_tokens = 16;
  o.window_tokens = 16;
  o.budget_tokens = 80;
  auto p = make_sparse_policy(o, c.shape);
  write_keys(*p, c, rng);
  // Copy-on-write of block 7 of the table into a free block: same keys, so the same picks.
  const int32_t src = c.table[7];
  int32_t dst = 0;
  while (std::find(c.table.begin(), c.table.end(), dst) != c.table.end()) ++dst;
  const int64_t block = 16 * 2 * 16;
  std::copy_n(c.pool.data() + src * block, block, c.pool.data() + dst * block);
  p->on_block_copied(src, dst);
  std::vector<float> q(4 * 16, 0.5f);
  const DecodeSelection before = p->select_decode(0, q.data(), c.keys());
  c.table[7] = dst;
  EXPECT_EQ(p->select_decode(0, q.data(), c.keys()).per_kv_head, before.per_kv_head);
}

// XAttention's estimate recomputed directly: [q_groups, k_groups] antidiagonal scores, causal
// visibility by group start, softmax per query group, sums per 128 x 128 block.
std::vector<double> xattn_mass(const Case& c, const std::vector<float>& q, int64_t n, int64_t hq,
                               int64_t stride) {
  const int64_t d = c.shape.head_dim, group = c.shape.num_qo_heads / c.shape.num_kv_heads;
  const int64_t B = kernels::kSparseBlock, p0 = c.kv_len - n;
  const int64_t qb = (n + B - 1) / B, kb = (c.kv_len + B - 1) / B;
  std::vector<double> mass(qb * kb, 0.0);
  for (int64_t r = 0; r * stride < n; ++r) {
    std::vector<double> a;
    for (int64_t cg = 0; cg * stride <= p0 + r * stride && cg * stride < c.kv_len; ++cg) {
      double s = 0;
      for (int64_t k = 0; k < stride; ++k) {
        const int64_t qi = r * stride + stride - 1 - k, kj = cg * stride + k;
        if (qi < n && kj < c.kv_len)
          s += dot(q.data() + (qi * c.shape.num_qo_heads + hq) * d, c.key(kj, hq / group), d);
      }
      a.push_back(s * c.shape.sm_scale / stride);
    }
    const double mx = *std::max_element(a.begin(), a.end());
    double z = 0;
    for (double x : a) z += std::exp(x - mx);
    for (size_t cg = 0; cg < a.size(); ++cg)
      mass[(r * stride / B) * kb + cg * stride / B] += std::exp(a[cg] - mx) / z;
  }
  return mass;
}

TEST(SparsePolicy, XAttentionKeepsTheFewestBlocksReachingTheThreshold) {
  std::mt19937 rng(23);
  const int64_t B = kernels::kSparseBlock;
  int sparse_rows = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t hkv = 1 + rng() % 2, hq = hkv * (1 + rng() % 2), d = 16;
    const int64_t kv_len = 3 * B + rng() % (6 * B), n = 1 + rng() % std::min<int64_t>(kv_len, 300);
    Case c = make_case(rng, 16, kv_len, hq, hkv, d);
    SparseOptions o;
    o.policy = SparsePolicyKind::kXAttention;
    o.threshold = trial % 3 == 0 ? 0.95 : 0.9;
    o.stride = trial % 2 ? 8 : 16;
    o.xattn_per_kv_head = trial % 4 < 2;
    o.xattn_dense_tail = 0;  // the selection itself (XAttentionReference covers the dense tail)
    o.xattn_min_len = 0;
    auto p = make_sparse_policy(o, c.shape);
    EXPECT_TRUE(p->selects(Phase::kPrefill));
    EXPECT_FALSE(p->selects(Phase::kDecode));
    std::vector<float> q(n * hq * d);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (float& x : q) x = n01(rng);
    const PrefillMask m = p->select_prefill(0, q.data(), hq * d, n, c.keys());
    ASSERT_FALSE(m.all()) << "trial " << trial;
    const int64_t qb = (n + B - 1) / B, kb = (kv_len + B - 1) / B, p0 = kv_len - n;
    ASSERT_EQ(m.q_blocks, qb);
    ASSERT_EQ(m.k_blocks, kb);
    const int64_t group = o.xattn_per_kv_head ? hq / hkv : 1;  // q heads sharing a mask
    for (int64_t h = 0; h < hq; ++h) {
      std::vector<double> mass(qb * kb, 0.0);
      for (int64_t u = h - h % group; u < h - h % group + group; ++u) {
        const std::vector<double> one = xattn_mass(c, q, n, u, o.stride);
        for (size_t e = 0; e < mass.size(); ++e) mass[e] += one[e];
      }
      if (h % group)
        EXPECT_TRUE(std::equal(m.mask.begin() + h * qb * kb, m.mask.begin() + (h + 1) * qb * kb,
                               m.mask.begin() + (h - 1) * qb * kb))
            << "the q heads of a KV head share its mask, trial " << trial;
      for (int64_t i = 0; i < qb; ++i) {
        const uint8_t* row = m.mask.data() + (h * qb + i) * kb;
        const int64_t lo = (p0 + i * B) / B, hi = (p0 + std::min(n, (i + 1) * B) - 1) / B;
        double total = 0, kept = 0, lightest = INFINITY;
        for (int64_t j = 0; j < kb; ++j) {
          if (j > hi) {
            EXPECT_EQ(row[j], 0) << "a block past the diagonal, trial " << trial;
            continue;
          }
          total += mass[i * kb + j];
          if (j == 0 || j >= lo) EXPECT_EQ(row[j], 1) << "sink/diagonal, trial " << trial;
          if (row[j]) kept += mass[i * kb + j];
          if (row[j] && j != 0 && j < lo) lightest = std::min(lightest, mass[i * kb + j]);
        }
        EXPECT_GE(kept, o.threshold * total * (1 - 1e-5)) << "trial " << trial << " block " << i;
        if (lightest < INFINITY) {
          EXPECT_LT(kept - lightest, o.threshold * total * (1 + 1e-5)) << "not the fewest";
          ++sparse_rows;
        }
      }
    }
  }
  EXPECT_GT(sparse_rows, 5);
}

TEST(SparsePolicy, BadOptionsAreClearErrors) {
  const KvShape shape{2, 64, 16, 4, 2, 16, 0.25f};
  auto fails = [&](SparseOptions o, const char* needle) {
    try {
      make_sparse_policy(o, shape);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  try {
    parse_sparse_policy("magic");
    ADD_FAILURE() << "accepted --sparse-policy magic";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--sparse-policy 'magic' is unknown (known: full, quest, "
                                         "xattention, streaming)"),
              std::string::npos)
        << e.what();
  }
  SparseOptions o;
  o.policy = SparsePolicyKind::kQuest;
  o.budget_tokens = 0;
  fails(o, "--sparse-budget");
  o.budget_tokens = o.sink_tokens + o.window_tokens;
  fails(o, "--sparse-budget");
  o = {};
  o.threshold = 0;
  fails(o, "--xattn-threshold");
  o.threshold = 1.5;
  fails(o, "--xattn-threshold");
  o = {};
  o.policy = SparsePolicyKind::kXAttention;
  o.stride = 3;
  fails(o, "--xattn-stride");
  o = {};
  o.policy = SparsePolicyKind::kXAttention;
  o.xattn_dense_tail = -1;
  fails(o, "--xattn-dense-tail");
  o = {};
  o.policy = SparsePolicyKind::kXAttention;
  o.xattn_min_len = -1;
  fails(o, "--xattn-min-len");
  for (const std::string& name : sparse_policy_names()) {
    SparseOptions ok;
    ok.policy = parse_sparse_policy(name);
    EXPECT_EQ(make_sparse_policy(ok, shape)->name(), name);
    EXPECT_EQ(sparse_policy_name(ok.policy), name);
  }
}

}  // namespace
}  // namespace longctx::sparse
