// The MoE ops' CPU reference: routing against a brute-force top-k (ties included), the experts
// against a per-expert dense computation (transformers' loop over experts), a layer whose experts
// all equal one dense MLP against that MLP, and bad arguments named in errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/silu_and_mul.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

// Brute force: softmax, then k times the first expert of largest probability not yet taken.
void brute_route(const Tensor& logits, int64_t k, bool renorm, std::vector<int32_t>& ids,
                 std::vector<float>& w) {
  const int64_t t_count = logits.size(0), e = logits.size(1);
  ids.assign(t_count * k, -1);
  w.assign(t_count * k, 0.f);
  for (int64_t t = 0; t < t_count; ++t) {
    const float* l = logits.data<float>() + t * e;
    float mx = l[0];
    for (int64_t i = 1; i < e; ++i) mx = std::max(mx, l[i]);
    std::vector<float> p(e);
    float sum = 0.f;
    for (int64_t i = 0; i < e; ++i) sum += p[i] = std::exp(l[i] - mx);
    for (int64_t i = 0; i < e; ++i) p[i] /= sum;
    std::vector<bool> taken(e, false);
    float picked = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < e; ++i)
        if (!taken[i] && (best < 0 || p[i] > p[best])) best = i;  // strict: first index wins
      taken[best] = true;
      ids[t * k + j] = static_cast<int32_t>(best);
      w[t * k + j] = p[best];
      picked += p[best];
    }
    if (renorm)
      for (int64_t j = 0; j < k; ++j) w[t * k + j] /= picked;
  }
}

struct RouteCase {
  int64_t tokens, experts, k;
  bool renorm;
  int levels;  // > 0: logits drawn from that many values (many exact ties)
};

class MoeRoute : public ::testing::TestWithParam<RouteCase> {};

TEST_P(MoeRoute, EqualsBruteForce) {
  const RouteCase c = GetParam();
  Tensor logits = random_tensor({c.tokens, c.experts}, DType::kF32, 7 + c.experts + c.k, -4, 4);
  if (c.levels > 0) {
    std::mt19937 rng(c.tokens + c.levels);
    for (int64_t i = 0; i < logits.numel(); ++i)
      logits.data<float>()[i] = 0.5f * float(rng() % c.levels);
  }
  Tensor ids = Tensor::empty({c.tokens, c.k}, DType::kI32);
  Tensor w = Tensor::empty({c.tokens, c.k}, DType::kF32);
  ops::moe_route(logits, c.renorm, ids, w);
  std::vector<int32_t> want_ids;
  std::vector<float> want_w;
  brute_route(logits, c.k, c.renorm, want_ids, want_w);
  for (int64_t i = 0; i < c.tokens * c.k; ++i) {
    ASSERT_EQ(ids.data<int32_t>()[i], want_ids[i]) << "token " << i / c.k << " slot " << i % c.k;
    ASSERT_NEAR(w.data<float>()[i], want_w[i], 1e-6f) << "token " << i / c.k;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoeRoute,
    ::testing::Values(RouteCase{200, 8, 2, true, 0}, RouteCase{200, 60, 4, false, 0},
                      RouteCase{100, 128, 8, true, 0}, RouteCase{50, 128, 1, false, 0},
                      RouteCase{300, 8, 2, true, 3}, RouteCase{300, 64, 8, false, 2},
                      RouteCase{100, 16, 16, true, 0}));

TEST(MoeRoute, TiesTakeTheLowerExpert) {
  Tensor logits = Tensor::zeros({1, 6}, DType::kF32);  // all equal
  logits.data<float>()[4] = 1.0f;                      // one clear winner
  Tensor ids = Tensor::empty({1, 3}, DType::kI32);
  Tensor w = Tensor::empty({1, 3}, DType::kF32);
  ops::moe_route(logits, true, ids, w);
  EXPECT_EQ(ids.data<int32_t>()[0], 4);
  EXPECT_EQ(ids.data<int32_t>()[1], 0);
  EXPECT_EQ(ids.data<int32_t>()[2], 1);
  EXPECT_FLOAT_EQ(w.data<float>()[1], w.data<float>()[2]);
  EXPECT_NEAR(w.data<float>()[0] + w.data<float>()[1] + w.data<float>()[2], 1.0f, 1e-6f);
}

// dense(x) = down @ (silu(gate @ x) * (up @ x)) through the dense ops, [T, hidden] f32.
Tensor dense_mlp(const Tensor& x, const Tensor& gate_up, const Tensor& down) {
  const int64_t t = x.size(0), n = gate_up.size(0) / 2;
  Tensor gu = Tensor::empty({t, 2 * n}, DType::kF32);
  ops::linear(x, gate_up, Tensor(), gu);
  Tensor act = Tensor::empty({t, n}, DType::kF32);
  ops::silu_and_mul(gu.slice(1, 0, n), gu.slice(1, n, 2 * n), act);
  Tensor out = Tensor::empty({t, down.size(0)}, DType::kF32);
  ops::linear(act, down, Tensor(), out);
  return out;
}

TEST(MoeExperts, EveryExpertEqualIsTheDenseMlp) {
  const int64_t t = 37, h = 48, n = 24, e = 8, k = 3;
  Tensor x = random_tensor({t, h}, DType::kF32, 1);
  Tensor gate_up1 = random_tensor({2 * n, h}, DType::kF32, 2, -0.3f, 0.3f);
  Tensor down1 = random_tensor({h, n}, DType::kF32, 3, -0.3f, 0.3f);
  Tensor gate_up = Tensor::empty({e, 2 * n, h}, DType::kF32);
  Tensor down = Tensor::empty({e, h, n}, DType::kF32);
  for (int64_t i = 0; i < e; ++i) {
    gate_up.select(0, i).copy_from(gate_up1);
    down.select(0, i).copy_from(down1);
  }
  Tensor router = random_tensor({e, h}, DType::kF32, 4);
  Tensor logits = Tensor::empty({t, e}, DType::kF32);
  ops::linear(x, router, Tensor(), logits);
  ops::MoeArgs a;
  a.x = x;
  a.topk_ids = Tensor::empty({t, k}, DType::kI32);
  a.topk_weights = Tensor::empty({t, k}, DType::kF32);
  ops::moe_route(logits, /*renormalize=*/true, a.topk_ids, a.topk_weights);
  a.gate_up = gate_up;
  a.down = down;
  a.out = Tensor::empty({t, h}, DType::kF32);
  ops::moe_experts(a);
  Tensor want = dense_mlp(x, gate_up1, down1);
  std::vector<double> wv(want.data<float>(), want.data<float>() + want.numel());
  EXPECT_LE(max_abs_diff(a.out, wv), 1e-5);
}

// transformers' Qwen2MoeExperts loop: for each expert, its tokens through a dense MLP, weighted,
// added (here over all tokens with the weight 0 where not routed), plus the gated shared expert.
TEST(MoeExperts, EqualsPerExpertDenseLoop) {
  for (DType wdt : {DType::kF32, DType::kBF16}) {
    const int64_t t = 29, h = 40, n = 12, e = 16, k = 4;
    Tensor x = random_tensor({t, h}, DType::kF32, 11);
    Tensor gate_up = random_tensor({e, 2 * n, h}, wdt, 12, -0.3f, 0.3f);
    Tensor down = random_tensor({e, h, n}, wdt, 13, -0.3f, 0.3f);
    Tensor logits = random_tensor({t, e}, DType::kF32, 14, -3, 3);
    ops::MoeArgs a;
    a.x = x;
    a.topk_ids = Tensor::empty({t, k}, DType::kI32);
    a.topk_weights = Tensor::empty({t, k}, DType::kF32);
    ops::moe_route(logits, false, a.topk_ids, a.topk_weights);
    a.gate_up = gate_up;
    a.down = down;
    a.shared = random_tensor({t, h}, DType::kF32, 15);
    a.shared_gate = random_tensor({t, 1}, DType::kF32, 16, -2, 2);
    a.out = Tensor::empty({t, h}, DType::kF32);
    ops::moe_experts(a);
    std::vector<double> want(t * h, 0.0);
    for (int64_t ex = 0; ex < e; ++ex) {
      Tensor y = dense_mlp(x, gate_up.select(0, ex).to_dtype(DType::kF32),
                           down.select(0, ex).contiguous().to_dtype(DType::kF32));
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < k; ++j)
          if (a.topk_ids.data<int32_t>()[i * k + j] == ex)
            for (int64_t c = 0; c < h; ++c)
              want[i * h + c] +=
                  double(a.topk_weights.data<float>()[i * k + j]) * y.data<float>()[i * h + c];
    }
    for (int64_t i = 0; i < t; ++i) {
      const double g = a.shared_gate.data<float>()[i];
      for (int64_t c = 0; c < h; ++c)
        want[i * h + c] += a.shared.data<float>()[i * h + c] / (1.0 + std::exp(-g));
    }
    EXPECT_LE(max_abs_diff(a.out, want), 1e-5) << dtype_name(wdt);
  }
}

// moe_forward is moe_route then moe_experts on the routing it writes; logits of another expert
// count are refused by name.
TEST(MoeForward, EqualsRouteThenExperts) {
  const int64_t t = 7, h = 24, n = 8, e = 12, k = 3;
  ops::MoeArgs a;
  a.x = random_tensor({t, h}, DType::kF32, 21);
  a.gate_up = random_tensor({e, 2 * n, h}, DType::kBF16, 22, -0.3f, 0.3f);
  a.down = random_tensor({e, h, n}, DType::kBF16, 23, -0.3f, 0.3f);
  a.shared = random_tensor({t, h}, DType::kF32, 24);
  a.shared_gate = random_tensor({t, 1}, DType::kF32, 25, -2, 2);
  const Tensor logits = random_tensor({t, e}, DType::kF32, 26, -3, 3);
  for (bool renorm : {false, true}) {
    ops::MoeArgs want = a, got = a;
    want.topk_ids = Tensor::empty({t, k}, DType::kI32);
    want.topk_weights = Tensor::empty({t, k}, DType::kF32);
    want.out = Tensor::empty({t, h}, DType::kF32);
    ops::moe_route(logits, renorm, want.topk_ids, want.topk_weights);
    ops::moe_experts(want);
    got.topk_ids = Tensor::zeros({t, k}, DType::kI32);
    got.topk_weights = Tensor::zeros({t, k}, DType::kF32);
    got.out = Tensor::zeros({t, h}, DType::kF32);
    ops::moe_forward(logits, renorm, got);
    for (int64_t i = 0; i < t * k; ++i) {
      EXPECT_EQ(got.topk_ids.data<int32_t>()[i], want.topk_ids.data<int32_t>()[i]);
      EXPECT_EQ(got.topk_weights.data<float>()[i], want.topk_weights.data<float>()[i]);
    }
    for (int64_t i = 0; i < t * h; ++i)
      ASSERT_EQ(got.out.data<float>()[i], want.out.data<float>()[i]) << i;
  }
  ops::MoeArgs b = a;
  b.topk_ids = Tensor::zeros({t, k}, DType::kI32);
  b.topk_weights = Tensor::zeros({t, k}, DType::kF32);
  b.out = Tensor::zeros({t, h}, DType::kF32);
  try {
    ops::moe_forward(Tensor::zeros({t, e + 1}, DType::kF32), true, b);
    ADD_FAILURE() << "logits of 13 experts accepted for 12";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("12 experts"), std::string::npos) << err.what();
  }
}

// What moe_experts throws for `args` ("" when it runs).
std::string moe_experts_error(const ops::MoeArgs& args) {
  try {
    ops::moe_experts(args);
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

TEST(MoeExperts, BadArgumentsAreNamed) {
  const int64_t t = 3, h = 8, n = 4, e = 4, k = 2;
  ops::MoeArgs a;
  a.x = Tensor::zeros({t, h}, DType::kF32);
  a.topk_ids = Tensor::zeros({t, k}, DType::kI32);
  a.topk_weights = Tensor::zeros({t, k}, DType::kF32);
  a.gate_up = Tensor::zeros({e, 2 * n, h}, DType::kF32);
  a.down = Tensor::zeros({e, h, n}, DType::kF32);
  a.out = Tensor::zeros({t, h}, DType::kF32);
  EXPECT_EQ(moe_experts_error(a), "");
  ops::MoeArgs b = a;
  b.down = Tensor::zeros({e, h, n + 1}, DType::kF32);
  EXPECT_NE(moe_experts_error(b).find("down"), std::string::npos) << moe_experts_error(b);
  b = a;
  b.topk_ids = Tensor::zeros({t, k}, DType::kI32);
  b.topk_ids.data<int32_t>()[3] = e;
  EXPECT_NE(moe_experts_error(b).find("topk_ids[3] = 4"), std::string::npos)
      << moe_experts_error(b);
  b = a;
  b.shared = Tensor::zeros({t, h}, DType::kF32);
  EXPECT_NE(moe_experts_error(b).find("shared_gate"), std::string::npos) << moe_experts_error(b);
  Tensor logits = Tensor::zeros({t, e}, DType::kF32);
  EXPECT_THROW(ops::moe_route(logits, true, Tensor::zeros({t, e + 1}, DType::kI32),
                              Tensor::zeros({t, e + 1}, DType::kF32)),
               Error);
}

// FP8 block experts: random codes and block scales. `dense` gets the same experts dequantized to
// f32 (code * scale of its block, gate and up blocked apart) as the loader dequantizes them.
struct Fp8ExpertCase {
  ops::MoeArgs fp8, dense;
};

Fp8ExpertCase fp8_experts(int64_t e, int64_t n, int64_t h, int64_t bo, int64_t bi) {
  auto blocks = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  Fp8ExpertCase c;
  ops::MoeArgs& a = c.fp8;
  a.block_out = bo;
  a.block_in = bi;
  a.gate_up = Tensor::empty({e, 2 * n, h}, DType::kFP8E4M3);
  a.down = Tensor::empty({e, h, n}, DType::kFP8E4M3);
  a.gate_up_scales =
      random_tensor({e, 2 * blocks(n, bo), blocks(h, bi)}, DType::kF32, 31, 0.001f, 0.01f);
  a.down_scales = random_tensor({e, blocks(h, bo), blocks(n, bi)}, DType::kF32, 32, 0.001f, 0.01f);
  std::mt19937 rng(33);
  for (const Tensor* t : {&a.gate_up, &a.down}) {
    uint8_t* p = t->data<uint8_t>();
    for (int64_t i = 0; i < t->numel(); ++i) {
      uint8_t code = static_cast<uint8_t>(rng());
      if ((code & 0x7f) == 0x7f) code ^= 1;  // not a NaN
      p[i] = code;
    }
  }
  // Expert x's [rows, cols] from its codes and the block rows starting at `block0`.
  auto dequant = [&](const Tensor& codes, const Tensor& scales, int64_t x, int64_t rows,
                     int64_t cols, int64_t row0, int64_t block0, float* out) {
    const uint8_t* q = codes.data<uint8_t>() + (x * codes.size(1) + row0) * cols;
    const float* s = scales.data<float>() + x * scales.size(1) * scales.size(2);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col)
        out[r * cols + col] =
            fp8e4m3_to_f32(q[r * cols + col]) * s[(block0 + r / bo) * scales.size(2) + col / bi];
  };
  c.dense.gate_up = Tensor::empty({e, 2 * n, h}, DType::kF32);
  c.dense.down = Tensor::empty({e, h, n}, DType::kF32);
  for (int64_t x = 0; x < e; ++x) {
    float* gu = c.dense.gate_up.data<float>() + x * 2 * n * h;
    dequant(a.gate_up, a.gate_up_scales, x, n, h, 0, 0, gu);
    dequant(a.gate_up, a.gate_up_scales, x, n, h, n, blocks(n, bo), gu + n * h);
    dequant(a.down, a.down_scales, x, h, n, 0, 0, c.dense.down.data<float>() + x * h * n);
  }
  return c;
}

// FP8 experts give the bits of the same experts dequantized to f32 first (the CPU twin converts
// each row in f32, then the same sums), through moe_experts and moe_forward; blocks that do not
// divide inter or hidden included (gate's last block row is partial, up's starts apart).
TEST(MoeExperts, Fp8BlocksEqualTheirF32Dequantization) {
  const int64_t t = 9, h = 40, n = 12, e = 6, k = 2;
  for (auto [bo, bi] : {std::pair<int64_t, int64_t>{8, 16}, {128, 128}, {4, 8}}) {
    Fp8ExpertCase c = fp8_experts(e, n, h, bo, bi);
    const Tensor logits = random_tensor({t, e}, DType::kF32, 34, -3, 3);
    for (ops::MoeArgs* a : {&c.fp8, &c.dense}) {
      a->x = random_tensor({t, h}, DType::kF32, 35);
      a->shared = random_tensor({t, h}, DType::kF32, 36);
      a->shared_gate = random_tensor({t, 1}, DType::kF32, 37, -2, 2);
      a->topk_ids = Tensor::empty({t, k}, DType::kI32);
      a->topk_weights = Tensor::empty({t, k}, DType::kF32);
      a->out = Tensor::empty({t, h}, DType::kF32);
      ops::moe_forward(logits, true, *a);
    }
    for (int64_t i = 0; i < t * h; ++i)
      ASSERT_EQ(c.fp8.out.data<float>()[i], c.dense.out.data<float>()[i]) << bo << "x" << bi;
    ops::MoeArgs again = c.fp8;
    again.out = Tensor::zeros({t, h}, DType::kF32);
    ops::moe_experts(again);
    for (int64_t i = 0; i < t * h; ++i)
      ASSERT_EQ(again.out.data<float>()[i], c.dense.out.data<float>()[i]) << bo << "x" << bi;
  }
  EXPECT_TRUE(ops::moe_runs_fp8_experts(Device::cpu()));
}

// FP8 experts' scales, codes and block sizes are checked by name.
TEST(MoeExperts, BadFp8ExpertsAreNamed) {
  const int64_t t = 3, h = 16, n = 8, e = 4, k = 2;
  ops::MoeArgs a = fp8_experts(e, n, h, 4, 8).fp8;
  a.x = Tensor::zeros({t, h}, DType::kF32);
  a.topk_ids = Tensor::zeros({t, k}, DType::kI32);
  a.topk_weights = Tensor::zeros({t, k}, DType::kF32);
  a.out = Tensor::zeros({t, h}, DType::kF32);
  EXPECT_EQ(moe_experts_error(a), "");
  ops::MoeArgs b = a;
  b.gate_up_scales = Tensor::zeros({e, 2, 2}, DType::kF32);  // one block row per expert: 4 wanted
  EXPECT_NE(moe_experts_error(b).find("gate_up_scales"), std::string::npos) << moe_experts_error(b);
  b = a;
  b.down_scales = Tensor::zeros({e, 4, 2}, DType::kF32);
  EXPECT_NE(moe_experts_error(b).find("down_scales"), std::string::npos) << moe_experts_error(b);
  b = a;
  b.down_scales = Tensor::zeros({e, 4, 1}, DType::kBF16);
  EXPECT_NE(moe_experts_error(b).find("down_scales"), std::string::npos) << moe_experts_error(b);
  b = a;
  b.block_in = 0;
  EXPECT_NE(moe_experts_error(b).find("block sizes"), std::string::npos) << moe_experts_error(b);
  b = a;
  b.gate_up = Tensor::zeros({e, 2 * n, h}, DType::kF32);  // float weights beside scales
  EXPECT_NE(moe_experts_error(b).find("gate_up"), std::string::npos) << moe_experts_error(b);
}

}  // namespace
