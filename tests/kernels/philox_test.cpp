// Philox4x32 against the published known-answer vectors (Random123's tests/kat_vectors, the
// "philox4x32 7" and "philox4x32 10" lines), and the sampler's shared arithmetic
// (kernels/sampling_math.h): its exp, masses, and the order-preserving float keys.
#include "kernels/philox.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "kernels/sampling_math.h"

namespace longctx::kernels {
namespace {

struct Kat {
  std::array<uint32_t, 4> ctr;
  std::array<uint32_t, 2> key;
  std::array<uint32_t, 4> out;
};

// Inputs: all zeros, all ones, and the digits of pi (the file's three patterns).
constexpr std::array<uint32_t, 4> kPiCtr = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
constexpr std::array<uint32_t, 2> kPiKey = {0xa4093822, 0x299f31d0};
constexpr uint32_t kOnes = 0xffffffff;

template <int Rounds>
void expect_kat(const Kat& k) {
  const PhiloxBlock got =
      philox4x32<Rounds>(PhiloxBlock{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got.v[i], k.out[i]) << "rounds " << Rounds << " word " << i << std::hex << " got 0x"
                                  << got.v[i] << " want 0x" << k.out[i];
  }
}

TEST(Philox, KnownAnswers4x32x10) {
  expect_kat<10>({{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  expect_kat<10>({{kOnes, kOnes, kOnes, kOnes},
                  {kOnes, kOnes},
                  {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  expect_kat<10>({kPiCtr, kPiKey, {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
}

TEST(Philox, KnownAnswers4x32x7) {
  expect_kat<7>({{0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}});
  expect_kat<7>({{kOnes, kOnes, kOnes, kOnes},
                 {kOnes, kOnes},
                 {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}});
  expect_kat<7>({kPiCtr, kPiKey, {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}});
}

TEST(Philox, SamplingUniformIsTheFirstTwoWordsOfTheBlock) {
  // key = seed (low word first), counter = (step low, step high, 0, 0); 53 bits of words 0..1.
  const uint64_t seed = 0x299f31d0a4093822ull, step = 0x85a308d3243f6a88ull;
  const PhiloxBlock b =
      philox4x32<10>(PhiloxBlock{{0x243f6a88, 0x85a308d3, 0, 0}}, 0xa4093822, 0x299f31d0);
  const uint64_t bits = ((uint64_t(b.v[0]) << 32) | b.v[1]) >> 11;
  EXPECT_EQ(sampling_uniform(seed, step), double(bits) * 0x1.0p-53);
  // With the all-zero vector: words 0x6627e8d5 0xe169c58d.
  EXPECT_EQ(sampling_uniform(0, 0), double(0x6627e8d5e169c58dull >> 11) * 0x1.0p-53);
}

TEST(SamplingMath, ExpIsAccurateOverTheWindow) {
  double worst = 0;
  for (int i = 0; i <= 320000; ++i) {
    const float d = -32.0f * static_cast<float>(i) / 320000.0f;
    const double want = std::exp(static_cast<double>(d));
    worst = std::max(worst, std::abs(sampling_exp(d) - want) / want);
  }
  EXPECT_LT(worst, 4e-7);  // a few float ulps
  EXPECT_EQ(sampling_exp(0.0f), 1.0f);
}

TEST(SamplingMath, MassesGrowWithTheLogitAndFitUint64) {
  uint64_t prev = 0;
  for (int i = 320000; i >= 0; --i) {
    const float d = -32.0f * static_cast<float>(i) / 320000.0f;
    const uint64_t q = token_mass(d);
    ASSERT_GE(q, prev) << d;
    prev = q;
  }
  EXPECT_EQ(prev, uint64_t(1) << kMassBits);
  EXPECT_EQ(token_mass(std::nextafter(-kMassWindow, -100.0f)), 0u);
  EXPECT_EQ(token_mass(std::numeric_limits<float>::quiet_NaN()), 0u);
  // A whole vocabulary of top tokens still sums inside uint64.
  EXPECT_LT(static_cast<double>(uint64_t(1) << kMassBits) * kMaxSamplingVocab, 0x1.0p64);
}

TEST(SamplingMath, DrawTargetStaysBelowTheTotal) {
  EXPECT_EQ(draw_target(0.0, 10), 0u);
  EXPECT_EQ(draw_target(0.5, 10), 5u);
  EXPECT_EQ(draw_target(std::nextafter(1.0, 0.0), 10), 9u);
  // Past 2^53 the product rounds; the result must still be a valid target.
  const uint64_t big = (uint64_t(1) << 62) + 12345;
  EXPECT_LT(draw_target(std::nextafter(1.0, 0.0), big), big);
}

TEST(SamplingMath, OrderKeysFollowFloatOrder) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {-inf, inf, -0.0f, 0.0f, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f};
  for (int i = 0; i < 2000; ++i) v.push_back(dist(rng));
  for (float a : v) {
    EXPECT_EQ(float_from_order_key(float_order_key(a)), a == 0.0f ? 0.0f : a);
    for (int j = 0; j < 8; ++j) {
      const float b = v[j];
      EXPECT_EQ(a < b, float_order_key(a) < float_order_key(b)) << a << " " << b;
      EXPECT_EQ(a == b, float_order_key(a) == float_order_key(b)) << a << " " << b;
    }
  }
}

}  // namespace
}  // namespace longctx::kernels
