// The CPU decode reference with several queries per request (a speculative verify step) against
// the paged prefill reference, which states the same rules independently (MaskMode::kCausal's
// tail, kNone, the sliding window): mixed query counts in one batch (0 and 1 among them), GQA
// 1/4/8, head_dim 64/128, page sizes 1/16/128, requests shorter than their queries.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/decode_params.h"
#include "kernels/decode_test_util.h"
#include "kernels/paged_case.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using testing::PagedCase;
using testing::PagedCaseShape;

// Both references accumulate in fp32 and round o once: they differ by accumulation order only.
void check_against_prefill(const PagedCaseShape& s) {
  PagedCase c(s);
  const int64_t rows = c.total_q * s.num_qo_heads;
  std::vector<uint16_t> o(rows * s.head_dim, 0x7fff), o_ref(rows * s.head_dim, 0x7fff);
  std::vector<float> lse(rows, 12345.f), lse_ref(rows, 12345.f);
  kernels::cpu::decode_attention(c.decode_params(o.data(), lse.data()));
  kernels::cpu::paged_prefill_ref(c.params(o_ref.data(), lse_ref.data()));
  const double tol = s.dtype == DType::kBF16 ? 1.6e-2 : 2e-3;
  for (int64_t r = 0; r < rows; ++r) {
    if (std::isinf(lse_ref[r])) {
      EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << r << " sees no key";
    } else {
      ASSERT_NEAR(lse[r], lse_ref[r], 1e-3) << "row " << r;
    }
    for (int d = 0; d < s.head_dim; ++d) {
      const float got = testing::half_to_f32(o[r * s.head_dim + d], s.dtype);
      const float want = testing::half_to_f32(o_ref[r * s.head_dim + d], s.dtype);
      ASSERT_TRUE(std::isfinite(got)) << "row " << r << " d " << d;
      ASSERT_NEAR(got, want, tol) << "row " << r << " d " << d;
    }
  }
}

TEST(DecodeVerifyRef, CausalTailMatchesThePrefillReference) {
  for (int group : {1, 4, 8})
    for (int d : {64, 128})
      for (int page : {1, 16, 128}) {
        if ((group + d / 64 + page) % 2 == 0) continue;  // half the grid: every value 3 times
        PagedCaseShape s;
        // Verify steps of K + 1 = 9, 16 and 2 beside plain decode rows, one request without
        // queries and one with fewer keys than queries (its first rows see no key).
        s.q_lens = {9, 1, 16, 0, 2, 5};
        s.kv_lens = {260, 33, 130, 40, 1, 3};
        s.num_kv_heads = 2;
        s.num_qo_heads = 2 * group;
        s.head_dim = d;
        s.page_size = page;
        s.mask_mode = kernels::MaskMode::kCausal;
        s.seed = uint64_t(group * 1000 + d + page);
        SCOPED_TRACE(::testing::Message() << "group " << group << " d " << d << " page " << page);
        check_against_prefill(s);
      }
}

TEST(DecodeVerifyRef, SlidingWindowComposesPerQuery) {
  for (int window : {1, 7, 64, 100}) {
    PagedCaseShape s;
    s.q_lens = {9, 1, 4};
    s.kv_lens = {300, 90, 64};
    s.num_qo_heads = 8;
    s.num_kv_heads = 2;
    s.dtype = DType::kF16;
    s.mask_mode = kernels::MaskMode::kCausal;
    s.window = window;
    SCOPED_TRACE(::testing::Message() << "window " << window);
    check_against_prefill(s);
  }
}

TEST(DecodeVerifyRef, NoMaskLetsEveryQuerySeeEveryKey) {
  // The offload path's ring items: keys that precede every query.
  PagedCaseShape s;
  s.q_lens = {9, 3, 1};
  s.kv_lens = {256, 17, 0};
  s.num_qo_heads = 4;
  s.num_kv_heads = 1;
  s.mask_mode = kernels::MaskMode::kNone;
  check_against_prefill(s);
}

TEST(DecodeVerifyRef, OneQueryEachEqualsTheDefaultRows) {
  // qo_indptr of all ones is the same call as no qo_indptr.
  PagedCaseShape s;
  s.q_lens = {1, 1, 1};
  s.kv_lens = {100, 7, 64};
  s.window = 50;
  s.mask_mode = kernels::MaskMode::kCausal;
  PagedCase c(s);
  std::vector<uint16_t> a(3 * 4 * 64), b(a.size());
  std::vector<float> la(12), lb(12);
  kernels::DecodeParams p = c.decode_params(a.data(), la.data());
  ASSERT_EQ(p.qo_indptr, nullptr);
  kernels::cpu::decode_attention(p);
  p.o = b.data();
  p.lse = lb.data();
  p.qo_indptr = c.qo_indptr.data();
  kernels::cpu::decode_attention(p);
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
}

TEST(DecodeVerifyRef, RejectsTooManyQueries) {
  PagedCaseShape s;
  s.q_lens = {kernels::kDecodeMaxQLen + 1};
  s.kv_lens = {64};
  s.mask_mode = kernels::MaskMode::kCausal;
  PagedCase c(s);
  std::vector<uint16_t> o(c.total_q * 4 * 64);
  EXPECT_THROW(kernels::cpu::decode_attention(c.decode_params(o.data(), nullptr)), Error);
  std::vector<int32_t> bad = {1, 18};  // qo_indptr[0] != 0
  kernels::DecodeParams p = c.decode_params(o.data(), nullptr);
  p.qo_indptr = bad.data();
  EXPECT_THROW(kernels::cpu::decode_attention(p), Error);
}

}  // namespace
}  // namespace longctx
