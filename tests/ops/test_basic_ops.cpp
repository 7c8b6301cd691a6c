// embedding, rms_norm, linear, silu_and_mul, add against values computed independently (in
// double, straight from the definitions).
#include <gtest/gtest.h>

#include <cmath>

#include "longctx/core/error.h"
#include "ops/add.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/silu_and_mul.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

TEST(Embedding, GathersRowsFromEveryFloatDtype) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor table = random_tensor({50, 24}, dt, 1);
    std::vector<int32_t> id = {7, 0, 49, 7, 13};
    Tensor ids = Tensor::from_blob(id.data(), {5}, DType::kI32);
    Tensor out = Tensor::empty({5, 24}, DType::kF32);
    ops::embedding(ids, table, out);
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t c = 0; c < 24; ++c)
        ASSERT_EQ(out.data<float>()[i * 24 + c], value_at(table, id[i] * 24 + c)) << dtype_name(dt);
  }
}

TEST(Embedding, RejectsIdOutsideVocabulary) {
  Tensor table = random_tensor({10, 4}, DType::kBF16, 2);
  std::vector<int32_t> id = {1, 10};
  Tensor out = Tensor::empty({2, 4}, DType::kF32);
  try {
    ops::embedding(Tensor::from_blob(id.data(), {2}, DType::kI32), table, out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("token id 10"), std::string::npos) << e.what();
  }
}

// Vocab-parallel lookup: the table holds rows [first_row, first_row + vocab) of the vocabulary;
// ids outside them (another rank's, or no row at all) give zeros, never an error.
TEST(Embedding, ShardLooksUpItsRowsAndZerosTheRest) {
  Tensor table = random_tensor({10, 4}, DType::kBF16, 3);  // rows 20..29 of the vocabulary
  std::vector<int32_t> id = {20, 29, 19, 30, 25, -1, INT32_MAX};
  Tensor out = Tensor::empty({7, 4}, DType::kF32);
  ops::embedding_shard(Tensor::from_blob(id.data(), {7}, DType::kI32), table, 20, out);
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t c = 0; c < 4; ++c) {
      const bool mine = id[i] >= 20 && id[i] < 30;
      ASSERT_EQ(out.data<float>()[i * 4 + c], mine ? value_at(table, (id[i] - 20) * 4 + c) : 0.f)
          << i;
    }
}

TEST(RmsNorm, HandComputedRow) {
  // x = [1, 2, 3, 4]: mean(x^2) = 30 / 4 = 7.5, so x_hat = x / sqrt(7.5 + eps).
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> w = {1.0f, 0.5f, 2.0f, -1.0f};
  Tensor out = Tensor::empty({1, 4}, DType::kF32);
  const float eps = 1e-5f;
  ops::rms_norm(Tensor::from_blob(x.data(), {1, 4}, DType::kF32),
                Tensor::from_blob(w.data(), {4}, DType::kF32).to_dtype(DType::kBF16), eps, out);
  const double r = 1.0 / std::sqrt(7.5 + 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out.data<float>()[i], w[i] * x[i] * r, 1e-6) << i;
}

TEST(RmsNorm, RowsAreIndependentAndInPlaceWorks) {
  const int64_t rows = 37, d = 96;
  Tensor x = random_tensor({rows, d}, DType::kF32, 3, -3.f, 3.f);
  Tensor w = random_tensor({d}, DType::kBF16, 4, 0.5f, 1.5f);
  std::vector<double> ref(rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += value_at(x, r * d + i) * value_at(x, r * d + i);
    double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t i = 0; i < d; ++i) ref[r * d + i] = value_at(w, i) * value_at(x, r * d + i) * inv;
  }
  ops::rms_norm(x, w, 1e-6f, x);  // in place
  EXPECT_LT(max_abs_diff(x, ref), 2e-6);
}

TEST(Linear, MatchesDoubleReferenceOverOddShapes) {
  struct Case {
    int64_t n, in, out;
    DType wdt;
    bool bias;
  };
  for (Case c : {Case{1, 128, 352, DType::kBF16, false}, Case{3, 5, 1, DType::kF32, true},
                 Case{130, 64, 33, DType::kBF16, true}, Case{257, 96, 70, DType::kF16, false},
                 Case{2, 352, 128, DType::kBF16, true}}) {
    Tensor x = random_tensor({c.n, c.in}, DType::kF32, 10, -2.f, 2.f);
    Tensor w = random_tensor({c.out, c.in}, c.wdt, 11);
    Tensor b = c.bias ? random_tensor({c.out}, c.wdt, 12) : Tensor();
    Tensor out = Tensor::empty({c.n, c.out}, DType::kF32);
    ops::linear(x, w, b, out);
    std::vector<double> ref(c.n * c.out);
    double scale = 0;
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t o = 0; o < c.out; ++o) {
        double s = c.bias ? value_at(b, o) : 0.0;
        for (int64_t k = 0; k < c.in; ++k)
          s += value_at(x, t * c.in + k) * value_at(w, o * c.in + k);
        ref[t * c.out + o] = s;
        scale = std::max(scale, std::abs(s));
      }
    // fp32 accumulation of `in` terms of size ~1: error a few ulps of the partial sums.
    EXPECT_LT(max_abs_diff(out, ref), 1e-6 * c.in) << c.n << "x" << c.in << "x" << c.out;
  }
}

TEST(Linear, RejectsMismatchedShapes) {
  Tensor x = Tensor::zeros({2, 8}, DType::kF32);
  Tensor w = Tensor::zeros({4, 9}, DType::kBF16);
  Tensor out = Tensor::empty({2, 4}, DType::kF32);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out), Error);
  Tensor w2 = Tensor::zeros({4, 8}, DType::kBF16);
  Tensor bad_out = Tensor::empty({2, 5}, DType::kF32);
  EXPECT_THROW(ops::linear(x, w2, Tensor(), bad_out), Error);
  EXPECT_THROW(ops::linear(x, w2, Tensor::zeros({5}, DType::kF32), out), Error);
}

TEST(SiluAndMul, MatchesFormula) {
  Tensor g = random_tensor({9, 40}, DType::kF32, 20, -8.f, 8.f);
  Tensor u = random_tensor({9, 40}, DType::kF32, 21, -2.f, 2.f);
  std::vector<double> ref(g.numel());
  for (int64_t i = 0; i < g.numel(); ++i) {
    double gv = value_at(g, i);
    ref[i] = gv / (1.0 + std::exp(-gv)) * value_at(u, i);
  }
  Tensor out = Tensor::empty({9, 40}, DType::kF32);
  ops::silu_and_mul(g, u, out);
  EXPECT_LT(max_abs_diff(out, ref), 1e-5);
  ops::silu_and_mul(g, u, g);  // in place into gate
  EXPECT_LT(max_abs_diff(g, ref), 1e-5);
}

TEST(Add, ElementwiseAndShapeChecked) {
  Tensor a = random_tensor({5, 7}, DType::kF32, 30);
  Tensor b = random_tensor({5, 7}, DType::kF32, 31);
  std::vector<double> ref(35);
  for (int i = 0; i < 35; ++i) ref[i] = double(a.data<float>()[i] + b.data<float>()[i]);
  ops::add(a, b, a);
  EXPECT_EQ(max_abs_diff(a, ref), 0.0);
  EXPECT_THROW(ops::add(a, Tensor::zeros({7, 5}, DType::kF32), a), Error);
}
