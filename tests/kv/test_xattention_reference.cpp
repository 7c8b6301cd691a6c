// The CPU references of XAttention's GPU kernels (kernels/cpu/xattention_cpu.h) beyond what the
// policy test (test_sparse_policy.cpp) covers through the policy: batches with dense requests
// (one query, at most two key blocks: dense causal masks, no estimate written), the per-KV-head
// masks of a batch equal to each request selected alone, the buffer bound of the memory plan,
// the gather of kept values (the offload path), and bad parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/xattention_cpu.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu {
namespace {

struct Batch {
  int hq = 4, hkv = 2, d = 16, page = 32, stride = 8;
  std::vector<std::pair<int, int>> seqs;  // (queries, keys)
  std::vector<int32_t> qo{0}, kv_indptr{0}, last, pages, q_lens, kv_lens;
  std::vector<int64_t> lse_indptr{0}, mask_indptr{0};
  std::vector<float> q, k;

  Batch(std::vector<std::pair<int, int>> s, uint32_t seed) : seqs(std::move(s)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (auto [n, kv] : seqs) {
      qo.push_back(qo.back() + n);
      const int np = (kv + page - 1) / page;
      for (int i = 0; i < np; ++i) pages.push_back(static_cast<int32_t>(pages.size()));
      kv_indptr.push_back(kv_indptr.back() + np);
      last.push_back((kv - 1) % page + 1);
      q_lens.push_back(n);
      kv_lens.push_back(kv);
      lse_indptr.push_back(lse_indptr.back() +
                           (xattn_dense(n, kv) ? 0 : xattn_lse_elems(n, kv, hq, stride)));
      mask_indptr.push_back(mask_indptr.back() + xattn_mask_elems(n, kv, hq));
    }
    // Queries share a direction that the keys of every fourth 128-key run carry: uneven masses.
    std::vector<float> dir(d);
    for (float& x : dir) x = n01(rng);
    q.resize(size_t(qo.back()) * hq * d);
    k.resize(pages.size() * page * hkv * d);
    for (size_t i = 0; i < q.size(); ++i) q[i] = n01(rng) + dir[i % d];
    for (size_t i = 0; i < k.size(); ++i)
      k[i] = n01(rng) + ((i / (hkv * d)) / 128 % 4 == 3 ? 2.f * dir[i % d] : 0.f);
  }

  std::vector<uint8_t> masks(bool per_kv_head, std::vector<float>* lse_out = nullptr,
                             int dense_tail = 0, int min_kv_len = 0) const {
    std::vector<float> lse(size_t(lse_indptr.back()) + 1, 12345.f);  // +1: a sentinel
    XAttnEstimateParams e;
    e.q = q.data();
    e.q_row_stride = int64_t(hq) * d;
    e.k_cache = k.data();
    e.qo_indptr = qo.data();
    e.kv_indptr = kv_indptr.data();
    e.kv_indices = pages.data();
    e.kv_last_page_len = last.data();
    e.block_lse = lse.data();
    e.lse_indptr = lse_indptr.data();
    e.batch_size = static_cast<int>(seqs.size());
    e.num_qo_heads = hq;
    e.num_kv_heads = hkv;
    e.head_dim = d;
    e.page_size = page;
    e.stride = stride;
    e.dtype = DType::kF32;
    e.sm_scale = 1.f / std::sqrt(float(d));
    xattn_estimate(e);
    EXPECT_EQ(lse.back(), 12345.f) << "the estimate wrote past the batch's block_lse";
    std::vector<uint8_t> m(size_t(mask_indptr.back()), 7);
    XAttnSelectParams s;
    s.block_lse = lse.data();
    s.lse_indptr = lse_indptr.data();
    s.block_mask = m.data();
    s.mask_indptr = mask_indptr.data();
    s.q_lens = q_lens.data();
    s.kv_lens = kv_lens.data();
    s.batch_size = e.batch_size;
    s.num_qo_heads = hq;
    s.heads_per_mask = per_kv_head ? hq / hkv : 1;
    s.stride = stride;
    s.threshold = 0.9;
    s.dense_tail = dense_tail;
    s.min_kv_len = min_kv_len;
    xattn_select(s);
    if (lse_out) *lse_out = lse;
    return m;
  }
};

TEST(XAttentionReference, DenseRequestsGetTheCausalMaskAndNoEstimate) {
  const Batch b({{1, 900}, {200, 200}, {300, 1000}, {1, 1}, {129, 256}}, 1);
  for (bool per_kv : {true, false}) {
    const std::vector<uint8_t> m = b.masks(per_kv);
    for (size_t r = 0; r < b.seqs.size(); ++r) {
      const auto [n, kv] = b.seqs[r];
      const int64_t qb = xattn_blocks(n), kb = xattn_blocks(kv);
      int64_t sparse = 0;
      for (int h = 0; h < b.hq; ++h)
        for (int64_t i = 0; i < qb; ++i)
          for (int64_t j = 0; j < kb; ++j) {
            const uint8_t v = m[b.mask_indptr[r] + (h * qb + i) * kb + j];
            const int64_t hi = (kv - n + std::min<int64_t>(n, (i + 1) * 128) - 1) / 128;
            ASSERT_LE(v, 1);
            if (xattn_dense(n, kv)) ASSERT_EQ(v, j <= hi ? 1 : 0) << "request " << r;
            if (j > hi) ASSERT_EQ(v, 0);
            sparse += j <= hi && v == 0;
          }
      if (r == 2) EXPECT_GT(sparse, 0) << "the long request selects";
    }
  }
}

// --xattn-dense-tail: the query blocks holding a segment's last queries get the dense causal
// mask; the other blocks select as without it.
TEST(XAttentionReference, DenseTailBlocksGetTheCausalMask) {
  const Batch b({{1000, 3000}, {300, 1000}, {1, 900}}, 3);
  const std::vector<uint8_t> plain = b.masks(true);
  const std::vector<uint8_t> tail = b.masks(true, nullptr, 200);
  int64_t densified = 0;
  for (size_t r = 0; r < b.seqs.size(); ++r) {
    const auto [n, kv] = b.seqs[r];
    const int64_t qb = xattn_blocks(n), kb = xattn_blocks(kv);
    for (int h = 0; h < b.hq; ++h)
      for (int64_t i = 0; i < qb; ++i) {
        const bool in_tail = std::min<int64_t>(n, (i + 1) * 128) > n - 200;
        const int64_t hi = (kv - n + std::min<int64_t>(n, (i + 1) * 128) - 1) / 128;
        for (int64_t j = 0; j < kb; ++j) {
          const int64_t at = b.mask_indptr[r] + (h * qb + i) * kb + j;
          if (in_tail)
            ASSERT_EQ(tail[at], j <= hi ? 1 : 0) << "request " << r << " block " << i;
          else
            ASSERT_EQ(tail[at], plain[at]) << "request " << r << " block " << i;
          densified += tail[at] != plain[at];
        }
      }
  }
  EXPECT_GT(densified, 0) << "the tail blocks were sparse without the option";
}

// --xattn-min-len: requests with fewer keys get the dense causal mask, the others select as
// without it.
TEST(XAttentionReference, ShortRequestsAttendDensely) {
  const Batch b({{1000, 3000}, {300, 1000}}, 4);
  const std::vector<uint8_t> plain = b.masks(true), min = b.masks(true, nullptr, 0, 2000);
  for (size_t r = 0; r < b.seqs.size(); ++r) {
    const auto [n, kv] = b.seqs[r];
    const int64_t qb = xattn_blocks(n), kb = xattn_blocks(kv);
    int64_t sparse = 0;
    for (int64_t e = 0; e < b.hq * qb * kb; ++e) {
      const int64_t at = b.mask_indptr[r] + e, i = (e / kb) % qb, j = e % kb;
      const int64_t hi = (kv - n + std::min<int64_t>(n, (i + 1) * 128) - 1) / 128;
      if (kv < 2000)
        ASSERT_EQ(min[at], j <= hi ? 1 : 0) << "request " << r;
      else
        ASSERT_EQ(min[at], plain[at]) << "request " << r;
      sparse += j <= hi && plain[at] == 0;
    }
    EXPECT_GT(sparse, 0) << "request " << r << " selects without the option";
  }
}

TEST(XAttentionReference, ABatchSelectsAsEachRequestAlone) {
  const std::vector<std::pair<int, int>> seqs = {{500, 1500}, {1, 700}, {777, 777}};
  const Batch all(seqs, 2);
  for (bool per_kv : {true, false}) {
    const std::vector<uint8_t> m = all.masks(per_kv);
    for (size_t r = 0; r < seqs.size(); ++r) {
      Batch one({seqs[r]}, 2);
      // The same data: take request r's rows out of the batch.
      one.q.assign(all.q.begin() + int64_t(all.qo[r]) * all.hq * all.d,
                   all.q.begin() + int64_t(all.qo[r + 1]) * all.hq * all.d);
      const int64_t row = int64_t(all.page) * all.hkv * all.d;
      one.k.assign(all.k.begin() + all.kv_indptr[r] * row,
                   all.k.begin() + all.kv_indptr[r + 1] * row);
      const std::vector<uint8_t> alone = one.masks(per_kv);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), m.begin() + all.mask_indptr[r]))
          << "request " << r << (per_kv ? " per KV head" : " per q head");
    }
  }
}

TEST(XAttentionReference, BuffersBoundEveryStepWithinTheLimits) {
  std::mt19937 rng(3);
  const int64_t hq = 32, max_tokens = 4096, max_seqs = 8, max_len = 20000;
  for (int64_t stride : {4, 8, 16}) {
    const XAttnBuffers cap = xattn_buffers(hq, stride, max_tokens, max_seqs, max_len);
    for (int trial = 0; trial < 200; ++trial) {
      int64_t tokens = max_tokens, lse = 0, mask = 0;
      for (int s = 0; s < max_seqs && tokens > 0; ++s) {
        const int64_t n = 1 + rng() % tokens, kv = n + rng() % (max_len - n + 1);
        tokens -= n;
        lse += xattn_lse_elems(n, kv, hq, stride);
        mask += xattn_mask_elems(n, kv, hq);
      }
      EXPECT_LE(lse, cap.lse_elems);
      EXPECT_LE(mask, cap.mask_elems);
    }
  }
}

// The gather of the offload path copies exactly the rows of head h whose key block some q head
// of h's group keeps for some query block, and nothing else; checked against the mask directly.
TEST(XAttentionReference, GatherCopiesExactlyTheKeptRowsOfEachHead) {
  for (int bs : {16, 128, 256}) {
    SCOPED_TRACE(::testing::Message() << "block size " << bs);
    const int hq = 8, hkv = 2, d = 4, group = hq / hkv;
    const std::vector<std::pair<int, int>> seqs = {{300, 1000}, {1, 700}, {129, 129}};
    std::mt19937 rng(bs);
    std::vector<int32_t> q_lens, kv_lens, items;
    std::vector<int64_t> mask_indptr = {0};
    int32_t next = 0;
    for (int b = 0; b < int(seqs.size()); ++b) {
      auto [n, kv] = seqs[b];
      q_lens.push_back(n);
      kv_lens.push_back(kv);
      mask_indptr.push_back(mask_indptr.back() + xattn_mask_elems(n, kv, hq));
      for (int j = 0; j * bs < kv; ++j)
        if (rng() % 3 != 0) items.insert(items.end(), {b, j, 2 * next + 1, next++});
    }
    std::vector<uint8_t> mask(mask_indptr.back());
    for (auto& m : mask) m = rng() % 5 == 0;
    const int64_t row = int64_t(hkv) * d, block = bs * row;
    std::vector<float> src(2 * next * block), dst(next * block, -1.f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
    XAttnGatherParams p;
    p.block_mask = mask.data();
    p.mask_indptr = mask_indptr.data();
    p.q_lens = q_lens.data();
    p.kv_lens = kv_lens.data();
    p.items = items.data();
    p.num_items = int(items.size() / 4);
    p.src = src.data();
    p.dst = dst.data() - 2 * block;  // destination blocks counted from an offset
    p.dst_block_offset = 2;
    p.block_stride = block * int64_t(sizeof(float));
    p.block_size = bs;
    p.num_qo_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.dtype = DType::kF32;
    const int64_t copied = xattn_gather_values(p);
    int64_t expect_copied = 0, kept_rows = 0, rows = 0;
    for (int i = 0; i < p.num_items; ++i) {
      const int b = items[4 * i], j = items[4 * i + 1], s = items[4 * i + 2], t = items[4 * i + 3];
      const int nqb = int(xattn_blocks(q_lens[b])), nkb = int(xattn_blocks(kv_lens[b]));
      for (int r = 0; r < bs; ++r)
        for (int h = 0; h < hkv; ++h) {
          const int tok = j * bs + r;
          bool keep = false;
          for (int x = 0; x < group * nqb && tok < kv_lens[b]; ++x)
            keep =
                keep ||
                mask[mask_indptr[b] + ((h * group + x / nqb) * nqb + x % nqb) * nkb + tok / 128] !=
                    0;
          for (int e = 0; e < d; ++e) {
            const float want = keep ? src[s * block + r * row + h * d + e] : -1.f;
            ASSERT_EQ(dst[t * block + r * row + h * d + e], want)
                << "item " << i << " row " << r << " head " << h;
          }
          expect_copied += keep ? d * 4 : 0;
          kept_rows += keep;
          rows += tok < kv_lens[b];
        }
    }
    EXPECT_EQ(copied, expect_copied);
    EXPECT_GT(kept_rows, 0);
    EXPECT_LT(kept_rows, rows);  // the masks are sparse: some rows stay behind
  }
}

TEST(XAttentionReference, BadParametersAreClearErrors) {
  EXPECT_THROW(check_xattn_options(3, 0.9), Error);
  EXPECT_THROW(check_xattn_options(8, 0.0), Error);
  EXPECT_THROW(check_xattn_options(8, 1.01), Error);
  check_xattn_options(16, 1.0);
  const Batch b({{300, 1000}}, 4);
  XAttnSelectParams s;
  std::vector<float> lse(b.lse_indptr.back());
  std::vector<uint8_t> m(b.mask_indptr.back());
  s.block_lse = lse.data();
  s.lse_indptr = b.lse_indptr.data();
  s.block_mask = m.data();
  s.mask_indptr = b.mask_indptr.data();
  s.q_lens = b.q_lens.data();
  s.kv_lens = b.kv_lens.data();
  s.batch_size = 1;
  s.num_qo_heads = 4;
  s.heads_per_mask = 3;  // does not divide 4
  EXPECT_THROW(xattn_select(s), Error);
}

}  // namespace
}  // namespace longctx::kernels::cpu
