// FP8 E4M3 (OCP) conversions against an independent reference: every code decoded from its
// exponent and mantissa fields, and encoding as the nearest of the 127 non-negative finite codes
// found by search (ties to the even code), over a sweep of fp32 values, the exact midpoints and
// the saturating / NaN cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "longctx/core/dtype.h"

namespace longctx {
namespace {

// The value of a code from its fields (OCP E4M3: bias 7, S.1111.111 is NaN, no infinities).
double reference_decode(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m / 8.0, -6);
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}

// Nearest non-negative finite code to |x| (ties to the even code), saturating at 448.
int reference_encode_abs(double a) {
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double dc = std::abs(a - reference_decode(c)), db = std::abs(a - reference_decode(best));
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
  }
  return best;
}

TEST(Fp8E4M3, DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float f = fp8e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), reference_decode(c)) << "code " << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << c;  // -0 keeps its sign
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(fp8e4m3_to_f32(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(fp8e4m3_to_f32(0x01), 0x1p-9f);  // smallest subnormal
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_fp8e4m3(fp8e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(Fp8E4M3, MidpointsRoundToEven) {
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = reference_decode(c), hi = reference_decode(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in fp32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int want = (c & 1) == 0 ? c : c + 1;
    EXPECT_EQ(f32_to_fp8e4m3(mid), want) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_fp8e4m3(-mid), want | 0x80);
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, 0.f)), c);
    EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(mid, 1e9f)), c + 1);
  }
}

TEST(Fp8E4M3, EncodesTheNearestCodeOverASweep) {
  // Every 4093rd fp32 bit pattern from 0 to just past 448, both signs: the search's code, and
  // the per-element bound (normals: half an ulp = 2^-4 relative; subnormals: 2^-10 absolute).
  for (uint32_t bits = 0; bits <= 0x43f00000u; bits += 4093) {
    const float x = std::bit_cast<float>(bits);
    const int want = reference_encode_abs(x);
    ASSERT_EQ(f32_to_fp8e4m3(x), want) << "x = " << x;
    ASSERT_EQ(f32_to_fp8e4m3(-x), want | 0x80) << "x = " << -x;
    const float back = fp8e4m3_to_f32(f32_to_fp8e4m3(x));
    if (x > 448.f) {
      EXPECT_EQ(back, 448.f);
    } else if (x >= 0x1p-6f) {
      ASSERT_LE(std::abs(x - back), 0x1p-4f * x) << "x = " << x;
    } else {
      ASSERT_LE(std::abs(x - back), 0x1p-10f) << "x = " << x;
    }
  }
}

TEST(Fp8E4M3, SaturatesAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float big : {448.f, 449.f, 464.f, 480.f, 1e6f, 3.0e38f, inf}) {
    EXPECT_EQ(f32_to_fp8e4m3(big), 0x7e) << big;
    EXPECT_EQ(f32_to_fp8e4m3(-big), 0xfe) << -big;
  }
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(f32_to_fp8e4m3(0.f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_fp8e4m3(0x1p-10f), 0x00);                       // half the smallest: to even
  EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(0x1p-10f, 1.f)), 0x01);  // just above: up
  EXPECT_EQ(f32_to_fp8e4m3(0x1p-11f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(Fp8E4M3, ParsesNames) {
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::kFP8E4M3);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kFP8E4M3);  // safetensors
  EXPECT_EQ(parse_dtype("torch.float8_e4m3fn"), DType::kFP8E4M3);
  EXPECT_EQ(dtype_size(DType::kFP8E4M3), 1u);
  EXPECT_EQ(dtype_name(DType::kFP8E4M3), "fp8_e4m3");
}

}  // namespace
}  // namespace longctx
