// CUDA MoE ops against their CPU twins: moe_route (weights within 1e-6 in every slot; ids equal
// but at near ties, where the weights agree anyway: at most 0.1% of slots) and moe_experts (decode
// path at <= 4 tokens, the aligned grouped GEMMs above) over experts 8-128, top-k 1-8, tokens
// 1-16384, odd hidden / inter sizes (the decode GEMV's vector and scalar loads), skewed routing
// that leaves most experts empty, bf16 and f32 operands, with and without a shared expert. Both
// twins accumulate in fp32 and keep the activation in fp32; they differ in summation order only, so
// the tolerance per element is 1e-5 x (sum of |terms|) + one ulp of a bf16 out.
#include "ops/moe.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "gpu_ops/gpu_ops_util.h"

namespace longctx::gpu_ops_test {
namespace {

Tensor random_host(const Shape& shape, DType dtype, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor f = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = d(rng);
  return dtype == DType::kF32 ? f : f.to_dtype(DType::kF32).to_dtype(dtype);
}

struct MoeCase {
  int64_t tokens, experts, k, hidden, inter;
  DType dtype;  // x, weights, out
  bool skewed;  // logits favour experts 0 and 1: the rest are (nearly) empty
  bool shared;
};

class MoeGpu : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeGpu, MatchesCpuTwin) {
  const MoeCase c = GetParam();
  TestStream stream;
  const uint32_t seed = uint32_t(c.tokens * 131 + c.experts * 7 + c.k);
  Tensor logits = random_host({c.tokens, c.experts}, DType::kF32, seed, -3, 3);
  if (c.skewed)
    for (int64_t t = 0; t < c.tokens; ++t) {
      logits.data<float>()[t * c.experts + 0] += 20.f;
      if (c.k > 1) logits.data<float>()[t * c.experts + 1] += 19.f;
    }
  // routing
  Tensor ids = Tensor::empty({c.tokens, c.k}, DType::kI32);
  Tensor w = Tensor::empty({c.tokens, c.k}, DType::kF32);
  ops::moe_route(logits, c.k > 1, ids, w);
  Tensor d_logits = logits.to(kGpu);
  Tensor d_ids = Tensor::empty({c.tokens, c.k}, DType::kI32, kGpu);
  Tensor d_w = Tensor::empty({c.tokens, c.k}, DType::kF32, kGpu);
  ops::moe_route(d_logits, c.k > 1, d_ids, d_w);
  stream.sync();
  Tensor g_ids = d_ids.to(Device::cpu()), g_w = d_w.to(Device::cpu());
  int64_t near_ties = 0;
  for (int64_t i = 0; i < c.tokens * c.k; ++i) {
    // Softmax weights in fp32: the GPU sums the experts' exponentials in another order (a
    // 128-expert denominator moved a weight near 1 by 1.07e-6 on an H100): 4 ulps of 1 per
    // 32 experts, relative.
    const float tol = 4.8e-7f * float((c.experts + 31) / 32) * std::max(1.f, w.data<float>()[i]);
    ASSERT_NEAR(g_w.data<float>()[i], w.data<float>()[i], tol) << "slot " << i;
    if (g_ids.data<int32_t>()[i] != ids.data<int32_t>()[i]) ++near_ties;  // weights equal
  }
  EXPECT_LE(near_ties, c.tokens * c.k / 1000 + 1);

  // experts, both fed the CPU routing
  Tensor x = random_host({c.tokens, c.hidden}, c.dtype, seed + 1, -1, 1);
  const float a1 = 2.f / std::sqrt(float(c.hidden)), a2 = 2.f / std::sqrt(float(c.inter));
  Tensor gate_up = random_host({c.experts, 2 * c.inter, c.hidden}, c.dtype, seed + 2, -a1, a1);
  Tensor down = random_host({c.experts, c.hidden, c.inter}, c.dtype, seed + 3, -a2, a2);
  ops::MoeArgs h;
  h.x = x;
  h.topk_ids = ids;
  h.topk_weights = w;
  h.gate_up = gate_up;
  h.down = down;
  if (c.shared) {
    h.shared = random_host({c.tokens, c.hidden}, c.dtype, seed + 4, -1, 1);
    h.shared_gate = random_host({c.tokens, 1}, DType::kF32, seed + 5, -2, 2);
  }
  h.out = Tensor::empty({c.tokens, c.hidden}, DType::kF32);
  ops::moe_experts(h);
  // |terms|: the same op on |x|, |weights| bounds each element's sum of absolute products
  auto abs_of = [](const Tensor& t) {
    Tensor f = t.to_dtype(DType::kF32).contiguous();
    Tensor a = Tensor::empty(f.shape(), DType::kF32);
    for (int64_t i = 0; i < f.numel(); ++i) a.data<float>()[i] = std::fabs(f.data<float>()[i]);
    return a;
  };
  ops::MoeArgs ha = h;
  ha.x = abs_of(x);
  ha.gate_up = abs_of(gate_up);
  ha.down = abs_of(down);
  if (c.shared) ha.shared = abs_of(h.shared);
  ha.out = Tensor::empty({c.tokens, c.hidden}, DType::kF32);
  ops::moe_experts(ha);

  ops::MoeArgs dv;
  dv.x = x.to(kGpu);
  dv.topk_ids = ids.to(kGpu);
  dv.topk_weights = w.to(kGpu);
  dv.gate_up = gate_up.to(kGpu);
  dv.down = down.to(kGpu);
  if (c.shared) {
    dv.shared = h.shared.to(kGpu);
    dv.shared_gate = h.shared_gate.to(kGpu);
  }
  dv.out = Tensor::empty({c.tokens, c.hidden}, c.dtype, kGpu);
  ops::moe_experts(dv);
  stream.sync();
  Tensor got = dv.out.to(Device::cpu()).to_dtype(DType::kF32);
  const double ulp = c.dtype == DType::kBF16 ? 1.0 / 128 : 0.0;
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double ref = h.out.data<float>()[i], g = got.data<float>()[i];
    const double tol = 1e-5 * (ha.out.data<float>()[i] + 1e-3) + ulp * std::fabs(ref);
    const double err = std::fabs(g - ref);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << " (token " << i / c.hidden << "): got " << g << ", cpu "
                    << ref << ", tol " << tol;
  }
  EXPECT_EQ(bad, 0);
  fmt::print("T {} E {} k {} H {} I {} {}: worst err / tol {:.3f}\n", c.tokens, c.experts, c.k,
             c.hidden, c.inter, dtype_name(c.dtype), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeGpu,
    ::testing::Values(MoeCase{1, 8, 1, 72, 40, DType::kBF16, false, false},
                      MoeCase{2, 16, 2, 70, 36, DType::kBF16, false, true},  // scalar GEMV loads
                      MoeCase{1, 128, 8, 256, 96, DType::kBF16, false, false},
                      MoeCase{3, 60, 4, 136, 56, DType::kBF16, false, true},
                      MoeCase{4, 128, 8, 200, 72, DType::kF32, false, false},
                      MoeCase{5, 8, 2, 72, 40, DType::kBF16, false, false},
                      MoeCase{17, 128, 8, 72, 40, DType::kBF16, true, false},
                      MoeCase{333, 60, 4, 130, 50, DType::kF32, false, true},
                      MoeCase{1000, 128, 1, 64, 33, DType::kBF16, true, false},
                      MoeCase{4096, 128, 8, 96, 48, DType::kBF16, false, false},
                      MoeCase{4097, 16, 2, 256, 128, DType::kBF16, false, true},
                      MoeCase{16384, 128, 8, 64, 32, DType::kBF16, false, false},
                      MoeCase{16384, 8, 2, 72, 40, DType::kBF16, true, false}));

}  // namespace
}  // namespace longctx::gpu_ops_test
