// RoPE: frequencies against values worked out from transformers' formulas, the rotation against
// the direct formula (pairs i and i + d/2 rotated by float32 position * inv_freq).
#include <gtest/gtest.h>

#include <cmath>

#include "ops/rope.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

TEST(RopeInvFreq, DefaultIsThetaPower) {
  RopeConfig rc;
  rc.theta = 1e6;
  std::vector<float> f = ops::rope_inv_freq(rc, 64);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(f[i], std::pow(1e6, -2.0 * i / 64), 2e-7 * f[i]) << i;
  EXPECT_EQ(f[0], 1.0f);
}

TEST(RopeInvFreq, LinearDividesByFactor) {
  RopeConfig rc;
  rc.theta = 10000;
  std::vector<float> base = ops::rope_inv_freq(rc, 128);
  rc.type = RopeType::kLinear;
  rc.factor = 4;
  std::vector<float> lin = ops::rope_inv_freq(rc, 128);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(lin[i], base[i] / 4.0f) << i;
}

TEST(RopeInvFreq, Llama3MatchesHandComputedValues) {
  // tiny-llama3's rope: theta 5e5, head_dim 16, factor 8, low 1, high 4, original 256. Worked
  // out in double from _compute_llama3_parameters: wavelen = 2 pi / f; wavelen < 64 keeps f,
  // wavelen > 256 divides by 8, in between smooth = (256 / wavelen - 1) / 3 and
  // f' = (1 - smooth) * f / 8 + smooth * f.
  RopeConfig rc;
  rc.type = RopeType::kLlama3;
  rc.theta = 5e5;
  rc.factor = 8;
  rc.low_freq_factor = 1;
  rc.high_freq_factor = 4;
  rc.original_max_position_embeddings = 256;
  const double expected[8] = {1.0,
                              0.19392274474868576,   // high: kept
                              0.010538232746455323,  // medium: smoothed
                              0.0009115830921521386,
                              0.00017677669529663688,  // low: / 8
                              3.428102195952591e-05,
                              6.647869871181236e-06,
                              1.2891731721515574e-06};
  std::vector<float> f = ops::rope_inv_freq(rc, 16);
  ASSERT_EQ(f.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(f[i], expected[i], 1e-6 * expected[i]) << i;
}

TEST(RopeInvFreq, RejectsOddHeadDim) { EXPECT_THROW(ops::rope_inv_freq(RopeConfig{}, 15), Error); }

TEST(Rope, MatchesDirectRotation) {
  const int64_t n = 11, heads = 3, d = 32;
  RopeConfig rc;
  rc.theta = 10000;
  std::vector<float> inv = ops::rope_inv_freq(rc, d);
  Tensor x = random_tensor({n, heads, d}, DType::kF32, 40, -2.f, 2.f);
  Tensor orig = x.contiguous().to(Device::cpu());
  std::vector<int64_t> pos = {0, 1, 2, 7, 100, 513, 2047, 4096, 33000, 5, 5};
  ops::rope(x, Tensor::from_blob(pos.data(), {n}, DType::kI64),
            Tensor::from_blob(inv.data(), {d / 2}, DType::kF32));
  std::vector<double> ref(x.numel());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < d / 2; ++i) {
        const float angle = float(pos[t]) * inv[i];  // float32 product, as transformers does
        const double c = std::cos(double(angle)), s = std::sin(double(angle));
        const int64_t base = (t * heads + h) * d;
        const double x1 = value_at(orig, base + i), x2 = value_at(orig, base + i + d / 2);
        ref[base + i] = x1 * c - x2 * s;
        ref[base + i + d / 2] = x2 * c + x1 * s;
      }
  EXPECT_LT(max_abs_diff(x, ref), 1e-6);
  // Position 0 is the identity.
  for (int64_t i = 0; i < heads * d; ++i) EXPECT_EQ(x.data<float>()[i], orig.data<float>()[i]);
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int64_t d = 64;
  RopeConfig rc;
  rc.theta = 1e6;
  std::vector<float> inv = ops::rope_inv_freq(rc, d);
  Tensor inv_t = Tensor::from_blob(inv.data(), {d / 2}, DType::kF32);
  Tensor q = random_tensor({1, 1, d}, DType::kF32, 41);
  Tensor k = random_tensor({1, 1, d}, DType::kF32, 42);
  auto dot_at = [&](int64_t pq, int64_t pk) {
    Tensor qq = q.to(Device::cpu()), kk = k.to(Device::cpu());
    ops::rope(qq, Tensor::from_blob(&pq, {1}, DType::kI64), inv_t);
    ops::rope(kk, Tensor::from_blob(&pk, {1}, DType::kI64), inv_t);
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += double(qq.data<float>()[i]) * kk.data<float>()[i];
    return s;
  };
  EXPECT_NEAR(dot_at(10, 3), dot_at(17, 10), 1e-5);
  EXPECT_NEAR(dot_at(5, 5), dot_at(0, 0), 1e-5);
}

TEST(RopeInvFreq, TransformersBufferRoundsToModelDtype) {
  RopeConfig rc;
  rc.theta = 1e6;
  std::vector<float> exact = ops::rope_inv_freq(rc, 32);
  std::vector<float> bf = ops::rope_inv_freq_as_transformers(rc, 32, DType::kBF16);
  std::vector<float> f32 = ops::rope_inv_freq_as_transformers(rc, 32, DType::kF32);
  bool any_rounded = false;
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_EQ(f32[i], exact[i]);
    EXPECT_EQ(bf[i], bf16_to_f32(f32_to_bf16(exact[i])));
    any_rounded |= bf[i] != exact[i];
  }
  EXPECT_TRUE(any_rounded);
  // 1e6^(-2/32) = 0.42169650..., bf16 keeps 8 significant bits: 0.421875.
  EXPECT_EQ(bf[1], 0.421875f);
}
