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
// counted. Each case runs the kernels and, for 16-bit operands with rows of whole 16-byte chunks,
// the cuBLASLt path (forced at any size), which also rounds the gate, up and down outputs: silu
// moves with a rounded gate by at most 2.2 u x silu(|gate|), so each term is within 5.2 u x (sum
// of |terms|) there. A CUDA graph of routing + experts replays to the eager bytes, also after the
// routing changes (nothing is read on the host), and under capture the automatic path keeps to
// the kernels. moe_forward (routing fused into the decode kernels) gives the bytes of
// moe_route + moe_experts and replays from a graph. LONGCTX_PERF=1 times one Qwen3-30B-A3B
// layer's experts on each prefill path, its expert GEMMs dense, per expert and grouped, and the
// MoE block's ops at decode batches, eager and as CUDA graphs.
#include "ops/moe.h"

#include <cublas_v2.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/device_pool.h"
#include "gpu_ops/gpu_ops_util.h"
#include "ops/linear.h"
#include "ops/moe_decode.h"
#include "ops/moe_schedule.h"
#include "ops/rms_norm.h"

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

const char* backend_name(ops::MoeBackend b) {
  switch (b) {
    case ops::MoeBackend::kKernels:
      return "kernels";
    case ops::MoeBackend::kCublasLt:
      return "cublaslt";
    default:
      return "auto";
  }
}

void check_backend(const MoeCase& c, ops::MoeBackend backend, TestStream& stream,
                   const ops::MoeArgs& h, const Tensor& abs_out);

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

  // Each CUDA backend that can run these operands: the kernels, and cuBLASLt for 16-bit ones
  // whose rows are 16-byte chunks.
  const bool bf16 = c.dtype == DType::kBF16, f16 = c.dtype == DType::kF16;
  const bool lt_ok = (bf16 || f16) && c.hidden % 8 == 0 && c.inter % 8 == 0;
  for (ops::MoeBackend backend : {ops::MoeBackend::kKernels, ops::MoeBackend::kCublasLt}) {
    if (backend != ops::MoeBackend::kKernels && !lt_ok) continue;
    SCOPED_TRACE(backend_name(backend));
    check_backend(c, backend, stream, h, ha.out);
  }
}

// The CUDA op with `backend` on the CPU twin's inputs h against its output h.out, within the
// tolerance of the header; abs_out: the op on the absolute values.
void check_backend(const MoeCase& c, ops::MoeBackend backend, TestStream& stream,
                   const ops::MoeArgs& h, const Tensor& abs_out) {
  ops::MoeArgs dv;
  dv.x = h.x.to(kGpu);
  dv.topk_ids = h.topk_ids.to(kGpu);
  dv.topk_weights = h.topk_weights.to(kGpu);
  dv.gate_up = h.gate_up.to(kGpu);
  dv.down = h.down.to(kGpu);
  if (c.shared) {
    dv.shared = h.shared.to(kGpu);
    dv.shared_gate = h.shared_gate.to(kGpu);
  }
  dv.out = Tensor::empty({c.tokens, c.hidden}, c.dtype, kGpu);
  LONGCTX_CUDA_CHECK(cudaMemsetAsync(dv.out.data_ptr(), 0xFF, dv.out.nbytes(), stream.get()));
  ops::moe_experts_cuda(dv, backend);
  stream.sync();  // count_non_finite runs on the legacy default stream
  EXPECT_EQ(count_non_finite(dv.out.data_ptr(), c.dtype, c.tokens, c.hidden, c.hidden), 0);
  Tensor got = dv.out.to(Device::cpu()).to_dtype(DType::kF32);
  const bool bf16 = c.dtype == DType::kBF16, f16 = c.dtype == DType::kF16;
  const bool cublas = backend != ops::MoeBackend::kKernels;
  const ops::MoePath path = cublas ? ops::MoePath::kCublasLt
                                   : ops::moe_path(c.tokens, c.hidden, c.inter, bf16 || f16, true);
  const double ulp = bf16 ? 1.0 / 128 : f16 ? 1.0 / 1024 : 0.0;
  const double u = bf16 ? 1.0 / 256 : 1.0 / 2048;  // unit roundoff
  // tensor cores: the activation's rounding; cuBLASLt: also gate's (silu moves it by at most
  // 2.2 u x silu(|gate|)), up's and each expert's output's
  const double act_u = path == ops::MoePath::kTensorCore ? u
                       : path == ops::MoePath::kCublasLt ? 5.2 * u
                                                         : 0.0;
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double ref = h.out.data<float>()[i], g = got.data<float>()[i];
    const double tol = (1e-5 + act_u) * (abs_out.data<float>()[i] + 1e-3) + ulp * std::fabs(ref);
    const double err = std::fabs(g - ref);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << " (token " << i / c.hidden << "): got " << g << ", cpu "
                    << ref << ", tol " << tol;
  }
  EXPECT_EQ(bad, 0);
  const char* path_name = cublas                              ? backend_name(backend)
                          : path == ops::MoePath::kDecode     ? "decode"
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
        MoeCase{1, 512, 10, 2048, 512, kBf, false, true},  // Qwen3-Next-80B-A3B, batch 1
        MoeCase{2, 1024, 10, 64, 32, kBf, false, false},   // the most experts in registers
        MoeCase{1, 1025, 4, 64, 32, kBf, false, false},    // routing from the logits per pick
        // tensor-core grouped GEMMs
        MoeCase{5, 8, 2, 72, 40, kBf, false, false},
        MoeCase{5, 128, 8, 200, 136, kBf, false, false},  // not multiples of the tiles
        MoeCase{17, 128, 8, 72, 40, kBf, true, false},    // skewed: most experts empty
        MoeCase{17, 128, 8, 2048, 768, kBf, false, false},
        MoeCase{8, 128, 8, 2048, 768, kBf, false, false},   // 30B-A3B batch 8: small tiles
        MoeCase{32, 128, 8, 2048, 768, kBf, false, false},  // 30B-A3B batch 32: small tiles
        MoeCase{32, 512, 10, 2048, 512, kBf, false, true},  // 80B-A3B batch 32: small tiles
        MoeCase{300, 128, 8, 2048, 768, kBf, false, false},
        MoeCase{300, 64, 6, 200, 136, kF16, false, true},
        MoeCase{300, 8, 1, 64, 32, kBf, true, false},
        MoeCase{1000, 128, 1, 64, 32, kBf, true, false},
        MoeCase{4096, 128, 8, 96, 48, kBf, false, false},
        MoeCase{4097, 16, 2, 256, 128, kBf, false, true},
        MoeCase{2048, 128, 8, 128, 64, kF16, false, true},  // cuBLASLt: the auto path's size
        MoeCase{16384, 128, 8, 64, 32, kBf, false, false},
        MoeCase{16384, 8, 2, 72, 40, kBf, true, false},
        // SIMT grouped GEMMs: f32 operands, hidden / inter not multiples of 8
        MoeCase{333, 60, 4, 130, 50, kF32, false, true},
        MoeCase{333, 60, 4, 130, 50, kBf, false, false},
        MoeCase{4096, 128, 8, 72, 40, kF32, false, false}));

// moe_forward_cuda (routing fused into the decode gate/up kernel up to 512 experts: ranks in
// shared memory to 256, one warp's register top-k above; route then experts elsewhere) against
// moe_route_cuda + moe_experts_cuda on the same logits: ids, weights and output bytes equal (the
// fused routing repeats the routing kernel's softmax and order; the unfused ops are checked against
// the CPU twins above), and against the CPU twin moe_forward_cpu within the tolerance of the header
// (its ids may differ only at near ties, which these random logits do not hit). Each output sits
// between guard rows of NaN bytes that must stay untouched.
class MoeGpuForward : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeGpuForward, EqualsRouteThenExperts) {
  const MoeCase c = GetParam();
  TestStream stream;
  const uint32_t seed = uint32_t(c.tokens * 977 + c.experts * 13 + c.k);
  const bool renormalize = c.k > 1 && c.tokens % 2 == 1;
  Tensor logits = random_host({c.tokens, c.experts}, DType::kF32, seed, -3, 3);
  if (c.skewed)
    for (int64_t t = 0; t < c.tokens; ++t) logits.data<float>()[t * c.experts] += 20.f;
  const float a1 = 2.f / std::sqrt(float(c.hidden)), a2 = 2.f / std::sqrt(float(c.inter));
  ops::MoeArgs h;
  h.x = random_host({c.tokens, c.hidden}, c.dtype, seed + 1, -1, 1);
  h.gate_up = random_host({c.experts, 2 * c.inter, c.hidden}, c.dtype, seed + 2, -a1, a1);
  h.down = random_host({c.experts, c.hidden, c.inter}, c.dtype, seed + 3, -a2, a2);
  if (c.shared) {
    h.shared = random_host({c.tokens, c.hidden}, c.dtype, seed + 4, -1, 1);
    h.shared_gate = random_host({c.tokens, 1}, DType::kF32, seed + 5, -2, 2);
  }
  h.topk_ids = Tensor::empty({c.tokens, c.k}, DType::kI32);
  h.topk_weights = Tensor::empty({c.tokens, c.k}, DType::kF32);
  h.out = Tensor::empty({c.tokens, c.hidden}, DType::kF32);
  ops::moe_forward_cpu(logits, renormalize, h);

  ops::MoeArgs dv;
  dv.x = h.x.to(kGpu);
  dv.gate_up = h.gate_up.to(kGpu);
  dv.down = h.down.to(kGpu);
  if (c.shared) {
    dv.shared = h.shared.to(kGpu);
    dv.shared_gate = h.shared_gate.to(kGpu);
  }
  const Tensor d_logits = logits.to(kGpu);
  // Outputs as rows 1..T of [T + 2, n] buffers of NaN bytes: rows 0 and T + 1 are guards.
  auto guarded = [&](int64_t n, DType dtype, Tensor& whole) {
    whole = Tensor::empty({c.tokens + 2, n}, dtype, kGpu);
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(whole.data_ptr(), 0xFF, whole.nbytes(), stream.get()));
    return whole.slice(0, 1, c.tokens + 1);
  };
  auto host_bytes = [&](const Tensor& t) {
    stream.sync();
    Tensor hb = t.contiguous().to(Device::cpu());
    const auto* p = static_cast<const uint8_t*>(hb.data_ptr());
    return std::vector<uint8_t>(p, p + hb.nbytes());
  };
  Tensor ids_all[2], w_all[2], out_all[2];
  for (int fused = 0; fused < 2; ++fused) {
    ops::MoeArgs a = dv;
    a.topk_ids = guarded(c.k, DType::kI32, ids_all[fused]);
    a.topk_weights = guarded(c.k, DType::kF32, w_all[fused]);
    a.out = guarded(c.hidden, c.dtype, out_all[fused]);
    if (fused) {
      ops::moe_forward_cuda(d_logits, renormalize, a);
    } else {
      ops::moe_route_cuda(d_logits, renormalize, a.topk_ids, a.topk_weights);
      ops::moe_experts_cuda(a);
    }
  }
  stream.sync();
  EXPECT_TRUE(host_bytes(ids_all[1]) == host_bytes(ids_all[0])) << "ids";
  EXPECT_TRUE(host_bytes(w_all[1]) == host_bytes(w_all[0])) << "weights";
  EXPECT_TRUE(host_bytes(out_all[1]) == host_bytes(out_all[0])) << "output";
  // guards: the whole buffers' first and last rows still NaN bytes
  for (const Tensor* t : {&ids_all[1], &w_all[1], &out_all[1]}) {
    const std::vector<uint8_t> b = host_bytes(*t);
    const size_t row = b.size() / size_t(c.tokens + 2);
    for (size_t i = 0; i < row; ++i)
      ASSERT_TRUE(b[i] == 0xFF && b[b.size() - 1 - i] == 0xFF) << "guard byte " << i;
  }
  Tensor out = out_all[1].slice(0, 1, c.tokens + 1);
  EXPECT_EQ(count_non_finite(out.data_ptr(), c.dtype, c.tokens, c.hidden, c.hidden), 0);
  Tensor ids = ids_all[1].slice(0, 1, c.tokens + 1).contiguous().to(Device::cpu());
  Tensor w = w_all[1].slice(0, 1, c.tokens + 1).contiguous().to(Device::cpu());
  for (int64_t i = 0; i < c.tokens * c.k; ++i) {
    ASSERT_EQ(ids.data<int32_t>()[i], h.topk_ids.data<int32_t>()[i]) << "slot " << i;
    const float tol =
        4.8e-7f * float((c.experts + 31) / 32) * std::max(1.f, h.topk_weights.data<float>()[i]);
    ASSERT_NEAR(w.data<float>()[i], h.topk_weights.data<float>()[i], tol) << "slot " << i;
  }
  // against the CPU output: the decode path's tolerance (fp32 activation) or the kernels' paths'
  ops::MoeArgs ha = h;
  auto abs_of = [](const Tensor& t) {
    Tensor f = t.to_dtype(DType::kF32).contiguous();
    Tensor a = Tensor::empty(f.shape(), DType::kF32);
    for (int64_t i = 0; i < f.numel(); ++i) a.data<float>()[i] = std::fabs(f.data<float>()[i]);
    return a;
  };
  ha.x = abs_of(h.x);
  ha.gate_up = abs_of(h.gate_up);
  ha.down = abs_of(h.down);
  if (c.shared) ha.shared = abs_of(h.shared);
  ha.out = Tensor::empty({c.tokens, c.hidden}, DType::kF32);
  ops::moe_experts_cpu(ha);
  const bool bf16 = c.dtype == DType::kBF16, f16 = c.dtype == DType::kF16;
  const ops::MoePath path = ops::moe_path(c.tokens, c.hidden, c.inter, bf16 || f16, true);
  const double ulp = bf16 ? 1.0 / 128 : f16 ? 1.0 / 1024 : 0.0;
  const double act_u = path == ops::MoePath::kTensorCore ? (bf16 ? 1.0 / 256 : 1.0 / 2048) : 0.0;
  Tensor got = out.contiguous().to(Device::cpu()).to_dtype(DType::kF32);
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double ref = h.out.data<float>()[i], g = got.data<float>()[i];
    const double tol = (1e-5 + act_u) * (ha.out.data<float>()[i] + 1e-3) + ulp * std::fabs(ref);
    if (!(std::fabs(g - ref) <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": got " << g << ", cpu " << ref << ", tol " << tol;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeGpuForward,
    ::testing::Values(MoeCase{1, 8, 1, 72, 40, kBf, false, false},
                      MoeCase{1, 128, 8, 2048, 768, kBf, false, false},  // Qwen3-30B-A3B
                      MoeCase{2, 16, 2, 70, 36, kBf, false, true},       // scalar loads
                      MoeCase{3, 256, 8, 136, 56, kF16, false, false},   // the most fused experts
                      MoeCase{4, 300, 6, 64, 32, kBf, false, false},     // one warp routes
                      MoeCase{2, 600, 6, 64, 32, kBf, false, false},     // routing kernel first
                      MoeCase{4, 128, 8, 200, 72, kF32, false, true},
                      MoeCase{1, 60, 5, 130, 50, kF32, true, false},
                      MoeCase{3, 32, 32, 64, 40, kBf, false, false},     // k > kMoeCombineWarps
                      MoeCase{1, 512, 10, 2048, 512, kBf, false, true},  // Qwen3-Next-80B-A3B
                      MoeCase{3, 512, 10, 72, 40, kF16, true, false},    // skewed, one warp routes
                      MoeCase{2, 64, 3, 48, 24, kF16, true, true},
                      MoeCase{5, 128, 8, 256, 96, kBf, false, false},  // prefill paths
                      MoeCase{64, 60, 4, 130, 50, kBf, false, true}));

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
  void run(bool renormalize = true, ops::MoeBackend backend = ops::MoeBackend::kAuto) {
    ops::moe_route(logits, renormalize, ids, weights);
    ops::moe_experts_cuda(args, backend);
  }
  void forward(bool renormalize = true) { ops::moe_forward(logits, renormalize, args); }
};

// moe_route's two kernels (probabilities in registers, recomputed per pick) give the same ids and
// weights to the bit, over every register count, renormalized or not, with skewed and tied logits
// (whole rows equal: every pick a tie broken by the lower index).
TEST(MoeGpuRoute, RegistersEqualPerPick) {
  TestStream stream;
  struct RouteCase {
    int64_t tokens, experts, k;
  };
  for (const RouteCase c :
       {RouteCase{1, 512, 10}, RouteCase{33, 512, 10}, RouteCase{5, 128, 8}, RouteCase{7, 60, 4},
        RouteCase{3, 256, 256}, RouteCase{9, 1000, 40}, RouteCase{2, 1024, 1}, RouteCase{4, 8, 8}})
    for (int variant = 0; variant < 3; ++variant) {
      Tensor l = random_host({c.tokens, c.experts}, kF32, uint32_t(c.experts + variant), -3, 3);
      for (int64_t t = 0; t < c.tokens; ++t)
        for (int64_t e = 0; e < c.experts; ++e) {
          float& v = l.data<float>()[t * c.experts + e];
          if (variant == 1 && e % 7 == 3) v += 15.f;  // skewed: a few experts take the mass
          if (variant == 2) v = float(e % 3);         // ties everywhere
        }
      const Tensor d_l = l.to(kGpu);
      const bool renormalize = variant != 1;
      auto route = [&](ops::MoeRouteKernel kernel) {
        Tensor ids = Tensor::empty({c.tokens, c.k}, DType::kI32, kGpu);
        Tensor w = Tensor::empty({c.tokens, c.k}, kF32, kGpu);
        ops::moe_route_cuda(d_l, renormalize, ids, w, kernel);
        stream.sync();
        const Tensor hi = ids.to(Device::cpu()), hw = w.to(Device::cpu());
        std::vector<uint8_t> bytes(hi.nbytes() + hw.nbytes());
        std::memcpy(bytes.data(), hi.data_ptr(), hi.nbytes());
        std::memcpy(bytes.data() + hi.nbytes(), hw.data_ptr(), hw.nbytes());
        return bytes;
      };
      EXPECT_TRUE(route(ops::MoeRouteKernel::kRegisters) == route(ops::MoeRouteKernel::kPerPick))
          << "T " << c.tokens << " E " << c.experts << " k " << c.k << " variant " << variant;
    }
  Tensor l = Tensor::empty({1, 1025}, kF32, kGpu);
  Tensor ids = Tensor::empty({1, 2}, DType::kI32, kGpu), w = Tensor::empty({1, 2}, kF32, kGpu);
  EXPECT_THROW(ops::moe_route_cuda(l, true, ids, w, ops::MoeRouteKernel::kRegisters), Error);
}

// The tensor-core path's two row tiles give the same bytes: each output element is the same
// m16n8k16 chain over K whichever tile its row sits in, and the padding rows are never written.
// Over routings the planner gives either tile (batch decode, a prefill chunk), skewed ones and an
// expert taking more rows than a small tile (several small tiles of one expert).
struct TileCase {
  int64_t tokens, experts, k, hidden, inter;
  DType dtype;
  bool skewed;
};
class MoeGpuTile : public ::testing::TestWithParam<TileCase> {};
TEST_P(MoeGpuTile, SmallEqualsLarge) {
  const TileCase c = GetParam();
  TestStream stream;
  DeviceMoe m(c.tokens, c.experts, c.k, c.hidden, c.inter, c.dtype, 71);
  if (c.skewed) {
    Tensor l = random_host({c.tokens, c.experts}, kF32, 72, -3, 3);
    for (int64_t t = 0; t < c.tokens; ++t) l.data<float>()[t * c.experts] += 20.f;
    m.logits = l.to(kGpu);
  }
  ops::moe_route(m.logits, true, m.ids, m.weights);
  auto out_bytes = [&](ops::MoeTcTile tile) {
    LONGCTX_CUDA_CHECK(
        cudaMemsetAsync(m.args.out.data_ptr(), 0xFF, m.args.out.nbytes(), stream.get()));
    ops::moe_experts_cuda(m.args, ops::MoeBackend::kKernels, tile);
    stream.sync();
    Tensor h = m.args.out.to(Device::cpu());
    const auto* p = static_cast<const uint8_t*>(h.data_ptr());
    return std::vector<uint8_t>(p, p + h.nbytes());
  };
  ASSERT_EQ(ops::moe_path(c.tokens, c.hidden, c.inter, true, true), ops::MoePath::kTensorCore);
  const std::vector<uint8_t> large = out_bytes(ops::MoeTcTile::kLarge);
  const std::vector<uint8_t> small = out_bytes(ops::MoeTcTile::kSmall);
  const std::vector<uint8_t> planned = out_bytes(ops::MoeTcTile::kPlanned);
  EXPECT_TRUE(small == large) << "the 32-row tiles differ from the 128-row tiles";
  EXPECT_TRUE(planned == large);
  const Tensor f = m.args.out.to(Device::cpu()).to_dtype(kF32);
  int64_t bad = 0;
  for (int64_t i = 0; i < f.numel(); ++i) bad += std::isfinite(f.data<float>()[i]) ? 0 : 1;
  EXPECT_EQ(bad, 0) << "unwritten or non-finite outputs";
}
INSTANTIATE_TEST_SUITE_P(Shapes, MoeGpuTile,
                         ::testing::Values(TileCase{32, 512, 10, 2048, 512, kBf, false},
                                           TileCase{8, 128, 8, 2048, 768, kBf, false},
                                           TileCase{32, 128, 8, 2048, 768, kF16, false},
                                           TileCase{300, 128, 8, 256, 136, kBf, false},
                                           TileCase{300, 16, 2, 200, 72, kBf, true},
                                           TileCase{4096, 128, 8, 96, 48, kBf, false}));

struct GraphCase {
  int64_t tokens, experts, k, hidden, inter;
  DType dtype;
  bool forward = false;  // moe_forward (routing fused at decode) instead of route + experts
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
  auto run = [&] { c.forward ? m.forward() : m.run(); };
  run();
  const std::vector<uint8_t> want1 = out_bytes();

  detail::DevicePool& pool = detail::device_pool(kGpu.index);
  const uint64_t id = pool.create_private_pool();
  cudaGraph_t graph = nullptr;
  pool.begin_private(id);
  try {
    run();  // warm-up: the private pool's segments
    stream.sync();
    LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    run();
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
  run();
  EXPECT_TRUE(out_bytes() == got2) << "replay with new logits against eager";
  pool.release_private_pool(id);
}

INSTANTIATE_TEST_SUITE_P(Paths, MoeGpuGraph,
                         ::testing::Values(GraphCase{1, 128, 8, 2048, 768, kBf},   // decode
                                           GraphCase{4, 64, 4, 200, 136, kF16},    // decode
                                           GraphCase{300, 128, 8, 256, 136, kBf},  // tensor cores
                                           GraphCase{300, 16, 2, 130, 50, kF32},   // SIMT
                                           // moe_forward: routing fused at decode
                                           GraphCase{1, 128, 8, 2048, 768, kBf, true},
                                           GraphCase{4, 64, 4, 200, 136, kF16, true},
                                           GraphCase{1, 512, 10, 2048, 512, kBf, true},
                                           GraphCase{300, 16, 2, 130, 50, kBf, true}));

// Where the automatic path is cuBLASLt eagerly, a capture takes the grouped kernels instead (the
// cuBLASLt path syncs on the expert counts): the graph replays to the kernels' eager bytes, and a
// forced cuBLASLt path under capture is refused before it enqueues anything.
TEST(MoeGpuGraphAuto, CaptureTakesTheKernels) {
  constexpr int64_t kT = 2048, kE = 8, kK = 4, kH = 128, kI = 64;
  ASSERT_EQ(ops::moe_auto_path(kT, kK, kE, kH, kI, true, true, false), ops::MoePath::kCublasLt);
  TestStream stream;
  DeviceMoe m(kT, kE, kK, kH, kI, kBf, 93);
  auto out_bytes = [&] {
    stream.sync();
    Tensor h = m.args.out.to(Device::cpu());
    const auto* p = static_cast<const uint8_t*>(h.data_ptr());
    return std::vector<uint8_t>(p, p + h.nbytes());
  };
  m.run(true, ops::MoeBackend::kCublasLt);
  const std::vector<uint8_t> lt = out_bytes();
  m.run(true, ops::MoeBackend::kKernels);
  const std::vector<uint8_t> kernels = out_bytes();
  ASSERT_TRUE(lt != kernels) << "the two paths round differently; equal bytes would hide which ran";

  detail::DevicePool& pool = detail::device_pool(kGpu.index);
  const uint64_t id = pool.create_private_pool();
  cudaGraph_t graph = nullptr;
  pool.begin_private(id);
  bool refused = false;
  try {
    m.run(true, ops::MoeBackend::kKernels);  // warm-up: the segments the capture will take
    stream.sync();
    LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    try {
      ops::moe_experts_cuda(m.args, ops::MoeBackend::kCublasLt);
    } catch (const Error& e) {
      refused = e.code() == ErrorCode::kUnsupported &&
                std::string(e.what()).find("capturing") != std::string::npos;
    }
    m.run();
    LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  } catch (...) {
    pool.end_private();
    throw;
  }
  pool.end_private();
  EXPECT_TRUE(refused) << "a forced cuBLASLt path ran under capture";
  cudaGraphExec_t exec = nullptr;
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LONGCTX_CUDA_CHECK(
      cudaMemsetAsync(m.args.out.data_ptr(), 0xFF, m.args.out.nbytes(), stream.get()));
  LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
  EXPECT_TRUE(out_bytes() == kernels) << "the captured auto path is not the kernels' path";
  LONGCTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LONGCTX_CUDA_CHECK(cudaGraphDestroy(graph));
  pool.release_private_pool(id);
}

TEST(MoeGpuErrors, CublasLtRefusesF32) {
  TestStream stream;
  DeviceMoe m(64, 8, 2, 64, 32, kF32, 6);
  try {
    m.run(true, ops::MoeBackend::kCublasLt);
    stream.sync();
    ADD_FAILURE() << "f32 operands accepted by the cuBLASLt path";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("16-bit"), std::string::npos) << e.what();
  }
}

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
  // Prefill on each path, and what the automatic choice takes.
  for (int64_t t : {512, 4096, 8192, 16384, 32768}) {
    DeviceMoe m(t, kE, kK, kH, kI, kBf, 4);
    ops::moe_route(m.logits, true, m.ids, m.weights);
    const ops::MoePath auto_path = ops::moe_auto_path(t, kK, kE, kH, kI, true, true, false);
    for (ops::MoeBackend b : {ops::MoeBackend::kKernels, ops::MoeBackend::kCublasLt}) {
      const double ms = time_ms(s, [&] { ops::moe_experts_cuda(m.args, b); });
      const bool is_auto = b == (auto_path == ops::MoePath::kCublasLt ? ops::MoeBackend::kCublasLt
                                                                      : ops::MoeBackend::kKernels);
      std::printf("  moe prefill T=%-6lld %-9s %9.4f ms %7.1f TFLOP/s%s\n", (long long)t,
                  backend_name(b), ms, flops_per_token * double(t) / (ms * 1e9),
                  is_auto ? "  (auto)" : "");
    }
  }
  std::fflush(stdout);
}

// ms per call of op(i), i = 0 .. calls - 1, captured once as one CUDA graph and replayed: what a
// decode graph pays for these launches, gaps between kernels and PDL overlap included. The
// capture's buffers come from a private pool, as the engine's decode graphs' do.
double graph_ms_per_call(const TestStream& s, const std::function<void(int)>& op, int calls) {
  detail::DevicePool& pool = detail::device_pool(kGpu.index);
  const uint64_t id = pool.create_private_pool();
  cudaGraph_t graph = nullptr;
  pool.begin_private(id);
  try {
    for (int i = 0; i < calls; ++i) op(i);  // warm-up: the private pool's segments
    s.sync();
    LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) op(i);
    LONGCTX_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  } catch (...) {
    pool.end_private();
    throw;
  }
  pool.end_private();
  cudaGraphExec_t exec = nullptr;
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_ms(s, [&] { LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, s.get())); });
  LONGCTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LONGCTX_CUDA_CHECK(cudaGraphDestroy(graph));
  s.sync();
  pool.release_private_pool(id);
  return ms / calls;
}

// Qwen3-30B-A3B's MoE block at decode batches (T = 1, 8, 32): each op alone (router GEMV, routing,
// the routed experts) and the whole block unfused (router, moe_route, moe_experts) and fused
// (router, moe_forward), eagerly and as a graph of 48 calls (the model's layers). The calls cycle
// over kLayers layers' own weights (1.2 GB of experts each), so a call's expert rows are not in
// L2 from the call before. ms per call; x48 is the block's share of a decode step.
// The MoE block's ops at decode batches, one model's shapes (bf16, hidden 2048), 4 layers' weights
// cycled so that L2 holds little of them; with the shared expert's output added by the combine
// where the model has one.
struct DecodeBlockModel {
  const char* name;
  int64_t experts, top_k, inter;
  bool shared;
};
void moe_decode_block_rows(const DecodeBlockModel& model) {
  TestStream s;
  const int64_t kE = model.experts, kK = model.top_k, kI = model.inter;
  constexpr int64_t kH = 2048, kLayers = 4;
  constexpr int kModelLayers = 48;
  std::printf("  %s: %lld experts, top-%lld, inter %lld%s\n", model.name, (long long)kE,
              (long long)kK, (long long)kI, model.shared ? ", shared expert" : "");
  struct Layer {
    Tensor router, gate_up, down;  // [E, H], [E, 2 I, H], [E, H, I]
  };
  std::vector<Layer> layers(kLayers);
  const float a0 = 1.f / std::sqrt(float(kH)), a1 = 2.f / std::sqrt(float(kH)),
              a2 = 2.f / std::sqrt(float(kI));
  for (int64_t l = 0; l < kLayers; ++l) {
    Layer& w = layers[l];
    w.router = Tensor::empty({kE, kH}, kBf, kGpu);
    w.gate_up = Tensor::empty({kE, 2 * kI, kH}, kBf, kGpu);
    w.down = Tensor::empty({kE, kH, kI}, kBf, kGpu);
    fill_uniform(w.router.data_ptr(), w.router.numel(), kBf, uint32_t(20 + 3 * l), -a0, a0);
    fill_uniform(w.gate_up.data_ptr(), w.gate_up.numel(), kBf, uint32_t(21 + 3 * l), -a1, a1);
    fill_uniform(w.down.data_ptr(), w.down.numel(), kBf, uint32_t(22 + 3 * l), -a2, a2);
  }
  const double routed_bytes = 3.0 * kH * kI * kK * 2;  // one token's routed expert rows
  for (int64_t t : {1, 8, 32}) {
    const Tensor x = random_host({t, kH}, kBf, 7, -1, 1).to(kGpu);
    const Tensor logits = Tensor::empty({t, kE}, kF32, kGpu);
    ops::MoeArgs a;
    a.x = x;
    a.topk_ids = Tensor::empty({t, kK}, DType::kI32, kGpu);
    a.topk_weights = Tensor::empty({t, kK}, kF32, kGpu);
    a.out = Tensor::empty({t, kH}, kBf, kGpu);
    if (model.shared) {
      a.shared = random_host({t, kH}, kBf, 9, -1, 1).to(kGpu);
      a.shared_gate = random_host({t, 1}, kF32, 10, -2, 2).to(kGpu);
    }
    auto layer_args = [&](int i) {
      ops::MoeArgs b = a;
      b.gate_up = layers[i % kLayers].gate_up;
      b.down = layers[i % kLayers].down;
      return b;
    };
    auto router = [&](int i) { ops::linear(x, layers[i % kLayers].router, Tensor(), logits); };
    auto route = [&](int) { ops::moe_route(logits, true, a.topk_ids, a.topk_weights); };
    auto experts = [&](int i) { ops::moe_experts(layer_args(i)); };
    auto experts_tile = [&](ops::MoeTcTile tile) {
      return [&, tile](int i) {
        ops::moe_experts_cuda(layer_args(i), ops::MoeBackend::kKernels, tile);
      };
    };
    router(0);
    route(0);  // a real routing for the experts-alone rows
    struct Row {
      const char* name;
      std::function<void(int)> op;
    };
    const Tensor norm_w = random_host({kH}, kBf, 8, 0.5f, 1.5f).to(kGpu);
    const Tensor normed = Tensor::empty({t, kH}, kBf, kGpu);
    const Row rows[] = {
        // one row-wise kernel on [T, hidden]: what any launch costs in the graph
        {"rms_norm (tiny kernel)", [&](int) { ops::rms_norm(x, norm_w, 1e-6f, normed); }},
        {"router GEMV", router},
        {"moe_route", route},
        // the routing kernel that recomputes the probabilities on every pick (the only one
        // before the register top-k; above kMoeRouteRegMaxExperts experts still)
        {"moe_route per pick",
         [&](int) {
           ops::moe_route_cuda(logits, true, a.topk_ids, a.topk_weights,
                               ops::MoeRouteKernel::kPerPick);
         }},
        {"moe_experts", experts},
        {"block: route+experts",
         [&](int i) {
           router(i);
           route(i);
           experts(i);
         }},
        {"block: moe_forward",
         [&](int i) {
           router(i);
           ops::moe_forward(logits, true, layer_args(i));
         }},
        // the same with the down kernel's early L2 prefetch (ops/moe_decode.h; off by default)
        {"block: L2 prefetch",
         [&](int i) {
           ops::set_moe_decode_prefetch(true);
           router(i);
           ops::moe_forward(logits, true, layer_args(i));
           ops::set_moe_decode_prefetch(false);
         }},
        // the grouped GEMMs' row tiles forced (T > kMoeDecodeMaxTokens: moe_tc_rows picks)
        {"experts: 128-row tile", experts_tile(ops::MoeTcTile::kLarge)},
        {"experts: 32-row tile", experts_tile(ops::MoeTcTile::kSmall)},
    };
    for (const Row& r : rows) {
      if (t <= ops::kMoeDecodeMaxTokens && std::string(r.name).rfind("experts:", 0) == 0) continue;
      int call = 0;
      const double eager = time_ms(s, [&] { r.op(call++); });
      const double graph = graph_ms_per_call(s, r.op, kModelLayers);
      // at T = 1 the experts and the blocks read one token's routed rows (+ the router's)
      const std::string name = r.name;
      const double bytes = name == "moe_experts"         ? routed_bytes
                           : name.rfind("block", 0) == 0 ? routed_bytes + kE * kH * 2
                                                         : 0.0;
      const std::string gbs =
          t == 1 && bytes > 0 ? fmt::format("  {:.0f} GB/s", bytes / (graph * 1e6)) : "";
      std::printf("  moe decode T=%-3lld %-22s eager %8.4f ms  graph %8.4f ms  (x48 %6.3f ms)%s\n",
                  (long long)t, r.name, eager, graph, graph * kModelLayers, gbs.c_str());
    }
    std::fflush(stdout);
  }
}

TEST(GpuOpsPerf, MoeDecodeBlock) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  moe_decode_block_rows({"Qwen3-30B-A3B", 128, 8, 768, false});
}

// Qwen3-Next-80B-A3B's block: 512 experts over the fused routing's limit, so moe_forward routes
// with moe_route's kernel first; top-10 (10 down warps); inter 512; a shared expert.
TEST(GpuOpsPerf, MoeDecodeBlockQwen3Next80B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  moe_decode_block_rows({"Qwen3-Next-80B-A3B", 512, 10, 512, true});
}

// The expert GEMMs of Qwen3-30B-A3B's layer with `rows` rows per expert (256: a 4K prefill, 2048:
// 32K), gate/up and down (bf16 out, as the cuBLASLt path runs them), three ways: one dense cuBLASLt
// GEMM over all the rows (the ceiling), linear_cuda per expert (the cuBLASLt path's loop; also its
// host time per call), and one cublasGemmGroupedBatchedEx call over the experts as groups (measured
// slower than the loop on an H100 at both sizes, so the op does not use it).
TEST(GpuOpsPerf, MoeExpertGemms) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  constexpr int64_t kE = 128, kH = 2048, kI = 768;
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(handle, s.get()), CUBLAS_STATUS_SUCCESS);
  Tensor workspace = Tensor::empty({int64_t(32) << 20}, DType::kU8, kGpu);
  ASSERT_EQ(cublasSetWorkspace(handle, workspace.data_ptr(), workspace.nbytes()),
            CUBLAS_STATUS_SUCCESS);
  Tensor w1 = Tensor::empty({kE, 2 * kI, kH}, kBf, kGpu),
         w2 = Tensor::empty({kE, kH, kI}, kBf, kGpu);
  fill_uniform(w1.data_ptr(), w1.numel(), kBf, 8, -0.05f, 0.05f);
  fill_uniform(w2.data_ptr(), w2.numel(), kBf, 9, -0.05f, 0.05f);
  for (int64_t rows : {256, 2048}) {
    const int64_t total = rows * kE;
    Tensor x = Tensor::empty({total, kH}, kBf, kGpu), h = Tensor::empty({total, 2 * kI}, kBf, kGpu);
    Tensor act = Tensor::empty({total, kI}, kBf, kGpu), y = Tensor::empty({total, kH}, kBf, kGpu);
    fill_uniform(x.data_ptr(), x.numel(), kBf, 10, -1.f, 1.f);
    fill_uniform(act.data_ptr(), act.numel(), kBf, 11, -1.f, 1.f);
    struct Gemm {
      const char* name;
      const Tensor *in, *w, *out;
      int64_t k, n;  // reduction, output columns
    };
    for (const Gemm& g :
         {Gemm{"gate/up", &x, &w1, &h, kH, 2 * kI}, Gemm{"down", &act, &w2, &y, kI, kH}}) {
      const double flops = 2.0 * double(total) * g.k * g.n;
      const double dense = time_ms(s, [&] {
        ops::linear_cuda(*g.in, g.w->select(0, 0), Tensor(), *g.out, ops::LinearBackend::kCublasLt);
      });
      auto loop = [&] {
        for (int64_t e = 0; e < kE; ++e)
          ops::linear_cuda(g.in->slice(0, e * rows, (e + 1) * rows), g.w->select(0, e), Tensor(),
                           g.out->slice(0, e * rows, (e + 1) * rows),
                           ops::LinearBackend::kCublasLt);
      };
      const double per_expert = time_ms(s, loop);
      s.sync();
      const auto t0 = std::chrono::steady_clock::now();
      loop();
      const double host_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          kE;
      s.sync();
      // cuBLAS grouped: column-major D [n, rows] = W^T (k x n, read as A [k, n] with op T) x
      // in^T ([k, rows]), as linear_cuda lays it out; pointer arrays on the device.
      const cudaDataType_t out_type = g.out->dtype() == kF32 ? CUDA_R_32F : CUDA_R_16BF;
      const size_t out_size = g.out->dtype() == kF32 ? 4 : 2;
      std::vector<const void*> a_ptrs(kE), b_ptrs(kE);
      std::vector<void*> c_ptrs(kE);
      for (int64_t e = 0; e < kE; ++e) {
        a_ptrs[e] = static_cast<const char*>(g.w->data_ptr()) + e * g.n * g.k * 2;
        b_ptrs[e] = static_cast<const char*>(g.in->data_ptr()) + e * rows * g.k * 2;
        c_ptrs[e] = static_cast<char*>(g.out->data_ptr()) + e * rows * g.n * out_size;
      }
      Tensor ptrs = Tensor::empty({3 * kE}, DType::kI64, kGpu);
      std::vector<const void*> all(a_ptrs);
      all.insert(all.end(), b_ptrs.begin(), b_ptrs.end());
      all.insert(all.end(), c_ptrs.begin(), c_ptrs.end());
      LONGCTX_CUDA_CHECK(cudaMemcpy(ptrs.data_ptr(), all.data(), all.size() * sizeof(void*),
                                    cudaMemcpyHostToDevice));
      const auto* d_ptrs = static_cast<const void* const*>(ptrs.data_ptr());
      std::vector<cublasOperation_t> ta(kE, CUBLAS_OP_T), tb(kE, CUBLAS_OP_N);
      std::vector<int> m(kE, int(g.n)), n(kE, int(rows)), k(kE, int(g.k)), lda(kE, int(g.k)),
          ldb(kE, int(g.k)), ldc(kE, int(g.n)), sizes(kE, 1);
      std::vector<float> alpha(kE, 1.f), beta(kE, 0.f);
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      const double grouped = time_ms(s, [&] {
        st = cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                        alpha.data(), d_ptrs, CUDA_R_16BF, lda.data(), d_ptrs + kE,
                                        CUDA_R_16BF, ldb.data(), beta.data(),
                                        const_cast<void* const*>(d_ptrs + 2 * kE), out_type,
                                        ldc.data(), int(kE), sizes.data(), CUBLAS_COMPUTE_32F);
      });
      std::printf(
          "  experts %lld x %lld rows %-7s dense %8.4f ms %6.1f TFLOP/s | per expert %8.4f "
          "ms %6.1f TFLOP/s (host %.1f us/GEMM) | grouped %8.4f ms %6.1f TFLOP/s%s\n",
          (long long)kE, (long long)rows, g.name, dense, flops / (dense * 1e9), per_expert,
          flops / (per_expert * 1e9), host_us, grouped, flops / (grouped * 1e9),
          st == CUBLAS_STATUS_SUCCESS ? "" : " (cublas error)");
      std::fflush(stdout);
    }
  }
  cublasDestroy(handle);
}

// FP8 block experts do not run on CUDA yet: both entries refuse them by name with
// Error(kUnsupported), and the capability query says so (models dequantize them at load there).
TEST(MoeGpuFp8, ExpertsAreRefusedUntilTheKernelsExist) {
  const int64_t t = 2, h = 128, n = 128, e = 4, k = 2;
  EXPECT_FALSE(ops::moe_runs_fp8_experts(kGpu));
  ops::MoeArgs a;
  a.x = Tensor::zeros({t, h}, DType::kBF16).to(kGpu);
  a.topk_ids = Tensor::zeros({t, k}, DType::kI32).to(kGpu);
  a.topk_weights = Tensor::zeros({t, k}, DType::kF32).to(kGpu);
  a.gate_up = Tensor::zeros({e, 2 * n, h}, DType::kFP8E4M3).to(kGpu);
  a.down = Tensor::zeros({e, h, n}, DType::kFP8E4M3).to(kGpu);
  a.gate_up_scales = Tensor::zeros({e, 2, 1}, DType::kF32).to(kGpu);
  a.down_scales = Tensor::zeros({e, 1, 1}, DType::kF32).to(kGpu);
  a.block_out = a.block_in = 128;
  a.out = Tensor::empty({t, h}, DType::kBF16, kGpu);
  const Tensor logits = Tensor::zeros({t, e}, DType::kF32).to(kGpu);
  for (int forward = 0; forward < 2; ++forward) {
    try {
      if (forward)
        ops::moe_forward(logits, true, a);
      else
        ops::moe_experts(a);
      ADD_FAILURE() << "FP8 experts ran on CUDA";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kUnsupported) << err.what();
      EXPECT_NE(std::string(err.what()).find("FP8 block experts"), std::string::npos) << err.what();
    }
  }
}

}  // namespace
}  // namespace longctx::gpu_ops_test
