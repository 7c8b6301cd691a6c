#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "longctx/core/dtype.h"
#include "longctx/core/npy.h"
#include "longctx/core/parallel.h"
#include "longctx/core/tensor.h"

using namespace longctx;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);  // tie, odd below -> rounds up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTrip) {
  for (float v : {0.0f, 1.0f, -1.0f, 0.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f,
                  2.98023223876953125e-06f, 1234.0f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 4096)), 1.0f);  // below half ulp
  // Exhaustive: every finite f16 survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("torch.float16"), DType::kF16);
  EXPECT_EQ(parse_dtype("F32"), DType::kF32);
  EXPECT_THROW(parse_dtype("float8"), Error);
}

TEST(Tensor, ViewsSliceAndContiguous) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kF32);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = float(i);
  EXPECT_TRUE(t.is_contiguous());
  Tensor s = t.slice(2, 1, 3);  // [2, 3, 2]
  EXPECT_FALSE(s.is_contiguous());
  Tensor c = s.contiguous();
  ASSERT_EQ(c.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(c.data<float>()[0], 1.0f);
  EXPECT_EQ(c.data<float>()[1], 2.0f);
  EXPECT_EQ(c.data<float>()[2], 5.0f);
  EXPECT_EQ(c.data<float>()[11], 22.0f);
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.shape(), (Shape{3, 4}));
  EXPECT_EQ(row.data<float>()[0], 12.0f);
  EXPECT_THROW(t.view({5, 5}), InternalError);
  EXPECT_THROW(t.slice(0, 1, 3), InternalError);
}

TEST(Tensor, DtypeConversionAndNoCuda) {
  Tensor t = Tensor::empty({3}, DType::kF32);
  t.data<float>()[0] = 1.5f;
  t.data<float>()[1] = -3.0f;
  t.data<float>()[2] = 0.1f;
  Tensor b = t.to_dtype(DType::kBF16).to_dtype(DType::kF32);
  EXPECT_EQ(b.data<float>()[0], 1.5f);
  EXPECT_NEAR(b.data<float>()[2], 0.1f, 1e-3);
#ifndef LONGCTX_WITH_CUDA
  EXPECT_THROW(Tensor::empty({4}, DType::kF32, Device::cuda(0)), Error);
#endif
}

TEST(Npy, RoundTrip) {
  Tensor t = Tensor::empty({3, 5}, DType::kF32);
  for (int i = 0; i < 15; ++i) t.data<float>()[i] = float(i) * 0.25f;
  auto path = (std::filesystem::temp_directory_path() / "longctx_npy_test.npy").string();
  write_npy(path, t);
  Tensor r = read_npy(path);
  ASSERT_EQ(r.shape(), t.shape());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(r.data<float>()[i], t.data<float>()[i]);
  std::remove(path.c_str());
  EXPECT_THROW(read_npy("/nonexistent/file.npy"), Error);
}

TEST(Npy, ReadsFixtureLogits) {
  Tensor r = read_npy(std::string(LONGCTX_TEST_DATA_DIR) + "/fixtures/tiny-llama3/logits_7.npy");
  ASSERT_EQ(r.shape(), (Shape{7, 1024}));
  EXPECT_EQ(r.dtype(), DType::kF32);
}

TEST(Parallel, CoversRangeOnce) {
  std::vector<int> hits(10007, 0);
  parallel_for(int64_t(hits.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
}
