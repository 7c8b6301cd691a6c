// CUDA MoE ops against their CPU twins: moe_route (weights within 1e-6 in every slot; ids equal
// but at near ties, where the weights agree anyway: at most 0.1% of slots) and moe_experts over
// experts 8-128, top-k 1-8, tokens 1-16384 (the decode GEMVs at <= 4 tokens; above, the
// tensor-core grouped GEMMs for 16-bit operands with hidden / inter multiples of 8, including
// ones that are not multiples of the 128-wide tiles, and the SIMT grouped GEMMs for f32 and odd
// sizes), Qwen3-30B-A3B's hidden 2048 / inter 768 among them, skewed routing that leaves most
// experts empty, bf16 / f16 / f32 operands, with and without a shared expert.
// Tolerance per element: both twins accumulate in fp32 and differ in summation order, 1e-5 x
// (sum of |terms|); the tensor-core path rounds the activation silu(gate) * up to the 16-bit dtype
// before the down GEMM (as transformers keeps it), which moves each term by at most the dtype's
// unit roundoff u (2^-8 bf16, 2^-11 f16): u x (sum of |terms|) more; plus one ulp of a 16-bit out.
// The output starts as NaN bytes, so an element left unwritten fails, and non-finite outputs are
// counted. A CUDA graph of routing + experts replays to the eager bytes, also after the routing
// changes (nothing is read on the host). LONGCTX_PERF=1 times one Qwen3-30B-A3B layer's experts.
#include "ops/moe.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/device_pool.h"
#include "gpu_ops/gpu_ops_util.h"
#include "ops/moe_schedule.h"

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
  LONGCTX_CUDA_CHECK(cudaMemsetAsync(dv.out.data_ptr(), 0xFF, dv.out.nbytes(), stream.get()));
  ops::moe_experts(dv);
  stream.sync();  // count_non_finite runs on the legacy default stream
  EXPECT_EQ(count_non_finite(dv.out.data_ptr(), c.dtype, c.tokens, c.hidden, c.hidden), 0);
  Tensor got = dv.out.to(Device::cpu()).to_dtype(DType::kF32);
  const bool bf16 = c.dtype == DType::kBF16, f16 = c.dtype == DType::kF16;
  const ops::MoePath path = ops::moe_path(c.tokens, c.hidden, c.inter, bf16 || f16, true);
  const double ulp = bf16 ? 1.0 / 128 : f16 ? 1.0 / 1024 : 0.0;
  const double act_u = path != ops::MoePath::kTensorCore ? 0.0
                       : bf16                            ? 1.0 / 256
                                                         : 1.0 / 2048;  // unit roundoff
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double ref = h.out.data<float>()[i], g = got.data<float>()[i];
    const double tol = (1e-5 + act_u) * (ha.out.data<float>()[i] + 1e-3) + ulp * std::fabs(ref);
    const double err = std::fabs(g - ref);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << " (token " << i / c.hidden << "): got " << g << ", cpu "
                    << ref << ", tol " << tol;
  }
  EXPECT_EQ(bad, 0);
  const char* path_name = path == ops::MoePath::kDecode       ? "decode"
                          : path == ops::MoePath::kTensorCore ? "tensor-core"
                                                              : "simt";
  fmt::print("T {} E {} k {} H {} I {} {} ({}): worst err / tol {:.3f}\n", c.tokens, c.experts, c.k,
             c.hidden, c.inter, dtype_name(c.dtype), path_name, worst);
}

constexpr DType kBf = DType::kBF16, kF16 = DType::kF16, kF32 = DType::kF32;

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeGpu,
    ::testing::Values(
        // decode GEMVs
        MoeCase{1, 8, 1, 72, 40, kBf, false, false},
        MoeCase{1, 128, 8, 2048, 768, kBf, false, false},  // Qwen3-30B-A3B, batch 1
        MoeCase{2, 16, 2, 70, 36, kBf, false, true},       // scalar GEMV loads
        MoeCase{1, 128, 8, 256, 96, kBf, false, false},
        MoeCase{3, 60, 4, 136, 56, kBf, false, true},
        MoeCase{4, 128, 8, 200, 72, kF32, false, false},
        MoeCase{4, 128, 8, 200, 136, kF16, false, false},
        // tensor-core grouped GEMMs
        MoeCase{5, 8, 2, 72, 40, kBf, false, false},
        MoeCase{5, 128, 8, 200, 136, kBf, false, false},  // not multiples of the tiles
        MoeCase{17, 128, 8, 72, 40, kBf, true, false},    // skewed: most experts empty
        MoeCase{17, 128, 8, 2048, 768, kBf, false, false},
        MoeCase{300, 128, 8, 2048, 768, kBf, false, false},
        MoeCase{300, 64, 6, 200, 136, kF16, false, true},
        MoeCase{300, 8, 1, 64, 32, kBf, true, false},
        MoeCase{1000, 128, 1, 64, 32, kBf, true, false},
        MoeCase{4096, 128, 8, 96, 48, kBf, false, false},
        MoeCase{4097, 16, 2, 256, 128, kBf, false, true},
        MoeCase{16384, 128, 8, 64, 32, kBf, false, false},
        MoeCase{16384, 8, 2, 72, 40, kBf, true, false},
        // SIMT grouped GEMMs: f32 operands, hidden / inter not multiples of 8
        MoeCase{333, 60, 4, 130, 50, kF32, false, true},
        MoeCase{333, 60, 4, 130, 50, kBf, false, false},
        MoeCase{4096, 128, 8, 72, 40, kF32, false, false}));

// Random routing inputs and weights on the GPU for the graph and perf tests.
struct DeviceMoe {
  Tensor logits, ids, weights;
  ops::MoeArgs args;
  DeviceMoe(int64_t tokens, int64_t experts, int64_t k, int64_t hidden, int64_t inter, DType dtype,
            uint32_t seed) {
    logits = random_host({tokens, experts}, kF32, seed, -3, 3).to(kGpu);
    ids = Tensor::empty({tokens, k}, DType::kI32, kGpu);
    weights = Tensor::empty({tokens, k}, kF32, kGpu);
    args.x = random_host({tokens, hidden}, dtype, seed + 1, -1, 1).to(kGpu);
    args.topk_ids = ids;
    args.topk_weights = weights;
    const float a1 = 2.f / std::sqrt(float(hidden)), a2 = 2.f / std::sqrt(float(inter));
    args.gate_up = Tensor::empty({experts, 2 * inter, hidden}, dtype, kGpu);
    args.down = Tensor::empty({experts, hidden, inter}, dtype, kGpu);
    fill_uniform(args.gate_up.data_ptr(), args.gate_up.numel(), dtype, seed + 2, -a1, a1);
    fill_uniform(args.down.data_ptr(), args.down.numel(), dtype, seed + 3, -a2, a2);
    args.out = Tensor::empty({tokens, hidden}, dtype, kGpu);
  }
  void run(bool renormalize = true) {
    ops::moe_route(logits, renormalize, ids, weights);
    ops::moe_experts(args);
  }
};

struct GraphCase {
  int64_t tokens, experts, k, hidden, inter;
  DType dtype;
};
class MoeGpuGraph : public ::testing::TestWithParam<GraphCase> {};

// Routing + experts captured once replay to the eager bytes, and after new logits are copied in,
// to the eager bytes of the new routing. The capture's buffers come from a private pool (as the
// engine's decode graphs do), so nothing else is handed their addresses while the graph lives.
TEST_P(MoeGpuGraph, ReplayEqualsEager) {
  const GraphCase c = GetParam();
  TestStream stream;
  DeviceMoe m(c.tokens, c.experts, c.k, c.hidden, c.inter, c.dtype, 91);
  Tensor logits2 = random_host({c.tokens, c.experts}, kF32, 92, -3, 3);
  auto out_bytes = [&] {
    stream.sync();
    Tensor h = m.args.out.to(Device::cpu());
    const auto* p = static_cast<const uint8_t*>(h.data_ptr());
    return std::vector<uint8_t>(p, p + h.nbytes());
  };
  m.run();
  const std::vector<uint8_t> want1 = out_bytes();

  detail::DevicePool& pool = detail::device_pool(kGpu.index);
  const uint64_t id = pool.create_private_pool();
  cudaGraph_t graph = nullptr;
  pool.begin_private(id);
  try {
    m.run();  // warm-up: the private pool's segments
    stream.sync();
    LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    m.run();
    LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  } catch (...) {
    pool.end_private();
    throw;
  }
  pool.end_private();
  cudaGraphExec_t exec = nullptr;
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  auto replay = [&] {
    LONGCTX_CUDA_CHECK(
        cudaMemsetAsync(m.args.out.data_ptr(), 0xFF, m.args.out.nbytes(), stream.get()));
    LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    return out_bytes();
  };
  EXPECT_TRUE(replay() == want1) << "replay, same logits";
  m.logits.copy_from_async(logits2, stream.get());  // ordered before the replay
  const std::vector<uint8_t> got2 = replay();
  EXPECT_TRUE(got2 != want1) << "new logits left the output unchanged";
  LONGCTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LONGCTX_CUDA_CHECK(cudaGraphDestroy(graph));
  m.run();
  EXPECT_TRUE(out_bytes() == got2) << "replay with new logits against eager";
  pool.release_private_pool(id);
}

INSTANTIATE_TEST_SUITE_P(Paths, MoeGpuGraph,
                         ::testing::Values(GraphCase{1, 128, 8, 2048, 768, kBf},    // decode
                                           GraphCase{4, 64, 4, 200, 136, kF16},     // decode
                                           GraphCase{300, 128, 8, 256, 136, kBf},   // tensor cores
                                           GraphCase{300, 16, 2, 130, 50, kF32}));  // SIMT

TEST(MoeGpuErrors, TooManyExpertsForTheAlignStep) {
  TestStream stream;
  DeviceMoe m(8, 8193, 1, 8, 8, kBf, 5);
  try {
    m.run(false);
    stream.sync();
    ADD_FAILURE() << "8193 experts accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("8193 experts"), std::string::npos) << e.what();
  }
}

// One Qwen3-30B-A3B layer's routed experts (128 experts, top-8, hidden 2048, inter 768, bf16):
// decode at 1 token (GB/s of the 8 routed experts' 75.5 MB, cycling 16 routings so that L2 holds
// little of them) and prefill chunks (TFLOP/s of 2 x 3 x 2048 x 768 x 8 FLOPs per token).
TEST(GpuOpsPerf, MoeQwen3_30B_A3B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  constexpr int64_t kE = 128, kK = 8, kH = 2048, kI = 768;
  const double flops_per_token = 2.0 * 3 * kH * kI * kK;
  {
    constexpr int kRoutings = 16;
    DeviceMoe m(kRoutings, kE, kK, kH, kI, kBf, 3);
    ops::moe_route(m.logits, true, m.ids, m.weights);
    int call = 0;
    auto op = [&] {
      const int64_t t = call++ % kRoutings;
      ops::MoeArgs a = m.args;
      a.x = m.args.x.slice(0, t, t + 1);
      a.topk_ids = m.ids.slice(0, t, t + 1);
      a.topk_weights = m.weights.slice(0, t, t + 1);
      a.out = m.args.out.slice(0, t, t + 1);
      ops::moe_experts(a);
    };
    const double ms = time_ms(s, op);
    const double bytes = 3.0 * kH * kI * kK * 2;
    std::printf("  moe decode  T=1     %9.4f ms %7.0f GB/s routed weights\n", ms,
                bytes / (ms * 1e6));
  }
  for (int64_t t : {512, 4096, 32768}) {
    DeviceMoe m(t, kE, kK, kH, kI, kBf, 4);
    ops::moe_route(m.logits, true, m.ids, m.weights);
    const double ms = time_ms(s, [&] { ops::moe_experts(m.args); });
    std::printf("  moe prefill T=%-6lld %9.4f ms %7.1f TFLOP/s\n", (long long)t, ms,
                flops_per_token * double(t) / (ms * 1e9));
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace longctx::gpu_ops_test
