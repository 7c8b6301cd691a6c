// The CPU merge references: states over disjoint key subsets merge to attention over the union
// (computed directly), empty (-inf) states drop out, huge lse values stay finite, the strided and
// pointer-array forms agree, and bf16/f16 in/out match the formula on the rounded inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/merge_cpu.h"
#include "kernels/decode_test_util.h"

namespace longctx {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct States {
  int n_states, rows, heads, dim;
  std::vector<float> o;    // [n_states, rows, heads, dim]
  std::vector<float> lse;  // [n_states, rows, heads]
  std::vector<double> ref_o;
  std::vector<double> ref_lse;
};

// Random attention rows; the keys of each (row, head) are cut into n_states consecutive parts
// (some empty); each part's exact state is a merge input, the whole set the reference.
States make_states(int n_states, int rows, int heads, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::uniform_int_distribution<int> len(0, 6);
  States s{n_states, rows, heads, dim, {}, {}, {}, {}};
  s.o.assign(size_t(n_states) * rows * heads * dim, 0.f);
  s.lse.assign(size_t(n_states) * rows * heads, 0.f);
  s.ref_o.assign(size_t(rows) * heads * dim, 0.0);
  s.ref_lse.assign(size_t(rows) * heads, 0.0);
  for (int r = 0; r < rows * heads; ++r) {
    std::vector<float> q(dim);
    for (auto& x : q) x = u(rng);
    std::vector<std::vector<float>> all_k, all_v;
    for (int st = 0; st < n_states; ++st) {
      std::vector<std::vector<float>> k, v;
      const int n = (r % 3 == 0 && st == 0) ? 0 : len(rng);  // some empty parts
      for (int j = 0; j < n; ++j) {
        k.emplace_back(dim);
        v.emplace_back(dim);
        for (auto& x : k.back()) x = u(rng);
        for (auto& x : v.back()) x = u(rng);
        all_k.push_back(k.back());
        all_v.push_back(v.back());
      }
      std::vector<double> o;
      double l = testing::dense_row(q, k, v, 0.7, o);
      s.lse[size_t(st) * rows * heads + r] = float(l);
      for (int d = 0; d < dim; ++d) s.o[(size_t(st) * rows * heads + r) * dim + d] = float(o[d]);
    }
    std::vector<double> o;
    s.ref_lse[r] = testing::dense_row(q, all_k, all_v, 0.7, o);
    for (int d = 0; d < dim; ++d) s.ref_o[size_t(r) * dim + d] = o[d];
  }
  return s;
}

kernels::MergeParams strided(const States& s, std::vector<float>& out, std::vector<float>& lse) {
  kernels::MergeParams p;
  p.o_in = s.o.data();
  p.lse_in = s.lse.data();
  p.state_stride_o = int64_t(s.rows) * s.heads * s.dim;
  p.state_stride_lse = int64_t(s.rows) * s.heads;
  out.assign(size_t(s.rows) * s.heads * s.dim, 123.f);
  lse.assign(size_t(s.rows) * s.heads, 123.f);
  p.o_out = out.data();
  p.lse_out = lse.data();
  p.num_states = s.n_states;
  p.num_rows = s.rows;
  p.num_heads = s.heads;
  p.head_dim = s.dim;
  return p;
}

void expect_matches_union(const States& s, const std::vector<float>& out,
                          const std::vector<float>& lse) {
  for (int r = 0; r < s.rows * s.heads; ++r) {
    if (std::isinf(s.ref_lse[r])) {
      EXPECT_EQ(lse[r], -kInf) << r;
      for (int d = 0; d < s.dim; ++d) EXPECT_EQ(out[size_t(r) * s.dim + d], 0.f);
      continue;
    }
    EXPECT_NEAR(lse[r], s.ref_lse[r], 1e-5) << r;
    for (int d = 0; d < s.dim; ++d)
      EXPECT_NEAR(out[size_t(r) * s.dim + d], s.ref_o[size_t(r) * s.dim + d], 1e-5) << r;
  }
}

TEST(MergeRef, NStatesEqualAttentionOverTheUnion) {
  for (int n : {1, 2, 3, 7}) {
    States s = make_states(n, 5, 3, 16, 100 + n);
    std::vector<float> out, lse;
    kernels::cpu::merge_states(strided(s, out, lse));
    SCOPED_TRACE(n);
    expect_matches_union(s, out, lse);
  }
}

TEST(MergeRef, PointerArrayEqualsStrided) {
  States s = make_states(4, 3, 2, 8, 7);
  std::vector<float> out1, lse1, out2, lse2;
  kernels::cpu::merge_states(strided(s, out1, lse1));
  auto p = strided(s, out2, lse2);
  std::vector<const void*> o_ptrs;
  std::vector<const float*> lse_ptrs;
  for (int st = 0; st < s.n_states; ++st) {
    o_ptrs.push_back(s.o.data() + size_t(st) * p.state_stride_o);
    lse_ptrs.push_back(s.lse.data() + size_t(st) * p.state_stride_lse);
  }
  p.o_in = nullptr;
  p.lse_in = nullptr;
  p.o_ptrs = o_ptrs.data();
  p.lse_ptrs = lse_ptrs.data();
  kernels::cpu::merge_states(p);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(lse1, lse2);
}

TEST(MergeRef, TwoStatesEmptyAndHugeLse) {
  // Row 0: a empty -> b. Row 1: both empty -> 0, -inf. Row 2: lse 1000 / 1001 (exp overflows
  // without the max subtraction). Row 3: lse -1000 / -1001 (underflows without it).
  const int D = 4;
  std::vector<float> oa = {1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 1, 1, 2, 2, 2, 2};
  std::vector<float> ob = {-1, -2, -3, -4, 9, 9, 9, 9, 3, 3, 3, 3, 4, 4, 4, 4};
  std::vector<float> la = {-kInf, -kInf, 1000.f, -1000.f};
  std::vector<float> lb = {0.5f, -kInf, 1001.f, -1001.f};
  std::vector<float> o(16), lse(4);
  kernels::cpu::merge_two_states(oa.data(), la.data(), ob.data(), lb.data(), o.data(), lse.data(),
                                 4, 1, D, DType::kF32);
  for (int d = 0; d < D; ++d) EXPECT_EQ(o[d], ob[d]);
  EXPECT_FLOAT_EQ(lse[0], 0.5f);
  for (int d = 0; d < D; ++d) EXPECT_EQ(o[D + d], 0.f);
  EXPECT_EQ(lse[1], -kInf);
  const double wa = 1.0 / (1.0 + std::exp(1.0)), wb = 1.0 - wa;  // lse 1000 vs 1001
  for (int d = 0; d < D; ++d) EXPECT_NEAR(o[2 * D + d], wa * 1 + wb * 3, 1e-6);
  EXPECT_NEAR(lse[2], 1001.0 + std::log1p(std::exp(-1.0)), 1e-3);
  for (int d = 0; d < D; ++d) EXPECT_NEAR(o[3 * D + d], wb * 2 + wa * 4, 1e-6);
  EXPECT_NEAR(lse[3], -1000.0 + std::log1p(std::exp(-1.0)), 1e-3);
}

TEST(MergeRef, HalfPrecisionInOut) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const int rows = 6, heads = 2, D = 32;
    const int64_t n = int64_t(rows) * heads * D;
    auto oa = testing::random_half(n, dt, 1), ob = testing::random_half(n, dt, 2);
    std::vector<float> la(rows * heads), lb(rows * heads);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-5.f, 5.f);
    for (auto& x : la) x = u(rng);
    for (auto& x : lb) x = u(rng);
    lb[0] = -kInf;
    std::vector<uint16_t> o(n);
    std::vector<float> lse(rows * heads);
    kernels::cpu::merge_two_states(oa.data(), la.data(), ob.data(), lb.data(), o.data(), lse.data(),
                                   rows, heads, D, dt);
    for (int r = 0; r < rows * heads; ++r) {
      const double m = std::max(la[r], lb[r]);
      const double ea = std::exp(la[r] - m), eb = std::exp(lb[r] - m);
      EXPECT_NEAR(lse[r], m + std::log(ea + eb), 1e-5);
      for (int d = 0; d < D; ++d) {
        const int64_t i = int64_t(r) * D + d;
        const double want =
            (ea * testing::half_to_f32(oa[i], dt) + eb * testing::half_to_f32(ob[i], dt)) /
            (ea + eb);
        EXPECT_NEAR(testing::half_to_f32(o[i], dt), want, dt == DType::kBF16 ? 4e-3 : 5e-4);
      }
    }
  }
}

// Accumulating the states one by one into an fp32 state (the offload path) gives the N-way
// merge: attention over the union.
TEST(MergeRef, AccumulateStateEqualsTheNWayMerge) {
  for (int n : {1, 2, 5}) {
    const States s = make_states(n, 9, 3, 20, 40 + n);
    std::vector<float> acc_o(size_t(s.rows) * s.heads * s.dim, 7.f),
        acc_lse(size_t(s.rows) * s.heads, 7.f);
    for (int st = 0; st < n; ++st) {
      kernels::StateAccumulateParams a;
      a.acc_o = acc_o.data();
      a.acc_lse = acc_lse.data();
      a.o = s.o.data() + size_t(st) * s.rows * s.heads * s.dim;
      a.lse = s.lse.data() + size_t(st) * s.rows * s.heads;
      a.num_rows = s.rows;
      a.num_heads = s.heads;
      a.head_dim = s.dim;
      a.dtype = DType::kF32;
      a.init = st == 0;
      kernels::cpu::accumulate_state(a);
    }
    expect_matches_union(s, acc_o, acc_lse);
  }
}

}  // namespace
}  // namespace longctx
