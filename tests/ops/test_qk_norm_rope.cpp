// qk_norm_rope (Qwen3's q/k head norms and RoPE as one op) against the direct formula: each head
// normalized with its own weight (the q heads' or the k heads'), then pairs i and i + rotary/2
// rotated; v and the dims past the rotary dims only as the formula says.
#include <gtest/gtest.h>

#include <cmath>

#include "longctx/core/error.h"
#include "ops/qk_norm_rope.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

// The q and k heads of a fused qkv buffer [n, (hq + 2 hkv) d] f32 after the op, in double.
std::vector<double> reference(const Tensor& qkv, int64_t hq, int64_t hkv, int64_t d, int64_t rd,
                              const std::vector<float>& wq, const std::vector<float>& wk,
                              const std::vector<int64_t>& pos, const std::vector<float>& inv,
                              float eps) {
  const int64_t n = qkv.size(0), width = qkv.size(1);
  std::vector<double> ref(qkv.numel());
  for (int64_t i = 0; i < qkv.numel(); ++i) ref[i] = value_at(qkv, i);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < hq + hkv; ++h) {
      double* x = ref.data() + t * width + h * d;
      const std::vector<float>& w = h < hq ? wq : wk;
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
      const double inv_rms = 1.0 / std::sqrt(ss / double(d) + eps);
      for (int64_t j = 0; j < d; ++j) x[j] = w[j] * x[j] * inv_rms;
      for (int64_t i = 0; i < rd / 2; ++i) {
        const float angle = float(pos[t]) * inv[i];
        const double c = std::cos(double(angle)), s = std::sin(double(angle));
        const double x1 = x[i], x2 = x[i + rd / 2];
        x[i] = x1 * c - x2 * s;
        x[i + rd / 2] = x2 * c + x1 * s;
      }
    }
  return ref;
}

}  // namespace

TEST(QkNormRope, MatchesNormThenRotationPerHead) {
  for (const int64_t rd : {32, 24}) {  // whole head, and a partial rotary dim
    const int64_t n = 7, hq = 5, hkv = 2, d = 32, width = (hq + 2 * hkv) * d;
    RopeConfig rc;
    rc.theta = 10000;
    rc.partial_rotary_factor = double(rd) / double(d);
    const ops::RopeFrequencies f = ops::rope_frequencies(rc, d);
    ASSERT_EQ(f.rotary_dim, rd);
    std::vector<float> inv = f.inv_freq;
    Tensor qkv = random_tensor({n, width}, DType::kF32, 41, -3.f, 3.f);
    Tensor wq = random_tensor({d}, DType::kF32, 42, 0.5f, 1.5f);
    Tensor wk = random_tensor({d}, DType::kF32, 43, -1.5f, -0.5f);  // unlike wq: a swap shows
    std::vector<float> wqv(wq.data<float>(), wq.data<float>() + d),
        wkv(wk.data<float>(), wk.data<float>() + d);
    std::vector<int64_t> pos = {0, 1, 9, 100, 4096, 33000, 131071};
    const float eps = 1e-6f;
    const std::vector<double> ref = reference(qkv, hq, hkv, d, rd, wqv, wkv, pos, inv, eps);
    Tensor qk = qkv.slice(1, 0, (hq + hkv) * d).unflatten(1, {hq + hkv, d});
    ops::qk_norm_rope(qk, hq, wq, wk, eps, Tensor::from_blob(pos.data(), {n}, DType::kI64),
                      ops::rope_args(f, Tensor::from_blob(inv.data(), {rd / 2}, DType::kF32)));
    EXPECT_LT(max_abs_diff(qkv, ref), 2e-6) << "rotary dim " << rd;
  }
}

TEST(QkNormRope, RefusesShapesThatDoNotFit) {
  const int64_t n = 2, heads = 3, d = 16;
  Tensor qk = random_tensor({n, heads, d}, DType::kF32, 44, -1.f, 1.f);
  Tensor w = random_tensor({d}, DType::kF32, 45, 0.5f, 1.5f);
  Tensor short_w = random_tensor({d - 2}, DType::kF32, 46, 0.5f, 1.5f);
  std::vector<int64_t> pos = {3, 4};
  std::vector<float> inv(d / 2, 0.5f);
  const Tensor p = Tensor::from_blob(pos.data(), {n}, DType::kI64);
  ops::RopeArgs a;
  a.inv_freq = Tensor::from_blob(inv.data(), {d / 2}, DType::kF32);
  EXPECT_THROW(ops::qk_norm_rope(qk, heads + 1, w, w, 1e-6f, p, a), Error);
  EXPECT_THROW(ops::qk_norm_rope(qk, -1, w, w, 1e-6f, p, a), Error);
  EXPECT_THROW(ops::qk_norm_rope(qk, 1, short_w, w, 1e-6f, p, a), Error);
  EXPECT_THROW(ops::qk_norm_rope(qk, 1, w, short_w, 1e-6f, p, a), Error);
  EXPECT_THROW(ops::qk_norm_rope(qk.view({n, heads * d}), 1, w, w, 1e-6f, p, a), Error);
  // all heads q, or all k: fine
  EXPECT_NO_THROW(ops::qk_norm_rope(qk, heads, w, w, 1e-6f, p, a));
  EXPECT_NO_THROW(ops::qk_norm_rope(qk, 0, w, w, 1e-6f, p, a));
}
