// RaggedBlockCausalAttention on the CPU device (the CPU reference of the paged prefill under the
// block-causal plan) against dense attention with the block-causal mask built from the
// definition; plus every error case of the API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/block_causal_test_util.h"
#include "longctx/attention/block_causal.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"

namespace longctx {
namespace {

struct Packed {
  Tensor q, k, v;
  std::vector<uint16_t> qh, kh, vh;
};

Packed make_packed(int64_t n, int hq, int hk, int D, DType dt, uint32_t seed) {
  Packed p;
  p.qh = testing::random_half(n * hq * D, dt, seed);
  p.kh = testing::random_half(n * hk * D, dt, seed + 1);
  p.vh = testing::random_half(n * hk * D, dt, seed + 2);
  p.q = Tensor::from_blob(p.qh.data(), {n, hq, D}, dt);
  p.k = Tensor::from_blob(p.kh.data(), {n, hk, D}, dt);
  p.v = Tensor::from_blob(p.vh.data(), {n, hk, D}, dt);
  return p;
}

BlockCausalOptions options(int hq, int hk, int D, int64_t B, DType dt) {
  BlockCausalOptions o;
  o.num_qo_heads = hq;
  o.num_kv_heads = hk;
  o.head_dim = D;
  o.block_size = B;
  o.q_dtype = dt;
  return o;
}

void expect_block_causal(RaggedBlockCausalAttention& attn, const Packed& p,
                         const std::vector<int64_t>& seg, int64_t B, int hq, int hk, int D,
                         DType dt) {
  attn.plan(seg);
  const int64_t total = std::accumulate(seg.begin(), seg.end(), int64_t(0));
  EXPECT_EQ(attn.num_segments(), int64_t(seg.size()));
  EXPECT_EQ(attn.total_tokens(), total);
  Tensor out = attn.run(p.q, p.k, p.v);
  ASSERT_EQ(out.shape(), (Shape{p.q.size(0), hq, D}));
  std::vector<int64_t> rows(total);
  std::iota(rows.begin(), rows.end(), 0);
  auto ref = testing::dense_block_causal(p.qh, p.kh, p.vh, seg, B, hq, hk, D, dt,
                                         1.0 / std::sqrt(double(D)), rows);
  const uint16_t* o = out.data<uint16_t>();
  double max_err = 0;
  for (int64_t i = 0; i < total * hq * D; ++i) {
    const float got = testing::half_to_f32(o[i], dt);
    ASSERT_TRUE(std::isfinite(got)) << i;
    max_err = std::max(max_err, std::abs(got - ref[i]));
  }
  EXPECT_LE(max_err, dt == DType::kBF16 ? 8e-3 : 1.5e-3);
}

TEST(BlockCausalCpu, MatchesDenseBlockCausalMask) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t B : {1, 4, 16, 64}) {
      const int hq = 4, hk = 2, D = 32;
      std::vector<int64_t> seg = {37, 5, 64, 1, 100};
      Packed p = make_packed(210, hq, hk, D, dt, uint32_t(B));  // 3 rows past the total
      RaggedBlockCausalAttention attn(Tensor(), options(hq, hk, D, B, dt));
      SCOPED_TRACE(::testing::Message() << "B " << B << " " << dtype_name(dt));
      expect_block_causal(attn, p, seg, B, hq, hk, D, dt);
    }
  }
}

TEST(BlockCausalCpu, ReplansManyLayoutsWithOneObject) {
  const int hq = 8, hk = 1, D = 16;
  const int64_t B = 8;
  auto opt = options(hq, hk, D, B, DType::kBF16);
  opt.max_num_segments = 4;
  opt.max_total_tokens = 60;
  RaggedBlockCausalAttention attn(Tensor(), opt);
  Packed p = make_packed(60, hq, hk, D, DType::kBF16, 9);
  for (const auto& seg :
       std::vector<std::vector<int64_t>>{{60}, {1, 1, 1, 57}, {8, 16, 24, 12}, {9}, {30, 30}}) {
    expect_block_causal(attn, p, seg, B, hq, hk, D, DType::kBF16);
  }
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(e.code(), ErrorCode::kInternal) << e.what();
  }
}

TEST(BlockCausalCpu, Errors) {
  const int hq = 4, hk = 2, D = 16;
  auto opt = options(hq, hk, D, 4, DType::kBF16);
  expect_error([&] { RaggedBlockCausalAttention a(Tensor(), options(hq, hk, D, 0, DType::kBF16)); },
               "block_size");
  expect_error([&] { RaggedBlockCausalAttention a(Tensor(), options(3, 2, D, 4, DType::kBF16)); },
               "num_kv_heads");
  expect_error([&] { RaggedBlockCausalAttention a(Tensor(), options(hq, hk, D, 4, DType::kF32)); },
               "dtype");
  {
    auto g = opt;
    g.graph_mode = true;
    expect_error([&] { RaggedBlockCausalAttention a(Tensor(), g); }, "max_num_segments");
    g.max_num_segments = 2;
    g.max_total_tokens = 10;
    expect_error([&] { RaggedBlockCausalAttention a(Tensor(), g); }, "CUDA");
  }
  auto lim = opt;
  lim.max_num_segments = 2;
  lim.max_total_tokens = 10;
  RaggedBlockCausalAttention attn(Tensor(), lim);
  Packed p = make_packed(10, hq, hk, D, DType::kBF16, 1);
  expect_error([&] { attn.run(p.q, p.k, p.v); }, "plan");
  expect_error([&] { attn.plan({}); }, "empty");
  expect_error([&] { attn.plan({3, 0}); }, "span 1");
  expect_error([&] { attn.plan({-3}); }, "span 0");
  expect_error([&] { attn.plan({1, 1, 1}); }, "max_num_segments");
  expect_error([&] { attn.plan({6, 5}); }, "max_total_tokens");
  attn.plan({6, 4});
  Packed wrong_heads = make_packed(10, hq, hq, D, DType::kBF16, 2);
  expect_error([&] { attn.run(p.q, wrong_heads.k, p.v); }, "k has shape");
  Packed f16 = make_packed(10, hq, hk, D, DType::kF16, 3);
  expect_error([&] { attn.run(f16.q, p.k, p.v); }, "dtype");
  Packed short_rows = make_packed(9, hq, hk, D, DType::kBF16, 4);
  expect_error([&] { attn.run(short_rows.q, p.k, p.v); }, "10 tokens");
  expect_error([&] { attn.run(p.q, p.k, short_rows.v); }, "10 tokens");
  Tensor out = Tensor::empty({10, hq, D + 1}, DType::kBF16);
  expect_error([&] { attn.run(p.q, p.k, p.v, out); }, "out has shape");
  EXPECT_EQ(attn.run(p.q, p.k, p.v).size(0), 10);  // still valid after the errors
}

}  // namespace
}  // namespace longctx
