// RoPE variants (yarn, longrope, dynamic NTK, partial rotary, attention scaling): the frequencies
// against transformers' formulas written again here in double-precision scalar code (so they
// agree within float32 rounding, a few ulp), a few values worked out by hand, and the op against
// a naive rotation with per-token table choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "ops/rope.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

constexpr double kPi = std::numbers::pi;

// Relative agreement of float32 results with the double formulas: each is a handful of float32
// roundings (eps 1.2e-7) away from the exact value.
constexpr double kRel = 1e-6;

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], kRel * std::abs(want[i])) << what << " i=" << i;
}

// _compute_default_rope_parameters in double.
std::vector<double> ref_default(double base, int64_t dim) {
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) f[i] = 1.0 / std::pow(base, 2.0 * i / dim);
  return f;
}

// _compute_yarn_parameters in double.
std::vector<double> ref_yarn(double base, int64_t dim, double factor, double orig, double beta_fast,
                             double beta_slow, bool truncate) {
  auto corr = [&](double rot) {
    return dim * std::log(orig / (rot * 2 * kPi)) / (2 * std::log(base));
  };
  double low = corr(beta_fast), high = corr(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double p = std::pow(base, 2.0 * i / dim);
    const double extrap = 1 / p, interp = 1 / (factor * p);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double e = 1 - ramp;
    f[i] = interp * (1 - e) + extrap * e;
  }
  return f;
}

// _compute_longrope_parameters in double.
std::vector<double> ref_longrope(double base, int64_t dim, const std::vector<double>& ext) {
  std::vector<double> f(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) f[i] = 1.0 / (ext[i] * std::pow(base, 2.0 * i / dim));
  return f;
}

// _compute_dynamic_ntk_parameters in double at seq_len.
std::vector<double> ref_dynamic(double base, int64_t dim, double factor, double max_pos,
                                double seq_len) {
  seq_len = std::max(seq_len, max_pos);
  base *= std::pow(factor * seq_len / max_pos - (factor - 1), double(dim) / (dim - 2));
  return ref_default(base, dim);
}

RopeConfig qwen3_yarn() {  // Qwen's recipe for Qwen3 at 128K
  RopeConfig rc;
  rc.type = RopeType::kYarn;
  rc.theta = 1e6;
  rc.factor = 4;
  rc.original_max_position_embeddings = 32768;
  return rc;
}

// Phi-3-mini-128k-like: head_dim 96, original 4096 of 131072; lists shaped like Phi-3's (short
// near 1, long growing to ~60 over the low frequencies).
RopeConfig phi3_longrope(int64_t half) {
  RopeConfig rc;
  rc.type = RopeType::kLongrope;
  rc.theta = 10000;
  rc.original_max_position_embeddings = 4096;
  rc.factor = 131072.0 / 4096.0;
  for (int64_t i = 0; i < half; ++i) {
    const double x = double(i) / double(half - 1);
    rc.short_factor.push_back(1.0 + 0.05 * x * x);
    rc.long_factor.push_back(1.0 + 59.0 * x * x * x);
  }
  return rc;
}

}  // namespace

TEST(RopeVariants, YarnQwen3RecipeMatchesFormula) {
  RopeConfig rc = qwen3_yarn();
  ops::RopeFrequencies f = ops::rope_frequencies(rc, 128);
  EXPECT_EQ(f.rotary_dim, 128);
  EXPECT_EQ(f.select, ops::RopeSelect::kFixed);
  std::vector<float> inv(f.inv_freq.begin(), f.inv_freq.end());
  expect_close(inv, ref_yarn(1e6, 128, 4, 32768, 32, 1, true), "yarn");
  // By hand: the correction range is dims [floor(23.60), ceil(39.65)] = [23, 40]
  // (128 ln(32768 / (32 * 2 pi)) / (2 ln 1e6) = 23.596, with 1 rotation 39.650). Pairs up to 23
  // keep the default frequency exactly (extrapolation factor 1), pairs from 40 are exactly the
  // default divided by 4 (float32 1 / (4 * p)).
  std::vector<float> def = ops::rope_inv_freq(RopeConfig{.theta = 1e6}, 128);
  for (int i = 0; i <= 23; ++i) EXPECT_EQ(inv[i], def[i]) << i;
  for (int i = 40; i < 64; ++i) {
    const float p = 1.0f / def[i];  // not exactly pos_freqs; compare loosely
    EXPECT_NEAR(inv[i], 1.0 / (4.0 * double(p)), kRel * inv[i]) << i;
  }
  for (int i = 24; i < 40; ++i) {
    EXPECT_LT(inv[i], def[i]) << i;
    EXPECT_GT(inv[i], def[i] / 4.0f) << i;
  }
  // attention factor 0.1 ln 4 + 1 = 1.1386294361119891.
  EXPECT_DOUBLE_EQ(ops::rope_attention_scaling(rc), 1.1386294361119891);
  EXPECT_EQ(f.attention_scaling, 1.1386294361119891f);
}

TEST(RopeVariants, YarnOptions) {
  // No truncation (gpt-oss), other betas, a partial rotary dim.
  RopeConfig rc = qwen3_yarn();
  rc.truncate = false;
  rc.beta_fast = 16;
  rc.beta_slow = 2;
  rc.theta = 150000;
  rc.factor = 32;
  rc.original_max_position_embeddings = 4096;
  expect_close(ops::rope_inv_freq(rc, 64), ref_yarn(150000, 64, 32, 4096, 16, 2, false),
               "yarn untruncated");
  rc.partial_rotary_factor = 0.5;
  expect_close(ops::rope_inv_freq(rc, 128), ref_yarn(150000, 64, 32, 4096, 16, 2, false),
               "yarn partial");
  // DeepSeek-V3: mscale == mscale_all_dim cancels to 1; unequal gives the ratio of get_mscale.
  RopeConfig ds = qwen3_yarn();
  ds.factor = 40;
  ds.theta = 10000;
  ds.original_max_position_embeddings = 4096;
  ds.mscale = ds.mscale_all_dim = 1.0;
  EXPECT_EQ(ops::rope_attention_scaling(ds), 1.0);
  ds.mscale = 1.0;
  ds.mscale_all_dim = 0.5;
  EXPECT_DOUBLE_EQ(ops::rope_attention_scaling(ds),
                   (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1));
  ds.mscale_all_dim = 0;  // absent: get_mscale(factor)
  EXPECT_DOUBLE_EQ(ops::rope_attention_scaling(ds), 0.1 * std::log(40.0) + 1);
  ds.attention_factor = 0.75;  // explicit wins
  EXPECT_EQ(ops::rope_attention_scaling(ds), 0.75);
  ds = qwen3_yarn();
  ds.factor = 1;  // no scaling: get_mscale(1) = 1
  EXPECT_EQ(ops::rope_attention_scaling(ds), 1.0);
}

TEST(RopeVariants, LongropeTablesAndAttentionFactor) {
  RopeConfig rc = phi3_longrope(48);
  ops::RopeFrequencies f = ops::rope_frequencies(rc, 96);
  EXPECT_EQ(f.select, ops::RopeSelect::kLongrope);
  EXPECT_EQ(f.switch_len, 4096);
  ASSERT_EQ(f.inv_freq.size(), 96u);
  std::vector<float> short_t(f.inv_freq.begin(), f.inv_freq.begin() + 48);
  std::vector<float> long_t(f.inv_freq.begin() + 48, f.inv_freq.end());
  expect_close(short_t, ref_longrope(10000, 96, rc.short_factor), "short");
  expect_close(long_t, ref_longrope(10000, 96, rc.long_factor), "long");
  // sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12) = sqrt(17/12).
  EXPECT_NEAR(ops::rope_attention_scaling(rc), std::sqrt(17.0 / 12.0), 1e-15);
  EXPECT_EQ(f.attention_scaling, static_cast<float>(std::sqrt(17.0 / 12.0)));
  rc.attention_factor = 1.5;
  EXPECT_EQ(ops::rope_attention_scaling(rc), 1.5);
  rc.attention_factor = std::numeric_limits<double>::quiet_NaN();
  rc.factor = 1.0;  // no extension: 1
  EXPECT_EQ(ops::rope_attention_scaling(rc), 1.0);
  // Phi-4-mini: partial rotary 0.75 of head_dim 128 = 96 rotary dims, 48 factors each.
  RopeConfig p4 = phi3_longrope(48);
  p4.partial_rotary_factor = 0.75;
  ops::RopeFrequencies f4 = ops::rope_frequencies(p4, 128);
  EXPECT_EQ(f4.rotary_dim, 96);
  EXPECT_EQ(f4.inv_freq, f.inv_freq);
  // Lists of the wrong length.
  RopeConfig bad = phi3_longrope(47);
  EXPECT_THROW(ops::rope_frequencies(bad, 96), Error);
}

TEST(RopeVariants, DynamicNtk) {
  RopeConfig rc;
  rc.type = RopeType::kDynamic;
  rc.theta = 10000;
  rc.factor = 2;
  rc.max_position_embeddings = 64;
  ops::RopeFrequencies f = ops::rope_frequencies(rc, 32);
  EXPECT_EQ(f.select, ops::RopeSelect::kDynamic);
  EXPECT_EQ(f.switch_len, 64);
  EXPECT_EQ(f.attention_scaling, 1.0f);
  // Within max_position_embeddings: the default frequencies, exactly.
  EXPECT_EQ(f.inv_freq, ops::rope_inv_freq(RopeConfig{.theta = 10000}, 32));
  EXPECT_EQ(ops::rope_dynamic_inv_freq(f, 64), f.inv_freq);
  for (int64_t len : {65, 100, 515, 4096, 1 << 20})
    expect_close(ops::rope_dynamic_inv_freq(f, len), ref_dynamic(10000, 32, 2, 64, double(len)),
                 "dynamic");
  // By hand: at 128 tokens base = 1e4 * (2 * 128 / 64 - 1) ** (32 / 30) = 1e4 * 3 ** (16/15);
  // pair 1: base ** (-2/32).
  const double base = 1e4 * std::pow(3.0, 16.0 / 15.0);
  EXPECT_NEAR(ops::rope_dynamic_inv_freq(f, 128)[1], std::pow(base, -1.0 / 16), 1e-7);
  // A non-integral factor, partial rotary.
  rc.factor = 1.3;
  rc.partial_rotary_factor = 0.5;
  f = ops::rope_frequencies(rc, 64);
  EXPECT_EQ(f.rotary_dim, 32);
  expect_close(f.inv_freq, ref_default(10000, 32), "dynamic init");
  expect_close(ops::rope_dynamic_inv_freq(f, 1000), ref_dynamic(10000, 32, 1.3, 64, 1000),
               "dynamic 1.3");
}

TEST(RopeVariants, PartialRotaryFrequencies) {
  RopeConfig rc;
  rc.theta = 10000;
  rc.partial_rotary_factor = 0.25;  // GLM-style 1/4 of head_dim 128 = 32 (exponents over 32)
  std::vector<float> f = ops::rope_inv_freq(rc, 128);
  expect_close(f, ref_default(10000, 32), "partial");
  EXPECT_EQ(f, ops::rope_inv_freq(RopeConfig{.theta = 10000}, 32));
  rc.partial_rotary_factor = 0.3;  // int(128 * 0.3) = 38: even, 19 pairs
  EXPECT_EQ(ops::rope_frequencies(rc, 128).rotary_dim, 38);
  rc.partial_rotary_factor = 0.33;  // int(42.24) = 42
  EXPECT_EQ(ops::rope_frequencies(rc, 128).rotary_dim, 42);
  rc.partial_rotary_factor = 0.32;  // int(40.96) = 40
  EXPECT_EQ(ops::rope_frequencies(rc, 128).rotary_dim, 40);
  rc.partial_rotary_factor = 0.34;  // int(43.52) = 43: odd
  EXPECT_THROW(ops::rope_frequencies(rc, 128), Error);
}

namespace {

// The naive rotation: transformers' apply_rotary_pos_emb over the first rotary_dim dims with
// cos/sin = cos/sin(float(pos) * inv) * scaling (float32), the rest passed through.
std::vector<double> naive_rope(const Tensor& orig, int64_t n, int64_t heads, int64_t d, int64_t rd,
                               const std::vector<int64_t>& pos,
                               const std::vector<std::vector<float>>& inv_of_token, float scaling) {
  std::vector<double> ref(orig.numel());
  const int64_t half = rd / 2;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * d;
      for (int64_t i = 0; i < d; ++i) ref[base + i] = value_at(orig, base + i);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(pos[t]) * inv_of_token[t][i];
        const double c = float(std::cos(double(angle))) * scaling;
        const double s = float(std::sin(double(angle))) * scaling;
        const double x1 = value_at(orig, base + i), x2 = value_at(orig, base + i + half);
        ref[base + i] = x1 * c - x2 * s;
        ref[base + i + half] = x2 * c + x1 * s;
      }
    }
  return ref;
}

}  // namespace

TEST(RopeVariants, OpWithScalingAndPartialRotary) {
  const int64_t n = 9, heads = 3, d = 64;
  RopeConfig rc = qwen3_yarn();
  rc.partial_rotary_factor = 0.75;  // 48 of 64 dims rotate
  ops::RopeFrequencies f = ops::rope_frequencies(rc, d);
  ASSERT_EQ(f.rotary_dim, 48);
  Tensor x = random_tensor({n, heads, d}, DType::kF32, 50, -2.f, 2.f);
  Tensor orig = x.contiguous().to(Device::cpu());
  std::vector<int64_t> pos = {0, 1, 2, 77, 1000, 32767, 32768, 100000, 131071};
  Tensor inv_t = Tensor::from_blob(f.inv_freq.data(), {1, 24}, DType::kF32);
  ops::rope(x, Tensor::from_blob(pos.data(), {n}, DType::kI64), ops::rope_args(f, inv_t));
  std::vector<std::vector<float>> inv(n, f.inv_freq);
  std::vector<double> ref = naive_rope(orig, n, heads, d, 48, pos, inv, f.attention_scaling);
  EXPECT_LT(max_abs_diff(x, ref), 2e-6);
  // The pass-through dims are untouched, bit for bit.
  for (int64_t r = 0; r < n * heads; ++r)
    EXPECT_EQ(std::memcmp(x.data<float>() + r * d + 48, orig.data<float>() + r * d + 48,
                          16 * sizeof(float)),
              0);
  // Position 0 scales by attention_scaling only (cos 1, sin 0).
  for (int64_t i = 0; i < 48; ++i)
    EXPECT_EQ(x.data<float>()[i], orig.data<float>()[i] * f.attention_scaling);
}

TEST(RopeVariants, DefaultArgsAreBitIdenticalToPlainRope) {
  // Scaling 1 and rotary_dim == head_dim: exactly the plain op (and bf16 rows too).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t n = 7, heads = 2, d = 32;
    std::vector<float> inv = ops::rope_inv_freq(RopeConfig{.theta = 5e5}, d);
    Tensor inv_t = Tensor::from_blob(inv.data(), {d / 2}, DType::kF32);
    std::vector<int64_t> pos = {0, 3, 9, 500, 4097, 65536, 999999};
    Tensor pos_t = Tensor::from_blob(pos.data(), {n}, DType::kI64);
    Tensor a = random_tensor({n, heads, d}, dt, 51, -2.f, 2.f);
    Tensor b = a.contiguous().to(Device::cpu());
    ops::rope(a, pos_t, inv_t);
    ops::RopeArgs args;
    args.inv_freq = inv_t;
    args.rotary_dim = d;
    args.attention_scaling = 1.0f;
    ops::rope(b, pos_t, args);
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
    // And the direct formula without any scaling multiply, bit for bit (f32).
    if (dt != DType::kF32) continue;
    Tensor c = random_tensor({n, heads, d}, dt, 51, -2.f, 2.f);
    std::vector<float> want(c.numel());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d / 2; ++i) {
          const float angle = float(pos[t]) * inv[i];
          const float co = float(std::cos(double(angle))), si = float(std::sin(double(angle)));
          const float* src = c.data<float>() + (t * heads + h) * d;
          const float x1 = src[i], x2 = src[i + d / 2];
          want[(t * heads + h) * d + i] = x1 * co + (-x2) * si;
          want[(t * heads + h) * d + i + d / 2] = x2 * co + x1 * si;
        }
    EXPECT_EQ(std::memcmp(a.data_ptr(), want.data(), a.nbytes()), 0);
  }
}

TEST(RopeVariants, LongropePicksTablePerTokenLength) {
  const int64_t heads = 2, d = 32;
  RopeConfig rc = phi3_longrope(16);
  rc.original_max_position_embeddings = 64;
  rc.factor = 4;
  ops::RopeFrequencies f = ops::rope_frequencies(rc, d);
  Tensor inv_t = Tensor::from_blob(f.inv_freq.data(), {2, 16}, DType::kF32);
  std::vector<float> short_t(f.inv_freq.begin(), f.inv_freq.begin() + 16);
  std::vector<float> long_t(f.inv_freq.begin() + 16, f.inv_freq.end());
  // Two sequences in one step: a 60-token prefill (short) and one whose step ends at 70 tokens
  // (long for every token of it, including those before position 64), then decode tokens at
  // positions 63 (len 64: short) and 64 (len 65: long) without lens (position + 1).
  std::vector<int64_t> pos, lens;
  for (int64_t p = 0; p < 60; ++p) pos.push_back(p), lens.push_back(60);
  for (int64_t p = 50; p < 70; ++p) pos.push_back(p), lens.push_back(70);
  const int64_t n = int64_t(pos.size());
  Tensor x = random_tensor({n, heads, d}, DType::kF32, 52, -2.f, 2.f);
  Tensor orig = x.contiguous().to(Device::cpu());
  ops::rope(x, Tensor::from_blob(pos.data(), {n}, DType::kI64),
            ops::rope_args(f, inv_t, Tensor::from_blob(lens.data(), {n}, DType::kI64)));
  std::vector<std::vector<float>> inv;
  for (int64_t t = 0; t < n; ++t) inv.push_back(lens[t] > 64 ? long_t : short_t);
  EXPECT_LT(max_abs_diff(x, naive_rope(orig, n, heads, d, d, pos, inv, f.attention_scaling)), 2e-6);

  std::vector<int64_t> dpos = {63, 64};
  Tensor y = random_tensor({2, heads, d}, DType::kF32, 53, -2.f, 2.f);
  Tensor yo = y.contiguous().to(Device::cpu());
  ops::rope(y, Tensor::from_blob(dpos.data(), {2}, DType::kI64), ops::rope_args(f, inv_t));
  EXPECT_LT(
      max_abs_diff(y, naive_rope(yo, 2, heads, d, d, dpos, {short_t, long_t}, f.attention_scaling)),
      2e-6);
}

TEST(RopeVariants, DynamicRecomputesPerTokenLength) {
  const int64_t heads = 2, d = 32;
  RopeConfig rc;
  rc.type = RopeType::kDynamic;
  rc.theta = 10000;
  rc.factor = 2;
  rc.max_position_embeddings = 64;
  ops::RopeFrequencies f = ops::rope_frequencies(rc, d);
  Tensor inv_t = Tensor::from_blob(f.inv_freq.data(), {1, 16}, DType::kF32);
  std::vector<int64_t> pos, lens;
  for (int64_t p = 0; p < 40; ++p) pos.push_back(p), lens.push_back(40);    // default
  for (int64_t p = 0; p < 100; ++p) pos.push_back(p), lens.push_back(100);  // base at 100
  for (int64_t p : {64, 515}) pos.push_back(p), lens.push_back(p + 1);      // decode
  const int64_t n = int64_t(pos.size());
  Tensor x = random_tensor({n, heads, d}, DType::kF32, 54, -2.f, 2.f);
  Tensor orig = x.contiguous().to(Device::cpu());
  ops::rope(x, Tensor::from_blob(pos.data(), {n}, DType::kI64),
            ops::rope_args(f, inv_t, Tensor::from_blob(lens.data(), {n}, DType::kI64)));
  std::vector<std::vector<float>> inv;
  for (int64_t t = 0; t < n; ++t) inv.push_back(ops::rope_dynamic_inv_freq(f, lens[t]));
  EXPECT_LT(max_abs_diff(x, naive_rope(orig, n, heads, d, d, pos, inv, 1.0f)), 2e-6);
}

TEST(RopeVariants, OpRejectsBadArgs) {
  std::vector<float> inv(16, 0.5f);
  std::vector<int64_t> pos = {1};
  Tensor x = random_tensor({1, 1, 32}, DType::kF32, 55);
  ops::RopeArgs a;
  a.inv_freq = Tensor::from_blob(inv.data(), {16}, DType::kF32);
  a.rotary_dim = 30;  // 15 pairs, but 16 frequencies
  EXPECT_THROW(ops::rope(x, Tensor::from_blob(pos.data(), {1}, DType::kI64), a), Error);
  a.rotary_dim = 34;  // past head_dim
  EXPECT_THROW(ops::rope(x, Tensor::from_blob(pos.data(), {1}, DType::kI64), a), Error);
  a.rotary_dim = 32;
  a.select = ops::RopeSelect::kLongrope;  // needs two tables
  EXPECT_THROW(ops::rope(x, Tensor::from_blob(pos.data(), {1}, DType::kI64), a), Error);
}
