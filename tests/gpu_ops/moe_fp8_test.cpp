// CUDA MoE ops on FP8 block experts (MoeArgs' F8_E4M3 codes with [block_out, block_in] f32
// scales) against the CPU twin, over odd shapes and block sizes (blocks not dividing the rows,
// block_in not a multiple of 16 or of 8, which moves the decode GEMVs to scalar loads and the
// prefill to the SIMT kernel) and the real ones: Qwen3-30B-A3B (E 128, top-8, H 2048, I 768) and
// Qwen3-Next-80B-A3B (E 512, top-10, I 512, a shared expert), 128 x 128 blocks, T 1-4096.
// References and tolerances per path (the terms of the header of moe_test.cpp):
//   decode GEMVs, SIMT grouped GEMMs: fp32 weights code x scale as the CPU twin's (the GEMV
//     scales each 16-code partial sum instead of each code, a rounding apart): the CPU twin on the
//     FP8 arguments, 1e-5 x (sum of |terms|) + one ulp of a 16-bit out;
//   tensor cores: weights code x scale rounded to x's dtype when staged, as a load-time
//     dequantize gives them: the CPU twin on those dequantized weights, with the bf16 tests'
//     tolerance (the activation's rounding, u); and bitwise the same kernels on the dequantized
//     weights themselves (the same shared-memory tiles, the same MMA chain);
//   cuBLASLt: one expert at a time dequantized the same way: against the CPU twin on the
//     dequantized weights as the bf16 cuBLASLt tests (5.2 u).
// Outputs start as NaN bytes; non-finite outputs are counted. CUDA graphs of routing + experts
// replay to the eager bytes. The capability query says FP8 experts run on CUDA.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_ops/gpu_ops_util.h"
#include "gpu_ops/moe_test_util.h"
#include "longctx/core/dtype.h"
#include "longctx/core/parallel.h"
#include "ops/moe.h"
#include "ops/moe_schedule.h"

namespace longctx::gpu_ops_test {
namespace {

struct Fp8Case {
  int64_t tokens, experts, k, hidden, inter;
  int64_t block_out, block_in;
  DType dtype;  // x, out, shared
  bool shared;
};

int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

// Random FP8 experts on the host: codes of values uniform in [-448, 448] (no NaN codes), block
// scales uniform in [0.5, 1.5] x amp / 448, so the weights spread over [-1.5 amp, 1.5 amp].
void random_fp8(const Tensor& codes, const Tensor& scales, uint64_t seed, float amp) {
  uint8_t* c = codes.data<uint8_t>();
  parallel_for(
      codes.numel(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float u = float(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 40) * 0x1p-24f;
          c[i] = f32_to_fp8e4m3(-448.f + 896.f * u);
        }
      },
      1 << 16);
  float* s = scales.data<float>();
  for (int64_t i = 0; i < scales.numel(); ++i) {
    const float u = float(mix((seed + 1) * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 40) * 0x1p-24f;
    s[i] = (0.5f + u) * amp / 448.f;
  }
}

// codes [E, rows, K] with scales [E, block rows, ceil(K / bi)] (gate and up blocked apart at
// `split` rows) dequantized into the 16-bit `dtype`: code x scale in f32, rounded once.
Tensor dequantize_experts(const Tensor& codes, const Tensor& scales, int64_t split, int64_t bo,
                          int64_t bi, DType dtype) {
  const int64_t e = codes.size(0), rows = codes.size(1), k = codes.size(2);
  const int64_t split_blocks = blocks(split, bo), sc = scales.size(2);
  Tensor out = Tensor::empty({e, rows, k}, dtype);
  const uint8_t* c = codes.data<uint8_t>();
  const float* s = scales.data<float>();
  uint16_t* o = static_cast<uint16_t*>(out.data_ptr());
  const bool bf16 = dtype == DType::kBF16;
  parallel_for(
      e * rows,
      [&](int64_t b, int64_t end) {
        for (int64_t er = b; er < end; ++er) {
          const int64_t x = er / rows, r = er % rows;
          const int64_t br = r < split ? r / bo : split_blocks + (r - split) / bo;
          const float* srow = s + (x * scales.size(1) + br) * sc;
          for (int64_t j = 0; j < k; ++j) {
            const float w = fp8e4m3_to_f32(c[er * k + j]) * srow[j / bi];
            o[er * k + j] = bf16 ? f32_to_bf16(w) : f32_to_f16(w);
          }
        }
      },
      64);
  return out;
}

// The codes with their sign bits cleared: with the (positive) scales, the weights' |W|.
Tensor abs_codes(const Tensor& codes) {
  Tensor a = Tensor::empty(codes.shape(), codes.dtype());
  a.copy_from(codes);
  uint8_t* p = a.data<uint8_t>();
  parallel_for(
      a.numel(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) p[i] &= 0x7f;
      },
      1 << 16);
  return a;
}

Tensor abs_of(const Tensor& t) {
  Tensor f = t.to_dtype(DType::kF32).contiguous();
  Tensor a = Tensor::empty(f.shape(), DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) a.data<float>()[i] = std::fabs(f.data<float>()[i]);
  return a;
}

std::vector<uint8_t> bytes_of(const Tensor& d) {
  Tensor h = d.contiguous().to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// The CPU twin's output on `h`, and `abs_out`: the op on absolute values (|terms|), both f32.
struct Reference {
  Tensor out, abs_out;
};
Tensor cpu_out(const ops::MoeArgs& h) {
  ops::MoeArgs a = h;
  a.out = Tensor::empty(h.out.shape(), DType::kF32);
  ops::moe_experts_cpu(a);
  return a.out;
}

// Elements of `got` (the device output) outside (1e-5 + act_u) x (|terms| + 1e-3) + ulp x |ref|
// of ref; prints the worst error / tolerance.
int64_t count_bad(const Tensor& got_dev, const Reference& ref, DType dtype, double act_u,
                  const std::string& what) {
  EXPECT_EQ(count_non_finite(got_dev.data_ptr(), dtype, got_dev.size(0), got_dev.size(1),
                             got_dev.size(1)),
            0)
      << what;
  const Tensor got = got_dev.to(Device::cpu()).to_dtype(DType::kF32);
  const double ulp = dtype == DType::kBF16 ? 1.0 / 128 : dtype == DType::kF16 ? 1.0 / 1024 : 0.0;
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double want = ref.out.data<float>()[i], g = got.data<float>()[i];
    const double tol =
        (1e-5 + act_u) * (ref.abs_out.data<float>()[i] + 1e-3) + ulp * std::fabs(want);
    const double err = std::fabs(g - want);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << ": got " << g << ", cpu " << want << ", tol "
                    << tol;
  }
  fmt::print("  {}: worst err / tol {:.3f}\n", what, worst);
  return bad;
}

class MoeGpuFp8 : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(MoeGpuFp8, MatchesCpuTwin) {
  const Fp8Case c = GetParam();
  TestStream stream;
  ASSERT_TRUE(ops::moe_runs_fp8_experts(kGpu));
  const uint32_t seed = uint32_t(c.tokens * 131 + c.experts * 7 + c.k + c.block_in);
  const int64_t n = c.inter, h = c.hidden, bo = c.block_out, bi = c.block_in;
  Tensor logits = random_host({c.tokens, c.experts}, kF32, seed, -3, 3);
  ops::MoeArgs q;  // the FP8 arguments on the host
  q.x = random_host({c.tokens, h}, c.dtype, seed + 1, -1, 1);
  q.topk_ids = Tensor::empty({c.tokens, c.k}, DType::kI32);
  q.topk_weights = Tensor::empty({c.tokens, c.k}, kF32);
  ops::moe_route(logits, c.k > 1, q.topk_ids, q.topk_weights);
  q.gate_up = Tensor::empty({c.experts, 2 * n, h}, DType::kFP8E4M3);
  q.gate_up_scales = Tensor::empty({c.experts, 2 * blocks(n, bo), blocks(h, bi)}, kF32);
  q.down = Tensor::empty({c.experts, h, n}, DType::kFP8E4M3);
  q.down_scales = Tensor::empty({c.experts, blocks(h, bo), blocks(n, bi)}, kF32);
  q.block_out = bo;
  q.block_in = bi;
  random_fp8(q.gate_up, q.gate_up_scales, seed + 2, 2.f / std::sqrt(float(h)));
  random_fp8(q.down, q.down_scales, seed + 3, 2.f / std::sqrt(float(n)));
  if (c.shared) {
    q.shared = random_host({c.tokens, h}, c.dtype, seed + 4, -1, 1);
    q.shared_gate = random_host({c.tokens, 1}, kF32, seed + 5, -2, 2);
  }
  q.out = Tensor::empty({c.tokens, h}, kF32);
  // exact: the CPU twin on the FP8 arguments; |terms| from the codes' absolute values
  ops::MoeArgs qa = q;
  qa.x = abs_of(q.x);
  qa.gate_up = abs_codes(q.gate_up);
  qa.down = abs_codes(q.down);
  if (c.shared) qa.shared = abs_of(q.shared);
  const Reference exact{cpu_out(q), cpu_out(qa)};
  // the same weights dequantized to x's dtype (float experts): the 16-bit paths' weights
  const bool x16 = c.dtype == DType::kBF16 || c.dtype == DType::kF16;
  ops::MoeArgs deq = q;
  if (x16) {
    deq.gate_up = dequantize_experts(q.gate_up, q.gate_up_scales, n, bo, bi, c.dtype);
    deq.down = dequantize_experts(q.down, q.down_scales, h, bo, bi, c.dtype);
    deq.gate_up_scales = deq.down_scales = Tensor();
    deq.block_out = deq.block_in = 0;
  }
  const Reference rounded = x16 ? Reference{cpu_out(deq), exact.abs_out} : exact;

  auto to_device = [&](const ops::MoeArgs& a) {
    ops::MoeArgs d = a;
    for (Tensor* t : {&d.x, &d.topk_ids, &d.topk_weights, &d.gate_up, &d.down, &d.gate_up_scales,
                      &d.down_scales, &d.shared, &d.shared_gate})
      if (t->defined()) *t = t->to(kGpu);
    d.out = Tensor::empty({c.tokens, h}, c.dtype, kGpu);
    return d;
  };
  ops::MoeArgs dq = to_device(q), dd = x16 ? to_device(deq) : ops::MoeArgs();
  auto run = [&](ops::MoeArgs& a, ops::MoeBackend backend) {
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(a.out.data_ptr(), 0xFF, a.out.nbytes(), stream.get()));
    ops::moe_experts_cuda(a, backend);
    stream.sync();
  };
  const bool tc_ok = x16 && h % 8 == 0 && n % 8 == 0 && bi % 8 == 0;
  const ops::MoePath path = ops::moe_path(c.tokens, h, n, tc_ok, true);
  const double u = c.dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
  const std::string shape = fmt::format("T {} E {} k {} H {} I {} blocks {}x{} {}", c.tokens,
                                        c.experts, c.k, h, n, bo, bi, dtype_name(c.dtype));
  SCOPED_TRACE(shape);
  fmt::print("{}\n", shape);
  run(dq, ops::MoeBackend::kKernels);
  if (path == ops::MoePath::kTensorCore) {
    EXPECT_EQ(count_bad(dq.out, rounded, c.dtype, u, "tensor-core"), 0);
    run(dd, ops::MoeBackend::kKernels);
    EXPECT_TRUE(bytes_of(dq.out) == bytes_of(dd.out))
        << "FP8 tiles differ from the dequantized weights' on the tensor-core path";
  } else {
    EXPECT_EQ(
        count_bad(dq.out, exact, c.dtype, 0.0, path == ops::MoePath::kDecode ? "decode" : "simt"),
        0);
    // the kernels on the weights dequantized to x's dtype (the decode GEMVs, or the grouped GEMMs
    // those operands take): apart by the weights' rounding
    if (x16) {
      run(dd, ops::MoeBackend::kKernels);
      Reference fp8_dev;
      fp8_dev.out = dq.out.to(Device::cpu()).to_dtype(kF32);
      fp8_dev.abs_out = exact.abs_out;
      // each weight rounded by u moves gate, up and down; silu with its gate: 5.2 u, as the
      // cuBLASLt tolerance of moe_test.cpp
      EXPECT_EQ(count_bad(dd.out, fp8_dev, c.dtype, 5.2 * u, "vs dequantized"), 0);
    }
  }
  if (tc_ok && c.tokens > ops::kMoeDecodeMaxTokens) {
    run(dq, ops::MoeBackend::kCublasLt);
    EXPECT_EQ(count_bad(dq.out, rounded, c.dtype, 5.2 * u, "cublaslt"), 0);
  }
  // moe_forward (routing fused into the decode kernels) on the same logits: the same bytes as
  // moe_route + moe_experts (the decode and the automatic prefill path).
  ops::MoeArgs fa = dq, fb = dq;
  fa.topk_ids = Tensor::empty({c.tokens, c.k}, DType::kI32, kGpu);
  fa.topk_weights = Tensor::empty({c.tokens, c.k}, kF32, kGpu);
  fb.topk_ids = Tensor::empty({c.tokens, c.k}, DType::kI32, kGpu);
  fb.topk_weights = Tensor::empty({c.tokens, c.k}, kF32, kGpu);
  fb.out = Tensor::empty({c.tokens, h}, c.dtype, kGpu);
  const Tensor d_logits = logits.to(kGpu);
  ops::moe_forward_cuda(d_logits, c.k > 1, fa);
  ops::moe_route_cuda(d_logits, c.k > 1, fb.topk_ids, fb.topk_weights);
  ops::moe_experts_cuda(fb);
  stream.sync();
  EXPECT_TRUE(bytes_of(fa.out) == bytes_of(fb.out)) << "moe_forward vs route + experts";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeGpuFp8,
    ::testing::Values(
        // decode GEMVs: 16-code loads, and scalar loads (H or block_in not multiples of 16)
        Fp8Case{1, 128, 8, 2048, 768, 128, 128, kBf, false},  // Qwen3-30B-A3B, batch 1
        Fp8Case{3, 128, 8, 2048, 768, 128, 128, kBf, false},
        Fp8Case{1, 512, 10, 2048, 512, 128, 128, kBf, true},  // Qwen3-Next-80B-A3B, batch 1
        Fp8Case{3, 512, 10, 2048, 512, 128, 128, kBf, true},
        Fp8Case{2, 16, 2, 72, 40, 128, 128, kBf, false},  // blocks larger than the matrices
        Fp8Case{3, 60, 4, 144, 96, 64, 48, kF16, true},   // block_in 48: a multiple of 16
        Fp8Case{2, 16, 2, 70, 36, 32, 32, kBf, true},     // scalar: H not a multiple of 16
        Fp8Case{4, 16, 4, 128, 64, 16, 8, kF32, false},   // scalar: block_in 8
        // tensor-core grouped GEMMs (and cuBLASLt forced)
        Fp8Case{8, 128, 8, 2048, 768, 128, 128, kBf, false},  // small tiles
        Fp8Case{33, 128, 8, 2048, 768, 128, 128, kBf, false},
        Fp8Case{300, 128, 8, 2048, 768, 128, 128, kBf, false},
        Fp8Case{8, 512, 10, 2048, 512, 128, 128, kBf, true},
        Fp8Case{33, 512, 10, 2048, 512, 128, 128, kBf, true},
        Fp8Case{300, 512, 10, 2048, 512, 128, 128, kBf, true},
        Fp8Case{33, 60, 4, 200, 136, 64, 8, kF16, true},   // block_in 8: one scale per chunk
        Fp8Case{300, 16, 2, 136, 72, 48, 24, kBf, false},  // blocks not dividing the tiles
        Fp8Case{4096, 128, 8, 256, 128, 128, 128, kBf, false},
        // SIMT grouped GEMMs: f32 x, block_in 4, H not a multiple of 8
        Fp8Case{33, 16, 2, 128, 64, 128, 128, kF32, true},
        Fp8Case{300, 16, 2, 64, 32, 16, 4, kBf, false},
        Fp8Case{33, 16, 2, 130, 50, 32, 32, kBf, true}));

// Routing + FP8 experts captured once replay to the eager bytes (decode, the tensor-core and SIMT
// paths; nothing of FP8 is read on the host).
TEST(MoeGpuFp8Graph, ReplayEqualsEager) {
  struct G {
    int64_t tokens, experts, k, hidden, inter, block_in;
  };
  for (const G& c : {G{1, 128, 8, 2048, 768, 128}, G{1, 512, 10, 2048, 512, 128},
                     G{300, 128, 8, 256, 136, 128}, G{300, 16, 2, 64, 32, 4}}) {
    SCOPED_TRACE(fmt::format("T {} E {}", c.tokens, c.experts));
    TestStream stream;
    constexpr int64_t kBo = 128;
    ops::MoeArgs q;
    q.x = random_host({c.tokens, c.hidden}, kBf, 11, -1, 1).to(kGpu);
    q.topk_ids = Tensor::empty({c.tokens, c.k}, DType::kI32, kGpu);
    q.topk_weights = Tensor::empty({c.tokens, c.k}, kF32, kGpu);
    Tensor gu = Tensor::empty({c.experts, 2 * c.inter, c.hidden}, DType::kFP8E4M3);
    Tensor gus =
        Tensor::empty({c.experts, 2 * blocks(c.inter, kBo), blocks(c.hidden, c.block_in)}, kF32);
    Tensor dn = Tensor::empty({c.experts, c.hidden, c.inter}, DType::kFP8E4M3);
    Tensor dns =
        Tensor::empty({c.experts, blocks(c.hidden, kBo), blocks(c.inter, c.block_in)}, kF32);
    random_fp8(gu, gus, 12, 0.05f);
    random_fp8(dn, dns, 13, 0.05f);
    q.gate_up = gu.to(kGpu);
    q.gate_up_scales = gus.to(kGpu);
    q.down = dn.to(kGpu);
    q.down_scales = dns.to(kGpu);
    q.block_out = kBo;
    q.block_in = c.block_in;
    q.out = Tensor::empty({c.tokens, c.hidden}, kBf, kGpu);
    const Tensor logits = random_host({c.tokens, c.experts}, kF32, 14, -3, 3).to(kGpu);
    auto run = [&] { ops::moe_forward(logits, true, q); };
    run();
    stream.sync();
    const std::vector<uint8_t> want = bytes_of(q.out);
    const PrivatePoolGraph graph(stream, run);
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(q.out.data_ptr(), 0xFF, q.out.nbytes(), stream.get()));
    graph.launch(stream);
    stream.sync();
    EXPECT_TRUE(bytes_of(q.out) == want) << "replay";
  }
}

}  // namespace
}  // namespace longctx::gpu_ops_test
