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

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device_pool.h"
#include "gpu_ops/gpu_ops_util.h"
#include "gpu_ops/moe_test_util.h"
#include "ops/moe_schedule.h"

namespace longctx::gpu_ops_test {
namespace {

struct MoeCase {
  int64_t tokens, experts, k, hidden, inter;
  DType dtype;  // x, weights, out
  bool skewed;  // logits favour experts 0 and 1: the rest are (nearly) empty
  bool shared;
};

class MoeGpu : public ::testing::TestWithParam<MoeCase> {};

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
  Tensor gate_up = random_weights({c.experts, 2 * c.inter, c.hidden}, c.dtype, seed + 2, -a1, a1);
  Tensor down = random_weights({c.experts, c.hidden, c.inter}, c.dtype, seed + 3, -a2, a2);
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

// moe_forward_cuda against moe_route_cuda + moe_experts_cuda on the same logits: ids, weights and
// output bytes equal (the two ops are checked against the CPU twins above), and against the CPU
// twin moe_forward_cpu within the tolerance of the header (its ids may differ only at near ties,
// which these random logits do not hit). Each output sits between guard rows of NaN bytes that
// must stay untouched.
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
  h.gate_up = random_weights({c.experts, 2 * c.inter, c.hidden}, c.dtype, seed + 2, -a1, a1);
  h.down = random_weights({c.experts, c.hidden, c.inter}, c.dtype, seed + 3, -a2, a2);
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
                      MoeCase{3, 256, 8, 136, 56, kF16, false, false},
                      MoeCase{4, 300, 6, 64, 32, kBf, false, false},  // E not a power of two
                      MoeCase{2, 600, 6, 64, 32, kBf, false, false},  // routing kernel first
                      MoeCase{4, 128, 8, 200, 72, kF32, false, true},
                      MoeCase{1, 60, 5, 130, 50, kF32, true, false},
                      MoeCase{3, 32, 32, 64, 40, kBf, false, false},     // k > kMoeCombineWarps
                      MoeCase{1, 512, 10, 2048, 512, kBf, false, true},  // Qwen3-Next-80B-A3B
                      MoeCase{3, 512, 10, 72, 40, kF16, true,
                              false},  // skewed, the most fused experts
                      MoeCase{2, 64, 3, 48, 24, kF16, true, true},
                      MoeCase{5, 128, 8, 256, 96, kBf, false, false},  // prefill paths
                      MoeCase{64, 60, 4, 130, 50, kBf, false, true}));

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

  const PrivatePoolGraph graph(stream, run);
  auto replay = [&] {
    LONGCTX_CUDA_CHECK(
        cudaMemsetAsync(m.args.out.data_ptr(), 0xFF, m.args.out.nbytes(), stream.get()));
    graph.launch(stream);
    return out_bytes();
  };
  EXPECT_TRUE(replay() == want1) << "replay, same logits";
  m.logits.copy_from_async(logits2, stream.get());  // ordered before the replay
  const std::vector<uint8_t> got2 = replay();
  EXPECT_TRUE(got2 != want1) << "new logits left the output unchanged";
  run();
  EXPECT_TRUE(out_bytes() == got2) << "replay with new logits against eager";
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

}  // namespace
}  // namespace longctx::gpu_ops_test
