// The FP8 staging conversion's CPU twin (kernels/cpu/fp8_stage_cpu.h) against the reference
// decoder (fp8e4m3_to_f32 times the page scale, in fp32: the values the CPU attention references
// read): every staged element is exactly that value (bf16; f16 where the scale keeps it in f16's
// range, else its rounding), NaN codes stay NaN, nothing outside the call's pages is written. And
// the pool's layout and capacity helpers (kernels/fp8_stage_params.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/fp8_stage_case.h"
#include "kernels/cpu/fp8_stage_cpu.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using testing::Fp8StageInputs;
using testing::Fp8StageShape;

float staged_value(uint16_t bits, DType dt) {
  return dt == DType::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

// Runs the twin on `s` and checks every element against the reference decoder. exact: the scales
// keep every value representable in the dtype (else it must be the value's rounding).
void expect_staged_equals_reference(const Fp8StageShape& s, bool exact) {
  SCOPED_TRACE(::testing::Message()
               << "pages " << s.call_pages << "/" << s.cache_pages << " page " << s.page_size
               << " hk " << s.num_kv_heads << " d " << s.head_dim << " " << dtype_name(s.dtype));
  const Fp8StageInputs in = make_fp8_stage_inputs(s);
  std::vector<uint16_t> ko = in.guarded_output(), vo = in.guarded_output();
  std::vector<int32_t> iota(s.call_pages + 1, -7);
  kernels::cpu::fp8_stage(in.params(in.k.data(), in.v.data(), in.k_scale.data(), in.v_scale.data(),
                                    in.indices.data(), ko.data(), vo.data(), iota.data()));
  EXPECT_TRUE(Fp8StageInputs::guards_intact(ko));
  EXPECT_TRUE(Fp8StageInputs::guards_intact(vo));
  for (int j = 0; j < s.call_pages; ++j) EXPECT_EQ(iota[j], j);
  EXPECT_EQ(iota[s.call_pages], -7);
  const int64_t pe = in.page_elems(), hd = s.head_dim;
  int64_t nans = 0, mismatches = 0;
  for (int kv = 0; kv < 2; ++kv) {
    const std::vector<uint8_t>& codes = kv == 0 ? in.k : in.v;
    const std::vector<float>& scales = kv == 0 ? in.k_scale : in.v_scale;
    const std::vector<uint16_t>& out = kv == 0 ? ko : vo;
    for (int j = 0; j < s.call_pages; ++j) {
      const int64_t page = in.indices[j];
      for (int64_t e = 0; e < pe; ++e) {
        const int64_t head = (e / hd) % s.num_kv_heads;
        const float want =
            fp8e4m3_to_f32(codes[page * pe + e]) * scales[page * s.num_kv_heads + head];
        const float got = staged_value(out[testing::kStageGuard + j * pe + e], s.dtype);
        if (std::isnan(want)) {
          nans += std::isnan(got) ? 1 : 0;
          mismatches += std::isnan(got) ? 0 : 1;
          continue;
        }
        const float rounded =
            s.dtype == DType::kBF16 ? bf16_to_f32(f32_to_bf16(want)) : f16_to_f32(f32_to_f16(want));
        if (exact ? got != want : got != rounded) {
          if (++mismatches <= 5)
            ADD_FAILURE() << (kv ? "V" : "K") << " call page " << j << " element " << e << ": "
                          << got << " want " << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GE(nans, 4 * s.call_pages);  // codes 0x7f and 0xff at least once a page in K and in V
}

TEST(Fp8StageRef, EqualsTheReferenceDecoderOnOddShapes) {
  const std::vector<float> normal = {0x1p-8f, 0x1p-4f, 1.f, 0x1p3f};
  uint64_t seed = 10;
  for (const Fp8StageShape& base : {
           Fp8StageShape{11, 5, 1, 4, 64},    // pages of one token, 4 heads
           Fp8StageShape{9, 9, 7, 3, 16},     // odd page and head counts, d 16
           Fp8StageShape{13, 7, 16, 2, 128},  // Llama's heads per group
           Fp8StageShape{3, 1, 256, 1, 64},   // one page of 256 tokens
           Fp8StageShape{6, 4, 128, 8, 128},  // 8 KV heads x 128, pages of 128
       }) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      Fp8StageShape s = base;
      s.dtype = dt;
      s.scales = normal;
      s.seed = seed++;
      expect_staged_equals_reference(s, /*exact=*/true);
    }
  }
}

// Scales far from 1 (the FP8 prefill harness's 2^-20 K pages, 2^-16 V pages, 2^8): bf16 keeps
// every value exactly (fp32's exponent range); f16 rounds (subnormal or flushed values at 2^-20).
TEST(Fp8StageRef, ExtremeScales) {
  Fp8StageShape s{7, 6, 16, 2, 64};
  s.scales = {0x1p-20f, 0x1p-16f, 0x1p8f};
  s.seed = 3;
  expect_staged_equals_reference(s, /*exact=*/true);
  s.dtype = DType::kF16;
  expect_staged_equals_reference(s, /*exact=*/false);
}

// Bad params are reported, naming the field; an empty call writes nothing.
TEST(Fp8StageRef, BadParamsAreReported) {
  const Fp8StageInputs in = make_fp8_stage_inputs(Fp8StageShape{4, 3, 16, 2, 64});
  std::vector<uint16_t> ko = in.guarded_output(), vo = in.guarded_output();
  const kernels::Fp8StageParams good =
      in.params(in.k.data(), in.v.data(), in.k_scale.data(), in.v_scale.data(), in.indices.data(),
                ko.data(), vo.data(), nullptr);
  auto expect = [&](kernels::Fp8StageParams p, ErrorCode code, const std::string& needle) {
    try {
      kernels::cpu::fp8_stage(p);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  kernels::Fp8StageParams p = good;
  p.head_dim = 20;
  expect(p, ErrorCode::kInvalidArgument, "head_dim");
  p = good;
  p.page_size = 0;
  expect(p, ErrorCode::kInvalidArgument, "page_size");
  p = good;
  p.dtype = DType::kF32;
  expect(p, ErrorCode::kInvalidArgument, "dtype");
  p = good;
  p.v_scale = nullptr;
  expect(p, ErrorCode::kInvalidArgument, "null");
  std::vector<int32_t> bad = in.indices;
  bad[2] = -1;
  p = good;
  p.kv_indices = bad.data();
  expect(p, ErrorCode::kOutOfRange, "cache page -1");
  EXPECT_TRUE(Fp8StageInputs::guards_intact(ko));
  for (size_t i = testing::kStageGuard; i + testing::kStageGuard < ko.size(); ++i)
    ASSERT_EQ(ko[i], testing::kStageGuardValue) << "written before the check";
  p = good;
  p.num_pages = 0;
  p.k_out = p.v_out = nullptr;
  kernels::cpu::fp8_stage(p);  // nothing to do
}

// The pool's parts: K, V and the indices, each 256-byte aligned, disjoint, in that order; the
// capacity counts K and V only, so a cap of n pages' K and V holds n pages.
TEST(Fp8StageRef, PoolLayoutAndCapacity) {
  for (int page : {1, 16, 128}) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(8192)}) {
      const kernels::Fp8StageLayout l = kernels::fp8_stage_layout(n, page, 8, 128, DType::kBF16);
      const size_t kv = size_t(n) * page * 8 * 128 * 2;
      EXPECT_EQ(l.k, 0u);
      EXPECT_EQ(l.v % 256, 0u);
      EXPECT_GE(l.v, kv);
      EXPECT_EQ(l.iota % 256, 0u);
      EXPECT_GE(l.iota, l.v + kv);
      EXPECT_GE(l.bytes, l.iota + n * 4);
      EXPECT_LT(l.bytes, 2 * kv + n * 4 + 3 * 256);
      EXPECT_EQ(kernels::fp8_stage_capacity_pages(2 * kv, page, 8, 128, DType::kBF16), n);
      EXPECT_EQ(kernels::fp8_stage_capacity_pages(2 * kv - 1, page, 8, 128, DType::kBF16), n - 1);
      EXPECT_TRUE(kernels::fp8_stage_fits(n, l.bytes, page, 8, 128, DType::kBF16));
      EXPECT_FALSE(kernels::fp8_stage_fits(n + 1, l.bytes, page, 8, 128, DType::kBF16));
    }
  }
  // 512 MiB holds 128K keys of 8 KV heads x 128 at any page size; cap 0 gives no pool.
  EXPECT_EQ(kernels::fp8_stage_capacity_pages(size_t(512) << 20, 16, 8, 128, DType::kBF16), 8192);
  EXPECT_EQ(kernels::fp8_stage_pool_bytes(100, 0, 16, 8, 128, DType::kBF16), 0u);
  EXPECT_EQ(kernels::fp8_stage_pool_bytes(100, 512, 16, 8, 128, DType::kBF16),
            kernels::fp8_stage_layout(100, 16, 8, 128, DType::kBF16).bytes);
  EXPECT_EQ(kernels::fp8_stage_pool_bytes(1 << 20, 512, 16, 8, 128, DType::kBF16),
            kernels::fp8_stage_layout(8192, 16, 8, 128, DType::kBF16).bytes);
}

}  // namespace
}  // namespace longctx
