// Cache attention against a dense computation with an explicit mask, in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/attention.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

struct AttnCase {
  int64_t n, hq, hkv, d, capacity, kv_len;
  std::vector<int64_t> qpos, kpos;
};

// out[i, h] = softmax over {j < kv_len : mask[i][j]} of scale * q.k_j, times v_j, in double.
std::vector<double> dense_reference(const AttnCase& s, const Tensor& q, const Tensor& k,
                                    const Tensor& v, float scale) {
  std::vector<double> out(s.n * s.hq * s.d, 0.0);
  const int64_t group = s.hq / s.hkv;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t g = h / group;
      std::vector<double> sc(s.kv_len);
      std::vector<bool> mask(s.kv_len);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < s.kv_len; ++j) {
        mask[j] = s.kpos[j] <= s.qpos[i];
        double dot = 0;
        for (int64_t c = 0; c < s.d; ++c)
          dot += value_at(q, (i * s.hq + h) * s.d + c) * value_at(k, (j * s.hkv + g) * s.d + c);
        sc[j] = dot * scale;
        if (mask[j]) mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < s.kv_len; ++j) sum += mask[j] ? std::exp(sc[j] - mx) : 0.0;
      if (sum == 0) continue;  // sees no key: zeros
      for (int64_t j = 0; j < s.kv_len; ++j) {
        if (!mask[j]) continue;
        const double p = std::exp(sc[j] - mx) / sum;
        for (int64_t c = 0; c < s.d; ++c)
          out[(i * s.hq + h) * s.d + c] += p * value_at(v, (j * s.hkv + g) * s.d + c);
      }
    }
  return out;
}

double run_case(const AttnCase& s, uint32_t seed, float qk_range = 2.f) {
  Tensor q = random_tensor({s.n, s.hq, s.d}, DType::kF32, seed, -qk_range, qk_range);
  Tensor k = random_tensor({s.capacity, s.hkv, s.d}, DType::kF32, seed + 1, -qk_range, qk_range);
  Tensor v = random_tensor({s.capacity, s.hkv, s.d}, DType::kF32, seed + 2);
  std::vector<int64_t> qpos = s.qpos, kpos = s.kpos;
  kpos.resize(s.capacity, 0);
  ops::AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.q_positions = Tensor::from_blob(qpos.data(), {s.n}, DType::kI64);
  a.k_positions = Tensor::from_blob(kpos.data(), {s.capacity}, DType::kI64);
  a.kv_len = s.kv_len;
  a.scale = 1.0f / std::sqrt(float(s.d));
  a.out = Tensor::empty({s.n, s.hq, s.d}, DType::kF32);
  ops::attention(a);
  return max_abs_diff(a.out, dense_reference(s, q, k, v, a.scale));
}

std::vector<int64_t> iota(int64_t from, int64_t n) {
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; ++i) r[i] = from + i;
  return r;
}

}  // namespace

TEST(Attention, CausalPrefillGqa) {
  // 300 keys: several 128-key chunks and a partial one; 8 q heads over 2 kv heads.
  AttnCase s{300, 8, 2, 16, 320, 300, iota(0, 300), iota(0, 300)};
  EXPECT_LT(run_case(s, 1), 2e-6);
}

TEST(Attention, ChunkAfterCachedPrefixAndLargeHeadDim) {
  // 37 new queries at positions 263..299 over 300 cached keys, head_dim 128, 4 q / 4 kv heads.
  AttnCase s{37, 4, 4, 128, 300, 300, iota(263, 37), iota(0, 300)};
  EXPECT_LT(run_case(s, 7), 2e-6);
}

TEST(Attention, DecodeSingleQuery) {
  AttnCase s{1, 4, 2, 64, 1000, 999, {998}, iota(0, 999)};
  EXPECT_LT(run_case(s, 13), 2e-6);
}

TEST(Attention, HeadDimNotMultipleOf16AndLargeScores) {
  // head_dim 24 takes the scalar tail of p.v; large q.k checks the max subtraction.
  AttnCase s{20, 6, 3, 24, 150, 150, iota(130, 20), iota(0, 150)};
  EXPECT_LT(run_case(s, 21, 6.f), 5e-6);
}

TEST(Attention, ArbitraryKeyPositionsAndQueriesThatSeeNothing) {
  // Keys out of order; query positions below every key see nothing and must give zeros.
  AttnCase s{5, 2, 1, 32, 200, 200, {-5, 0, 50, 199, 1000}, {}};
  for (int64_t j = 0; j < 200; ++j) s.kpos.push_back((j * 37) % 200);
  EXPECT_LT(run_case(s, 31), 2e-6);
}
