// The CPU decode reference against direct dense attention (double precision) over the gathered
// keys of each request: odd KV lengths (0 included), page sizes 1/16/128, GQA 1/4/8, head_dim
// 64/128, bf16/f16, shuffled page tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_cpu.h"
#include "kernels/decode_params.h"
#include "kernels/decode_test_util.h"
#include "kernels/paged_case.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using testing::PagedCase;
using testing::PagedCaseShape;

// Output tolerance: one rounding of a |o| <= ~1.7 value to bf16/f16 plus accumulation noise.
double out_tol(DType dt) { return dt == DType::kBF16 ? 8e-3 : 1.5e-3; }

void check(const PagedCaseShape& s) {
  PagedCase c(s);
  const int hq = s.num_qo_heads, hk = s.num_kv_heads, D = s.head_dim, g = hq / hk;
  const int batch = int(s.kv_lens.size());
  std::vector<uint16_t> o(int64_t(batch) * hq * D, 0x7fff);
  std::vector<float> lse(int64_t(batch) * hq, 12345.f);
  kernels::cpu::decode_attention(c.decode_params(o.data(), lse.data()));
  const double scale = 1.0 / std::sqrt(double(D));
  double max_o = 0, max_lse = 0;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < hq; ++h) {
      std::vector<float> q(D);
      for (int d = 0; d < D; ++d)
        q[d] = testing::half_to_f32(c.q[(int64_t(b) * hq + h) * D + d], s.dtype);
      std::vector<std::vector<float>> k, v;
      for (int j = 0; j < s.kv_lens[b]; ++j) {
        const int64_t page = c.kv_indices[c.kv_indptr[b] + j / s.page_size];
        const int64_t off = ((page * s.page_size + j % s.page_size) * hk + h / g) * D;
        k.emplace_back(D);
        v.emplace_back(D);
        for (int d = 0; d < D; ++d) {
          k.back()[d] = testing::half_to_f32(c.k_cache[off + d], s.dtype);
          v.back()[d] = testing::half_to_f32(c.v_cache[off + d], s.dtype);
        }
      }
      std::vector<double> ref;
      const double ref_lse = testing::dense_row(q, k, v, scale, ref);
      for (int d = 0; d < D; ++d) {
        const float got = testing::half_to_f32(o[(int64_t(b) * hq + h) * D + d], s.dtype);
        ASSERT_TRUE(std::isfinite(got)) << "b " << b << " h " << h << " d " << d;
        max_o = std::max(max_o, std::abs(got - ref[d]));
      }
      const float got_lse = lse[int64_t(b) * hq + h];
      if (std::isinf(ref_lse)) {
        EXPECT_TRUE(std::isinf(got_lse) && got_lse < 0) << "empty request " << b;
      } else {
        max_lse = std::max(max_lse, std::abs(got_lse - ref_lse));
      }
    }
  }
  EXPECT_LE(max_o, out_tol(s.dtype));
  EXPECT_LE(max_lse, 1e-4);
}

TEST(DecodeRef, MatchesDenseOverShapes) {
  int seed = 1;
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int page : {1, 16, 128})
      for (int group : {1, 4, 8})
        for (int D : {64, 128}) {
          PagedCaseShape s;
          s.kv_lens = {0, 1, 17, 130, 300};
          s.q_lens.assign(s.kv_lens.size(), 1);
          s.num_kv_heads = 2;
          s.num_qo_heads = 2 * group;
          s.head_dim = D;
          s.page_size = page;
          s.dtype = dt;
          s.seed = uint64_t(seed++);
          SCOPED_TRACE(::testing::Message() << "page " << page << " group " << group << " D " << D
                                            << " " << dtype_name(dt));
          check(s);
        }
}

TEST(DecodeRef, OddGroupAndHeadDim) {
  PagedCaseShape s;
  s.kv_lens = {33, 7};
  s.q_lens = {1, 1};
  s.num_kv_heads = 1;
  s.num_qo_heads = 3;
  s.head_dim = 40;
  s.page_size = 5;
  check(s);
}

// q rows q_token_stride apart (a view of a fused QKV output) give the contiguous result exactly.
TEST(DecodeRef, StridedQEqualsContiguous) {
  PagedCaseShape s;
  s.kv_lens = {70, 0, 129};
  s.q_lens = {1, 1, 1};
  s.num_qo_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.page_size = 16;
  PagedCase c(s);
  const int64_t row = 8 * 64, stride = row + 2 * 2 * 64;
  std::vector<uint16_t> o(3 * row), o_strided(3 * row);
  std::vector<float> lse(3 * 8), lse_strided(3 * 8);
  kernels::cpu::decode_attention(c.decode_params(o.data(), lse.data()));
  std::vector<uint16_t> q(3 * stride, 0x7fc0);  // NaN between the rows: must not be read
  for (int b = 0; b < 3; ++b) std::copy_n(c.q.begin() + b * row, row, q.begin() + b * stride);
  auto p = c.decode_params(o_strided.data(), lse_strided.data());
  p.q = q.data();
  p.q_token_stride = stride;
  kernels::cpu::decode_attention(p);
  EXPECT_EQ(o_strided, o);
  for (size_t i = 0; i < lse.size(); ++i)
    EXPECT_TRUE(lse_strided[i] == lse[i] || (std::isinf(lse[i]) && std::isinf(lse_strided[i])));
}

TEST(DecodeRef, RejectsBadParams) {
  PagedCaseShape s;
  s.kv_lens = {9};
  s.q_lens = {1};
  s.num_qo_heads = 3;
  s.num_kv_heads = 2;
  PagedCase c(s);
  std::vector<uint16_t> o(3 * 64);
  auto p = c.decode_params(o.data(), nullptr);
  EXPECT_THROW(kernels::cpu::decode_attention(p), Error);  // 3 q heads over 2 kv heads
  p.num_qo_heads = 2;
  std::vector<int32_t> bad_last = {0};
  p.kv_last_page_len = bad_last.data();  // one page but an empty last page
  EXPECT_THROW(kernels::cpu::decode_attention(p), Error);
}

}  // namespace
}  // namespace longctx
