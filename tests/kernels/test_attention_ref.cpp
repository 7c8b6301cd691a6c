// The CPU reference attention (paged prefill, block-sparse prefill) against the direct dense
// formula with an explicit boolean mask, over small odd shapes. The mask is built here from the
// written rules (causal: query i sees keys <= kv_len - q_len + i; block mask byte of
// (i / 128, j / 128)), independently of the reference's code.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/paged_case.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using kernels::MaskMode;
using testing::PagedCase;
using testing::PagedCaseShape;

// Output tolerance: the reference rounds its fp32 result once to bf16/f16 (half an ulp of a
// unit-scale value: 2^-8 for bf16, 2^-11 for f16) plus fp32-vs-double accumulation noise.
double output_tol(DType dt) { return dt == DType::kBF16 ? 8e-3 : 1.5e-3; }
constexpr double kLseTol = 1e-4;

struct Compare {
  double max_o = 0, max_lse = 0;
  int64_t lse_inf_mismatch = 0;
};

// Runs the reference and the dense formula on every request of the case and compares.
Compare check_case(const PagedCase& c) {
  const auto& s = c.shape;
  const int d = s.head_dim, hq = s.num_qo_heads, hk = s.num_kv_heads;
  std::vector<uint16_t> o(c.q.size(), 0x7fff);  // NaN pattern: every row must be written
  std::vector<float> lse(c.total_q * hq, 12345.f);
  kernels::PagedPrefillParams p = c.params(o.data(), lse.data());
  kernels::cpu::paged_prefill_ref(p);

  Compare cmp;
  for (size_t b = 0; b < s.q_lens.size(); ++b) {
    const int nq = s.q_lens[b], nk = s.kv_lens[b];
    const int64_t q0 = c.qo_indptr[b];
    // Dense fp32 copies of this request's q, k, v.
    std::vector<float> q(int64_t(nq) * hq * d), k(int64_t(nk) * hk * d), v(k.size());
    for (int64_t i = 0; i < int64_t(q.size()); ++i)
      q[i] = kernels::cpu::load_elem(c.q.data(), q0 * hq * d + i, s.dtype);
    for (int j = 0; j < nk; ++j) {
      const int64_t page = c.kv_indices[c.kv_indptr[b] + j / s.page_size];
      const int64_t src = (page * s.page_size + j % s.page_size) * hk * d;
      for (int e = 0; e < hk * d; ++e) {
        k[int64_t(j) * hk * d + e] = kernels::cpu::load_elem(c.k_cache.data(), src + e, s.dtype);
        v[int64_t(j) * hk * d + e] = kernels::cpu::load_elem(c.v_cache.data(), src + e, s.dtype);
      }
    }
    std::vector<uint8_t> mask(int64_t(hq) * nq * nk);
    const int nkb = (nk + 127) / 128, nqb = (nq + 127) / 128;
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nk; ++j) {
          bool ok = s.mask_mode == MaskMode::kNone || j <= nk - nq + i;
          // Sliding window: the last `window` keys up to the row's own.
          if (s.window > 0) ok = ok && j > nk - nq + i - s.window;
          if (!c.block_mask.empty()) {
            const int mh = s.sparse_per_head ? h : 0;
            ok = ok && c.block_mask[c.block_mask_indptr[b] + (int64_t(mh) * nqb + i / 128) * nkb +
                                    j / 128];
          }
          mask[(int64_t(h) * nq + i) * nk + j] = ok;
        }
    std::vector<float> o_ref(q.size()), lse_ref(int64_t(nq) * hq);
    kernels::cpu::dense_attention_masked_ref(q.data(), k.data(), v.data(), mask.data(), nq, nk, hq,
                                             hk, d, p.sm_scale, o_ref.data(), lse_ref.data());
    for (int64_t i = 0; i < int64_t(o_ref.size()); ++i) {
      const float got = kernels::cpu::load_elem(o.data(), q0 * hq * d + i, s.dtype);
      cmp.max_o = std::max(cmp.max_o, std::isfinite(got) ? std::abs(double(got) - o_ref[i])
                                                         : std::numeric_limits<double>::infinity());
    }
    for (int64_t i = 0; i < int64_t(lse_ref.size()); ++i) {
      const float got = lse[q0 * hq + i];
      if (std::isinf(lse_ref[i]) || std::isinf(got)) {
        cmp.lse_inf_mismatch += !(std::isinf(lse_ref[i]) && std::isinf(got) && got < 0);
      } else {
        cmp.max_lse = std::max(cmp.max_lse, std::abs(double(got) - lse_ref[i]));
      }
    }
  }
  return cmp;
}

void expect_close(const PagedCase& c) {
  const Compare cmp = check_case(c);
  EXPECT_LE(cmp.max_o, output_tol(c.shape.dtype));
  EXPECT_LE(cmp.max_lse, kLseTol);
  EXPECT_EQ(cmp.lse_inf_mismatch, 0);
}

struct Combo {
  int hq, hk, d, page;
  DType dt;
  MaskMode mode;
};

TEST(AttentionRef, PagedPrefillMatchesDenseOverOddShapes) {
  // q_len/kv_len pairs: single token, q_len > kv_len under causal (rows that see nothing),
  // lengths that straddle page and tile boundaries, an empty request.
  const std::vector<int32_t> q_lens = {1, 7, 33, 5, 0, 20};
  const std::vector<int32_t> kv_lens = {1, 50, 33, 3, 9, 129};
  const Combo combos[] = {
      {4, 4, 64, 1, DType::kBF16, MaskMode::kCausal},
      {6, 2, 64, 3, DType::kF16, MaskMode::kNone},
      {8, 1, 128, 16, DType::kBF16, MaskMode::kNone},
      {3, 1, 128, 7, DType::kF16, MaskMode::kCausal},
      {4, 1, 64, 256, DType::kBF16, MaskMode::kCausal},
  };
  uint64_t seed = 10;
  for (const Combo& cb : combos) {
    PagedCaseShape s{q_lens, kv_lens, cb.hq, cb.hk, cb.d, cb.page, cb.dt, cb.mode, true};
    s.seed = seed++;
    SCOPED_TRACE(::testing::Message()
                 << "hq=" << cb.hq << " hk=" << cb.hk << " d=" << cb.d << " page=" << cb.page
                 << " dtype=" << dtype_name(cb.dt) << " causal=" << (cb.mode == MaskMode::kCausal));
    expect_close(PagedCase(s));
  }
}

// Sliding windows (causal): windows of one key, inside a page, across pages and past the history;
// the decode reference (one query per request) with the same window equals the prefill one.
TEST(AttentionRef, SlidingWindowMatchesDense) {
  const std::vector<int32_t> q_lens = {1, 7, 33, 5, 0, 20};
  const std::vector<int32_t> kv_lens = {1, 50, 33, 3, 9, 129};
  uint64_t seed = 40;
  for (int window : {1, 2, 15, 16, 40, 500})
    for (int page : {1, 16}) {
      PagedCaseShape s{q_lens, kv_lens, 4, 2, 64, page, DType::kBF16, MaskMode::kCausal, true};
      s.seed = seed++;
      s.window = window;
      SCOPED_TRACE(::testing::Message() << "window=" << window << " page=" << page);
      expect_close(PagedCase(s));
      // Decode: q_len 1 everywhere.
      PagedCaseShape dshape = s;
      dshape.q_lens.assign(kv_lens.size(), 1);
      dshape.q_lens[4] = 1;
      const PagedCase c(dshape);
      std::vector<uint16_t> o_pre(c.q.size()), o_dec(c.q.size());
      std::vector<float> l_pre(c.total_q * 4), l_dec(c.total_q * 4);
      kernels::cpu::paged_prefill_ref(c.params(o_pre.data(), l_pre.data()));
      kernels::cpu::decode_attention(c.decode_params(o_dec.data(), l_dec.data()));
      EXPECT_EQ(o_pre, o_dec);
      for (size_t i = 0; i < l_pre.size(); ++i) EXPECT_NEAR(l_pre[i], l_dec[i], 1e-5) << i;
    }
  PagedCaseShape bad{q_lens, kv_lens, 4, 2, 64, 16, DType::kBF16, MaskMode::kNone, true};
  bad.window = 8;  // a window needs causal positions
  const PagedCase c(bad);
  std::vector<uint16_t> o(c.q.size());
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(c.params(o.data(), nullptr)), Error);
}

// Consecutive pages per request (kv_contiguous): the case builder keeps the promise the CPU
// reference checks, and the result is the same attention.
TEST(AttentionRef, ContiguousPagesMatchDense) {
  for (int page : {1, 16}) {
    PagedCaseShape s{{1, 7, 0, 20}, {1, 50, 9, 129},   4,   2, 64, page,
                     DType::kBF16,  MaskMode::kCausal, true};
    s.contiguous_pages = true;
    s.seed = 60 + page;
    SCOPED_TRACE(::testing::Message() << "page=" << page);
    expect_close(PagedCase(s));  // the reference throws if a request's pages are not consecutive
  }
}

TEST(AttentionRef, BlockSparsePrefillMatchesDense) {
  // Lengths crossing several 128-token blocks, with a partial last block on both axes.
  const std::vector<int32_t> q_lens = {130, 200};
  const std::vector<int32_t> kv_lens = {300, 457};
  for (int per_head = 0; per_head < 2; ++per_head) {
    for (MaskMode mode : {MaskMode::kNone, MaskMode::kCausal}) {
      PagedCaseShape s{q_lens, kv_lens, 4, 2, 64, 16, DType::kBF16, mode, true};
      s.sparse_keep = 0.4;
      s.sparse_per_head = per_head;
      s.seed = 100 + per_head * 2 + (mode == MaskMode::kCausal);
      SCOPED_TRACE(::testing::Message()
                   << "per_head=" << per_head << " causal=" << (mode == MaskMode::kCausal));
      PagedCase c(s);
      // The mask must actually drop something, or this test checks nothing sparse.
      int zeros = 0;
      for (uint8_t m : c.block_mask) zeros += !m;
      ASSERT_GT(zeros, 0);
      expect_close(c);
    }
  }
}

TEST(AttentionRef, FullyMaskedRowsGiveZeroAndMinusInfLse) {
  // Causal with q_len > kv_len: the first q_len - kv_len queries see no key.
  PagedCaseShape s{{6}, {2}, 2, 1, 64, 4, DType::kF16, MaskMode::kCausal, true};
  PagedCase c(s);
  std::vector<uint16_t> o(c.q.size(), 0x7fff);
  std::vector<float> lse(c.total_q * 2, 0.f);
  kernels::cpu::paged_prefill_ref(c.params(o.data(), lse.data()));
  for (int t = 0; t < 4; ++t)
    for (int h = 0; h < 2; ++h) {
      EXPECT_TRUE(std::isinf(lse[t * 2 + h]) && lse[t * 2 + h] < 0) << t;
      for (int e = 0; e < 64; ++e) EXPECT_EQ(o[(t * 2 + h) * 64 + e], 0) << t;
    }
  EXPECT_TRUE(std::isfinite(lse[4 * 2]));
  expect_close(c);
}

TEST(AttentionRef, RowSubsetLeavesOtherRowsUntouched) {
  PagedCaseShape s{{9, 4}, {12, 30}, 2, 1, 64, 5, DType::kBF16, MaskMode::kCausal, true};
  PagedCase c(s);
  std::vector<uint16_t> full(c.q.size()), part(c.q.size(), 0xABCD);
  std::vector<float> lse_full(c.total_q * 2), lse_part(c.total_q * 2, 7.f);
  kernels::cpu::paged_prefill_ref(c.params(full.data(), lse_full.data()));
  const int32_t rows[] = {0, 8, 11};
  kernels::cpu::paged_prefill_ref(c.params(part.data(), lse_part.data()), rows, 3);
  for (int t = 0; t < int(c.total_q); ++t) {
    const bool picked = t == 0 || t == 8 || t == 11;
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(lse_part[t * 2 + h], picked ? lse_full[t * 2 + h] : 7.f) << t;
      for (int e = 0; e < 64; ++e) {
        const int64_t i = (int64_t(t) * 2 + h) * 64 + e;
        EXPECT_EQ(part[i], picked ? full[i] : 0xABCD) << t;
      }
    }
  }
}

// o_f32 gives the output before its one rounding: bf16(o_f32) is exactly the bf16 output.
TEST(AttentionRef, F32OutputIsTheUnroundedOutput) {
  testing::PagedCaseShape sh;
  sh.q_lens = {3, 17};
  sh.kv_lens = {40, 17};
  sh.num_qo_heads = 4;
  sh.num_kv_heads = 2;
  sh.head_dim = 16;
  sh.page_size = 8;
  sh.dtype = DType::kBF16;
  sh.mask_mode = kernels::MaskMode::kCausal;
  const testing::PagedCase c(sh);
  const size_t n = size_t(c.total_q) * 4 * 16;
  std::vector<uint16_t> o(n);
  std::vector<float> o32(n, NAN), lse(c.total_q * 4), lse32(c.total_q * 4);
  kernels::cpu::paged_prefill_ref(c.params(o.data(), lse.data()));
  kernels::PagedPrefillParams p = c.params(nullptr, lse32.data());
  p.o_f32 = o32.data();
  kernels::cpu::paged_prefill_ref(p);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(f32_to_bf16(o32[i]), o[i]) << i;
  EXPECT_EQ(lse, lse32);
}

TEST(AttentionRef, RejectsMalformedParams) {
  PagedCaseShape s{{3}, {10}, 4, 1, 64, 4, DType::kBF16, MaskMode::kNone, true};
  PagedCase c(s);
  std::vector<uint16_t> o(c.q.size());
  std::vector<float> lse(c.total_q * 4);
  auto p = c.params(o.data(), lse.data());
  p.num_kv_heads = 3;  // 4 q heads over 3 kv heads
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(p), Error);
  p = c.params(o.data(), lse.data());
  p.page_size = 300;
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(p), Error);
  p = c.params(o.data(), lse.data());
  EXPECT_THROW(kernels::cpu::check_paged_prefill_params(p, /*num_pages=*/1), Error);
  std::vector<int32_t> bad_last = {9};  // > page_size 4
  p.kv_last_page_len = bad_last.data();
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(p), Error);
  p = c.params(o.data(), lse.data());
  std::vector<uint8_t> mask(2, 1);  // wants 1 x 1 x 1 bytes
  std::vector<int64_t> mask_indptr = {0, 2};
  p.block_mask = mask.data();
  p.block_mask_indptr = mask_indptr.data();
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(p), Error);
  p.dtype = DType::kF32;
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(p), Error);
  // kv_contiguous over pages that are not consecutive (the builder shuffles them).
  PagedCaseShape s3{{2}, {30}, 4, 1, 64, 4, DType::kBF16, MaskMode::kNone, true};
  PagedCase c3(s3);
  c3.kv_indices = {5, 2, 3, 4, 0, 1, 6, 7};  // 8 pages of 4 tokens, 5 -> 2 breaks the run
  p = c3.params(o.data(), lse.data());
  p.kv_contiguous = true;
  try {
    kernels::cpu::paged_prefill_ref(p);
    ADD_FAILURE() << "no error for pages that are not consecutive";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not consecutive"), std::string::npos) << e.what();
  }
  p.kv_contiguous = false;
  kernels::cpu::paged_prefill_ref(p);  // the same pages are a valid table without the promise
}

}  // namespace
}  // namespace longctx
