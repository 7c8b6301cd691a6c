// The CUDA routing's top-k selection (ops/moe_route_schedule.h) checked on the CPU: the key order
// against the order of picks, the bitonic network's steps (disjoint pairs covering every key, so
// a CTA's threads may take them in any split), and the network's sort of routing-like
// probabilities (ties, zeros from -inf logits, E not a power of two) against std::sort under the
// order of picks, with the picks' sum and weights; and the softmax property the NaN rule rests on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "ops/moe_route_schedule.h"

using namespace longctx::ops;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Pick {
  float p;
  int e;
};
// moe.h's order of picks: probability descending, the lower expert among equal ones
bool before(const Pick& a, const Pick& b) { return a.p > b.p || (a.p == b.p && a.e < b.e); }

uint32_t bits(float f) { return moe_route_float_bits(f); }

// Probabilities as the kernels compute them: expf(l - max) / sum, summed in index order (the
// CPU sum's order differs from the kernels' butterfly; the sort only needs realistic values).
std::vector<float> softmax(const std::vector<float>& logits) {
  float mx = -kInf;
  for (float l : logits) mx = std::fmax(mx, l);
  float sum = 0.f;
  for (float l : logits) sum += std::exp(l - mx);
  std::vector<float> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp(logits[i] - mx) / sum;
  return p;
}

// The keys a CTA sorts, padded to moe_route_sort_size, sorted by the network on one thread.
std::vector<uint64_t> network_sort(const std::vector<float>& p) {
  const int experts = static_cast<int>(p.size());
  std::vector<uint64_t> keys(moe_route_sort_size(experts), 0);
  for (int e = 0; e < experts; ++e) keys[e] = moe_route_key(p[e], e);
  moe_bitonic_sort_desc(keys.data(), static_cast<int>(keys.size()), 0, 1, [](bool) {});
  return keys;
}

std::vector<Pick> std_sorted(const std::vector<float>& p) {
  std::vector<Pick> picks;
  for (int e = 0; e < static_cast<int>(p.size()); ++e) picks.push_back({p[e], e});
  std::sort(picks.begin(), picks.end(), before);
  return picks;
}

TEST(MoeRouteSchedule, SortSize) {
  EXPECT_EQ(moe_route_sort_size(1), 1);
  EXPECT_EQ(moe_route_sort_size(2), 2);
  EXPECT_EQ(moe_route_sort_size(3), 4);
  EXPECT_EQ(moe_route_sort_size(60), 64);
  EXPECT_EQ(moe_route_sort_size(128), 128);
  EXPECT_EQ(moe_route_sort_size(300), 512);
  EXPECT_EQ(moe_route_sort_size(512), 512);
  EXPECT_EQ(moe_route_sort_size(1024), 1024);
  // within the 32 per-lane logits the CTA's shared keys are sized by (moe_schedule.h's powers of
  // two from 4)
  for (int e = 1; e <= 1024; ++e) {
    const int n = moe_route_sort_size(e);
    ASSERT_GE(n, e);
    ASSERT_LT(n / 2, e);
    ASSERT_EQ(n & (n - 1), 0);
  }
}

// A larger key is exactly an earlier pick, over probabilities a routing gives (+0, subnormals,
// ties, 1) and expert indices up to 2^31 - 1; keys decode to their pick; padding is below all.
TEST(MoeRouteSchedule, KeyOrderIsPickOrder) {
  const std::vector<float> probs = {0.f,
                                    std::numeric_limits<float>::denorm_min(),
                                    1e-40f,
                                    std::numeric_limits<float>::min(),
                                    1e-7f,
                                    0.125f,
                                    std::nextafter(0.125f, 1.f),
                                    0.5f,
                                    1.f};
  const std::vector<int> experts = {0, 1, 2, 7, 511, 512, 1023, 1 << 20, 0x7fffffff};
  for (float pa : probs)
    for (int ea : experts) {
      const uint64_t ka = moe_route_key(pa, ea);
      ASSERT_EQ(bits(moe_route_key_prob(ka)), bits(pa));
      ASSERT_EQ(moe_route_key_expert(ka), ea);
      ASSERT_GT(ka, 0u);
      for (float pb : probs)
        for (int eb : experts) {
          const uint64_t kb = moe_route_key(pb, eb);
          ASSERT_EQ(ka > kb, before({pa, ea}, {pb, eb}))
              << pa << " " << ea << " " << pb << " " << eb;
        }
    }
  // a NaN token's picks: probability -1, expert E (no expert's row)
  for (int e : {1, 8, 60, 512, 1024}) {
    EXPECT_EQ(moe_route_key_prob(moe_route_nan_key(e)), -1.f);
    EXPECT_EQ(moe_route_key_expert(moe_route_nan_key(e)), e);
  }
}

// Each step's n / 2 pairs are disjoint and cover [0, n), the lower key first; in a warp-local
// step pair q stays within the 64 keys of its run of 32 pairs (its warp's); the steps are
// log2(n) (log2(n) + 1) / 2, and the sort's barriers CTA-wide exactly where a step or the next
// is not warp-local, and after the last.
TEST(MoeRouteSchedule, NetworkStepsPartitionTheKeys) {
  for (int n = 2; n <= 1024; n *= 2) {
    int steps = 0;
    std::vector<bool> local;  // per step
    for (int size = 2; size <= n; size *= 2)
      for (int stride = size / 2; stride > 0; stride /= 2) {
        ++steps;
        local.push_back(moe_bitonic_warp_local(stride));
        std::vector<int> seen(n, 0);
        for (int q = 0; q < n / 2; ++q) {
          const int i = moe_bitonic_lower(q, stride);
          ASSERT_GE(i, 0);
          ASSERT_LT(i + stride, n);
          ASSERT_EQ(i & stride, 0) << n << " " << stride << " " << q;
          if (local.back()) {
            ASSERT_EQ(i / 64, q / 32) << n << " " << stride << " " << q;
            ASSERT_EQ((i + stride) / 64, q / 32) << n << " " << stride << " " << q;
          }
          ++seen[i];
          ++seen[i + stride];
        }
        for (int v : seen) ASSERT_EQ(v, 1) << n << " " << size << " " << stride;
      }
    const int lg = __builtin_ctz(static_cast<unsigned>(n));
    EXPECT_EQ(steps, lg * (lg + 1) / 2) << n;
    std::vector<bool> cta;
    std::vector<uint64_t> keys(n, 0);
    moe_bitonic_sort_desc(keys.data(), n, 0, 1, [&](bool c) { cta.push_back(c); });
    ASSERT_EQ(static_cast<int>(cta.size()), steps);
    for (int s = 0; s < steps; ++s)
      EXPECT_EQ(cta[s], s + 1 == steps || !local[s] || !local[s + 1]) << n << " step " << s;
    if (n == 512) EXPECT_EQ(std::count(cta.begin(), cta.end(), true), 10);
    if (n == 128) EXPECT_EQ(std::count(cta.begin(), cta.end(), true), 3);
  }
}

// The network's order is std::sort's under the order of picks, for every rank (so any top-k),
// with the picks' sum and weights from the sorted keys.
TEST(MoeRouteSchedule, SortsLikeStdSort) {
  std::mt19937 rng(7);
  for (int experts : {1, 2, 3, 8, 60, 100, 128, 256, 300, 512, 1000, 1024}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<float> logits(experts);
      std::normal_distribution<float> normal(0.f, 2.f);
      std::uniform_int_distribution<int> level(0, 3);
      for (int e = 0; e < experts; ++e) {
        switch (pattern) {
          case 0:  // distinct
            logits[e] = normal(rng);
            break;
          case 1:  // a few levels: many bit-equal probabilities
            logits[e] = 0.5f * static_cast<float>(level(rng));
            break;
          case 2:  // -inf logits (probability +0) among others
            logits[e] = level(rng) == 0 ? -kInf : normal(rng);
            break;
          default:  // all equal
            logits[e] = 1.25f;
            break;
        }
      }
      if (pattern == 2) logits[experts / 2] = 0.f;  // at least one finite logit
      const std::vector<float> p = softmax(logits);
      const std::vector<uint64_t> keys = network_sort(p);
      const std::vector<Pick> want = std_sorted(p);
      for (int r = 0; r < experts; ++r) {
        ASSERT_EQ(moe_route_key_expert(keys[r]), want[r].e)
            << experts << " " << pattern << " " << r;
        ASSERT_EQ(bits(moe_route_key_prob(keys[r])), bits(want[r].p));
      }
      for (size_t r = experts; r < keys.size(); ++r) ASSERT_EQ(keys[r], 0u);  // padding last
      for (int k : {1, 2, 4, 8, 10, 16}) {
        if (k > experts) continue;
        float picked = 0.f;
        for (int j = 0; j < k; ++j) picked += want[j].p;
        ASSERT_EQ(bits(moe_route_picked(keys.data(), k)), bits(picked));
        for (int j = 0; j < k; ++j) {
          ASSERT_EQ(bits(moe_route_weight(keys.data(), k, j, true)), bits(want[j].p / picked));
          ASSERT_EQ(bits(moe_route_weight(keys.data(), k, j, false)), bits(want[j].p));
        }
      }
    }
  }
}

// Random keys (any 64-bit values, with repeats) of every power-of-two size: sorted descending.
TEST(MoeRouteSchedule, NetworkSortsAnyKeys) {
  std::mt19937_64 rng(11);
  for (int n = 1; n <= 1024; n *= 2)
    for (int rep = 0; rep < 8; ++rep) {
      std::vector<uint64_t> keys(n);
      for (uint64_t& k : keys) k = rep % 2 ? rng() % 5 : rng();
      std::vector<uint64_t> want = keys;
      std::sort(want.begin(), want.end(), std::greater<>());
      moe_bitonic_sort_desc(keys.data(), n, 0, 1, [](bool) {});
      ASSERT_EQ(keys, want) << n;
    }
}

// The kernels branch once per token on the softmax's sum: every probability is NaN when the sum
// is (a NaN logit, a +inf one, or all -inf), and none is otherwise. Checked with the kernels'
// formula on tokens with such logits.
TEST(MoeRouteSchedule, NaNProbabilitiesAreAllOrNone) {
  const std::vector<std::vector<float>> rows = {
      {0.f, 1.f, kNaN, 2.f}, {kInf, 1.f, 0.f}, {-kInf, -kInf, -kInf}, {kInf, kInf},
      {-kInf, 3.f, -kInf},   {1.f, 1.f, 1.f},  {-1e30f, 1e30f, 0.f},  {kNaN}};
  for (const auto& row : rows) {
    const std::vector<float> p = softmax(row);
    const size_t nans = std::count_if(p.begin(), p.end(), [](float v) { return std::isnan(v); });
    EXPECT_TRUE(nans == 0 || nans == p.size());
    bool bad = false;
    for (float l : row) bad = bad || std::isnan(l) || l == kInf;
    bad = bad || std::all_of(row.begin(), row.end(), [](float l) { return l == -kInf; });
    EXPECT_EQ(nans == p.size(), bad);
    for (float v : p)
      if (!std::isnan(v)) EXPECT_EQ(bits(v) >> 31, 0u);  // +0 or positive: the keys' premise
  }
}

}  // namespace
