// The CUDA routing's CTA top-k (moe_route_device.cuh: a bitonic sort of each token's keys) where
// it runs: moe_route_cuda's sort kernel against its per-pick kernel (one warp recomputing the
// probabilities every pick) to the bit, and against the CPU twin moe_route_cpu within the softmax
// tolerance of moe_test.cpp; and moe_forward_cuda at decode against moe_route_cuda's per-pick
// kernel + moe_experts_cuda: ids, weights and output bytes equal. Over E 8-1024 (powers of two and
// not), top-k 1-16, T 1-33, f32 and bf16 logits (bf16 ties many), renormalized or not, with
// random, skewed and tied logits and with rows whose probabilities are NaN (a NaN logit, a +inf
// one, all -inf: such a token ranks nothing, ids E and weights -1, or 1 / k renormalized).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gpu_ops/gpu_ops_util.h"
#include "gpu_ops/moe_test_util.h"
#include "ops/moe.h"
#include "ops/moe_schedule.h"

namespace longctx::gpu_ops_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Logits { kRandom, kSkewed, kTied, kNaNRows };

// [T, E] f32 logits of one variant. kNaNRows: random, and rows t % 4 == 1 (a NaN logit), 2 (a
// +inf one), 3 (all -inf) whose probabilities are all NaN; row 0 has -inf logits among finite
// ones (probability +0, tied).
Tensor route_logits(int64_t tokens, int64_t experts, Logits kind, uint32_t seed) {
  Tensor l = random_host({tokens, experts}, kF32, seed, -3, 3);
  float* v = l.data<float>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < experts; ++e) {
      float& x = v[t * experts + e];
      if (kind == Logits::kSkewed && e % 7 == 3) x += 15.f;  // a few experts take the mass
      if (kind == Logits::kTied) x = float(e % 3);           // every pick a tie
      if (kind == Logits::kNaNRows) {
        const int64_t r = t % 4;
        if (r == 0 && e % 5 == 1) x = -kInf;
        if (r == 1 && e == experts / 2) x = std::numeric_limits<float>::quiet_NaN();
        if (r == 2 && e == experts - 1) x = kInf;
        if (r == 3) x = -kInf;
      }
    }
  return l;
}

bool nan_row(Logits kind, int64_t t) { return kind == Logits::kNaNRows && t % 4 != 0; }

std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor h = t.contiguous().to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// moe_route_cuda's two kernels give the same bytes; the sort kernel matches the CPU twin on rows
// with finite probabilities (ids at ties exactly: bit-equal logits give bit-equal probabilities
// on both; elsewhere ids may differ only at near ties, where the weights agree) and gives the
// per-pick kernel's picks of nothing on NaN rows.
TEST(MoeGpuRoute, SortEqualsPerPickAndCpu) {
  TestStream stream;
  int cases = 0;
  for (int64_t experts : {8, 60, 128, 256, 300, 512, 1024})
    for (int64_t k : {1, 2, 4, 8, 10, 16}) {
      if (k > experts) continue;
      for (int64_t tokens : {1, 3, 4, 33})
        for (Logits kind : {Logits::kRandom, Logits::kSkewed, Logits::kTied, Logits::kNaNRows})
          for (DType dtype : {kF32, kBf}) {
            if (dtype == kBf && tokens != 33) continue;  // bf16 logits: one T is enough
            const bool renormalize = (k + tokens + int(kind)) % 2 == 0;
            const uint32_t seed = uint32_t(experts * 31 + k * 7 + tokens + 1000 * int(kind));
            const Tensor l = route_logits(tokens, experts, kind, seed).to_dtype(dtype);
            const Tensor d_l = l.to(kGpu);
            Tensor ids[2], w[2];
            for (int i = 0; i < 2; ++i) {
              ids[i] = Tensor::empty({tokens, k}, DType::kI32, kGpu);
              w[i] = Tensor::empty({tokens, k}, kF32, kGpu);
              ops::moe_route_cuda(
                  d_l, renormalize, ids[i], w[i],
                  i == 0 ? ops::MoeRouteKernel::kSort : ops::MoeRouteKernel::kPerPick);
            }
            stream.sync();
            const std::string what = "E " + std::to_string(experts) + " k " + std::to_string(k) +
                                     " T " + std::to_string(tokens) + " logits " +
                                     std::to_string(int(kind)) + " " +
                                     std::string(dtype_name(dtype));
            ASSERT_TRUE(host_bytes(ids[0]) == host_bytes(ids[1])) << "ids, " << what;
            ASSERT_TRUE(host_bytes(w[0]) == host_bytes(w[1])) << "weights, " << what;
            ++cases;
            // against the CPU twin
            Tensor c_ids = Tensor::empty({tokens, k}, DType::kI32);
            Tensor c_w = Tensor::empty({tokens, k}, kF32);
            ops::moe_route_cpu(l, renormalize, c_ids, c_w);
            const Tensor g_ids = ids[0].to(Device::cpu()), g_w = w[0].to(Device::cpu());
            int64_t near_ties = 0;
            for (int64_t t = 0; t < tokens; ++t)
              for (int64_t j = 0; j < k; ++j) {
                const int64_t i = t * k + j;
                const int32_t gi = g_ids.data<int32_t>()[i];
                const float gw = g_w.data<float>()[i];
                if (nan_row(kind, t)) {
                  ASSERT_EQ(gi, experts) << what << " slot " << i;
                  ASSERT_EQ(gw, renormalize ? -1.f / -float(k) : -1.f) << what;
                  continue;
                }
                const float cw = c_w.data<float>()[i];
                const float tol = 4.8e-7f * float((experts + 31) / 32) * std::max(1.f, cw);
                ASSERT_NEAR(gw, cw, tol) << what << " slot " << i;
                if (gi == c_ids.data<int32_t>()[i]) continue;
                ASSERT_NE(kind, Logits::kTied) << what << " slot " << i;  // exact ties
                ++near_ties;
              }
            EXPECT_LE(near_ties, tokens * k / 1000 + 1) << what;
          }
    }
  EXPECT_GT(cases, 500);
  // the sort's limit
  Tensor l = Tensor::empty({1, ops::kMoeRouteSortMaxExperts + 1}, kF32, kGpu);
  Tensor ids = Tensor::empty({1, 2}, DType::kI32, kGpu), w = Tensor::empty({1, 2}, kF32, kGpu);
  EXPECT_THROW(ops::moe_route_cuda(l, true, ids, w, ops::MoeRouteKernel::kSort), Error);
  EXPECT_NO_THROW(ops::moe_route_cuda(l, true, ids, w, ops::MoeRouteKernel::kAuto));
  stream.sync();
}

// moe_forward_cuda at decode (moe_route's auto kernel: the CTA sort up to
// kMoeRouteSortMaxExperts, then the decode GEMVs) against the per-pick routing kernel +
// moe_experts_cuda: ids, weights and output bytes equal. NaN rows route to no expert: their
// output is the shared expert's alone, or 0.
TEST(MoeGpuRoute, ForwardEqualsPerPickThenExperts) {
  TestStream stream;
  constexpr int64_t kHidden = 64, kInter = 32;
  for (int64_t experts : {8, 60, 128, 256, 300, 512, 600}) {
    ops::MoeArgs dv;
    const uint32_t wseed = uint32_t(experts);
    const float a1 = 2.f / std::sqrt(float(kHidden)), a2 = 2.f / std::sqrt(float(kInter));
    dv.gate_up = random_host({experts, 2 * kInter, kHidden}, kBf, wseed + 2, -a1, a1).to(kGpu);
    dv.down = random_host({experts, kHidden, kInter}, kBf, wseed + 3, -a2, a2).to(kGpu);
    for (int64_t k : {1, 2, 4, 8, 10, 16}) {
      if (k > experts) continue;
      for (int64_t tokens : {1, 3, 4})
        for (Logits kind : {Logits::kRandom, Logits::kTied, Logits::kNaNRows}) {
          const bool renormalize = (k + tokens) % 2 == 1;
          const bool shared = (k + int(kind)) % 2 == 0;
          const uint32_t seed = uint32_t(experts * 17 + k * 5 + tokens + 100 * int(kind));
          const Tensor d_l = route_logits(tokens, experts, kind, seed).to(kGpu);
          ops::MoeArgs a[2] = {dv, dv};
          const Tensor x = random_host({tokens, kHidden}, kBf, seed + 1, -1, 1).to(kGpu);
          Tensor sh, sg;
          if (shared) {
            sh = random_host({tokens, kHidden}, kBf, seed + 4, -1, 1).to(kGpu);
            sg = random_host({tokens, 1}, kF32, seed + 5, -2, 2).to(kGpu);
          }
          for (ops::MoeArgs& m : a) {
            m.x = x;
            m.shared = sh;
            m.shared_gate = sg;
            m.topk_ids = Tensor::empty({tokens, k}, DType::kI32, kGpu);
            m.topk_weights = Tensor::empty({tokens, k}, kF32, kGpu);
            m.out = Tensor::empty({tokens, kHidden}, kBf, kGpu);
          }
          ops::moe_forward_cuda(d_l, renormalize, a[0]);
          ops::moe_route_cuda(d_l, renormalize, a[1].topk_ids, a[1].topk_weights,
                              ops::MoeRouteKernel::kPerPick);
          ops::moe_experts_cuda(a[1]);
          stream.sync();
          const std::string what = "E " + std::to_string(experts) + " k " + std::to_string(k) +
                                   " T " + std::to_string(tokens) + " logits " +
                                   std::to_string(int(kind));
          ASSERT_TRUE(host_bytes(a[0].topk_ids) == host_bytes(a[1].topk_ids)) << "ids, " << what;
          ASSERT_TRUE(host_bytes(a[0].topk_weights) == host_bytes(a[1].topk_weights))
              << "weights, " << what;
          ASSERT_TRUE(host_bytes(a[0].out) == host_bytes(a[1].out)) << "output, " << what;
          if (kind != Logits::kNaNRows || tokens < 2 || shared) continue;
          const Tensor o = a[0].out.to(Device::cpu()).to_dtype(kF32);
          for (int64_t c = 0; c < kHidden; ++c)
            ASSERT_EQ(o.data<float>()[kHidden + c], 0.f) << what;  // row 1: a NaN logit
        }
    }
  }
}

}  // namespace
}  // namespace longctx::gpu_ops_test
