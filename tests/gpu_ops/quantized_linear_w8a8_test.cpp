// The CUDA W8A8 path (FP8 formats on sm_90) against the CPU twin:
//   - the activation quantization kernel: codes and scales bit-identical to the CPU reference
//     (groups of 128 and whole rows, partial groups, padding rows, zero / NaN / Inf inputs);
//   - quantized_linear_cuda's kW8a8 against quantized_linear_cpu's kW8a8 on the W8A8 formats and
//     shapes of tests/common/w8a8_cases.h, n in {65, 200, 4096} (chunks of 4 with a tail of 1-3
//     rows), bf16 / f16 x, bf16 / f16 / f32 out, a bias, strided x and out rows, a workspace that
//     holds fewer rows than n (several chunks). Tolerance per element, with S = sum |x w| (+ |b|):
//     S * 2^-11 (Hopper's FP8 tensor cores add 32-term products at reduced precision before
//     cuBLASLt promotes them to fp32; DeepSeek-V3 measured ~14 bits) + S * 2^-24 (in / 2 + 32)
//     + 1 ulp of a 16-bit out (2 with a bias); and against the CPU W8A16 reference within the
//     bound of w8a8_cases.h plus those terms. Outputs guarded and pre-filled with NaN bytes:
//     every element written, the rows' padding and the guards intact;
//   - a NaN or an Inf in a row of x makes that row's outputs non-finite and leaves the others
//     as the CPU twin's;
//   - refusals (kW8a8 on int4, on 48x80 FP8 blocks, on widths not multiples of 16, on another
//     GPU than sm_90) are Error(kUnsupported); kAuto falls back to the dequantizing path there.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/w8a8_cases.h"
#include "gpu_ops/gpu_ops_util.h"
#include "kernels/cpu/fp8_act_quant_cpu.h"
#include "kernels/cuda/fp8_act_quant.h"
#include "kernels/cuda/func_attributes.h"
#include "loader/quantized_weights.h"
#include "ops/linear.h"
#include "ops/quantized_linear.h"

namespace longctx::gpu_ops_test {
namespace {

using ops::QuantizedLinearPath;
using quant_cases::Format;

bool is_sm90() {
  const auto& p = kernels::cuda::device_props(0);
  return p.major == 9 && p.minor == 0;
}

TEST(GpuOps, Fp8ActQuantMatchesCpu) {
  TestStream s;
  struct Case {
    int64_t rows, padded, in, group, x_pad;
    DType dtype;
  };
  for (const Case c :
       {Case{65, 68, 4096, 128, 0, DType::kBF16}, Case{7, 8, 336, 128, 8, DType::kF16},
        Case{200, 200, 208, 208, 0, DType::kBF16}, Case{5, 8, 14336, 14336, 4, DType::kF32},
        Case{3, 4, 1024, 128, 0, DType::kBF16}}) {
    SCOPED_TRACE(fmt::format("rows {} (padded {}) in {} group {} {}", c.rows, c.padded, c.in,
                             c.group, dtype_name(c.dtype)));
    const int64_t ldx = c.in + c.x_pad, groups = (c.in + c.group - 1) / c.group;
    Mirror x(c.rows * ldx, c.dtype);
    x.random(uint64_t(c.in + c.rows), -3.f, 3.f);
    // Row 1: a zero group; row 2: a NaN; the last row an Inf (rows 0 and 3.. stay clean).
    Tensor xh = x.host({c.rows, c.in}, {ldx, 1}).to_dtype(DType::kF32).contiguous();
    float* xf = xh.data<float>();
    for (int64_t k = 0; k < std::min(c.group, c.in); ++k) xf[1 * c.in + k] = 0.f;
    xf[2 * c.in + 7] = std::numeric_limits<float>::quiet_NaN();
    xf[(c.rows - 1) * c.in + c.in / 2] = std::numeric_limits<float>::infinity();
    // Back to x's dtype on both sides (the values are exact in it).
    Tensor xt = xh.to_dtype(c.dtype);
    std::vector<uint8_t> padded(x.bytes(), 0);
    for (int64_t j = 0; j < c.rows; ++j)
      std::memcpy(padded.data() + j * ldx * dtype_size(c.dtype),
                  static_cast<const uint8_t*>(xt.data_ptr()) + j * c.in * dtype_size(c.dtype),
                  c.in * dtype_size(c.dtype));
    x.set(padded.data());
    const Tensor x32 = x.host({c.rows, c.in}, {ldx, 1}).to_dtype(DType::kF32).contiguous();
    std::vector<uint8_t> ref_codes(size_t(c.rows * c.in));
    std::vector<float> ref_scales(size_t(c.rows * groups));
    kernels::fp8_quantize_rows_cpu(x32.data<float>(), c.rows, c.in, c.in, c.group, ref_codes.data(),
                                   ref_scales.data());
    GuardedBuffer codes(size_t(c.padded * c.in), 0xAB), scales(size_t(groups * c.padded) * 4, 0xAB);
    kernels::cuda::Fp8ActQuantParams p;
    p.x = x.dev_ptr();
    p.x_dtype = c.dtype;
    p.rows = c.rows;
    p.padded_rows = c.padded;
    p.in = c.in;
    p.ldx = ldx;
    p.group = c.group;
    p.codes = static_cast<uint8_t*>(codes.data());
    p.scales = static_cast<float*>(scales.data());
    p.scale_ld = c.padded;
    kernels::cuda::fp8_act_quant_run(p, s.get());
    s.sync();
    std::vector<uint8_t> got_codes(codes.bytes());
    std::vector<float> got_scales(size_t(groups * c.padded));
    codes.download(got_codes.data());
    scales.download(got_scales.data());
    EXPECT_TRUE(codes.guards_intact());
    EXPECT_TRUE(scales.guards_intact());
    int64_t bad = 0;
    for (int64_t j = 0; j < c.padded; ++j) {
      for (int64_t g = 0; g < groups; ++g) {
        const float want = j < c.rows ? ref_scales[j * groups + g] : kernels::fp8_act_scale(0.f);
        const float got = got_scales[g * c.padded + j];
        if (std::memcmp(&want, &got, 4) != 0 && bad++ < 5)
          ADD_FAILURE() << "scale row " << j << " group " << g << ": " << got << " vs " << want;
      }
      for (int64_t k = 0; k < c.in; ++k) {
        const uint8_t want = j < c.rows ? ref_codes[j * c.in + k] : 0;
        if (got_codes[j * c.in + k] != want && bad++ < 5)
          ADD_FAILURE() << "code row " << j << " input " << k << ": "
                        << int(got_codes[j * c.in + k]) << " vs " << int(want);
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

struct W8Case {
  int64_t n;
  DType x_dtype = DType::kBF16, out_dtype = DType::kBF16;
  bool bias = false;
  int64_t x_pad = 0, out_pad = 0;  // out_pad keeps rows 16-byte aligned (a multiple of 8 / 4)
  int64_t workspace_rows = 0;      // > 0: a caller's workspace of that many rows' chunk
  bool poison = false;             // a NaN in row 1 of x, an Inf in row n - 2
};

CaseSpec w8a8_case(const Format& f, const QuantizedWeight& host, const QuantizedWeight& dev,
                   const Tensor& abs_w, const W8Case& wc, uint64_t seed) {
  const int64_t n = wc.n, in = host.in_features, out = host.out_features;
  const int64_t ldx = in + wc.x_pad, ldo = out + wc.out_pad;
  const DType xdt = wc.x_dtype, odt = wc.out_dtype;
  auto x = std::make_shared<Mirror>(n * ldx, xdt);
  x->random(seed, -2.f, 2.f);
  if (wc.poison) {
    std::vector<uint8_t> h(x->host_bytes(), x->host_bytes() + x->bytes());
    auto put = [&](int64_t i, float v) {
      Tensor t = Tensor::empty({1}, DType::kF32);
      t.data<float>()[0] = v;
      t = t.to_dtype(xdt);
      std::memcpy(h.data() + i * dtype_size(xdt), t.data_ptr(), dtype_size(xdt));
    };
    put(1 * ldx + 3, std::numeric_limits<float>::quiet_NaN());
    put((n - 2) * ldx + in - 1, std::numeric_limits<float>::infinity());
    x->set(h.data());
  }
  std::shared_ptr<Mirror> bias;
  if (wc.bias) {
    bias = std::make_shared<Mirror>(out, odt == DType::kF32 ? DType::kBF16 : odt);
    bias->random(seed + 1, -0.5f, 0.5f);
  }
  auto y = std::make_shared<GuardedBuffer>(size_t(n * ldo) * dtype_size(odt), 0xFF);
  std::shared_ptr<Tensor> ws;
  if (wc.workspace_rows > 0)
    ws = std::make_shared<Tensor>(
        Tensor::empty({ops::w8a8_layout(wc.workspace_rows, host).bytes}, DType::kU8, kGpu));
  CaseSpec c;
  c.name = fmt::format("{} [{}, {}] n={} {}->{}{}{}{}{}{}", f.name, out, in, n, dtype_name(xdt),
                       dtype_name(odt), bias ? " bias" : "", wc.x_pad ? " ldx" : "",
                       wc.out_pad ? " ldo" : "",
                       wc.workspace_rows ? fmt::format(" ws {} rows", wc.workspace_rows) : "",
                       wc.poison ? " NaN/Inf rows" : "");
  auto xv = [=](bool d) { return d ? x->dev({n, in}, {ldx, 1}) : x->host({n, in}, {ldx, 1}); };
  const QuantizedWeight* hp = &host;
  const QuantizedWeight* dp = &dev;
  const Tensor* ap = &abs_w;
  const QuantConfig q = f.q;
  c.gpu = [=] {
    Tensor yv = Tensor::from_blob(y->data(), {n, out}, odt, kGpu, nullptr, {ldo, 1});
    ops::quantized_linear_cuda(xv(true), *dp, q, bias ? bias->dev({out}) : Tensor(), yv,
                               ws ? *ws : Tensor(), QuantizedLinearPath::kW8a8);
  };
  c.check = [=] {
    Comparison cmp;
    cmp.guards_ok = y->guards_intact();
    const Tensor x32 = xv(false).to_dtype(DType::kF32).contiguous();
    const Tensor b32 = bias ? bias->host({out}).to_dtype(DType::kF32) : Tensor();
    Tensor ref = Tensor::empty({n, out}, DType::kF32), ref16 = Tensor::empty({n, out}, DType::kF32);
    Tensor sabs = Tensor::empty({n, out}, DType::kF32);
    ops::quantized_linear_cpu(x32, *hp, q, b32, ref, QuantizedLinearPath::kW8a8);
    ops::quantized_linear_cpu(x32, *hp, q, b32, ref16);
    Tensor xabs = Tensor::empty({n, in}, DType::kF32);
    for (int64_t i = 0; i < xabs.numel(); ++i) {
      const float v = x32.data<float>()[i];
      xabs.data<float>()[i] = std::isfinite(v) ? std::abs(v) : 0.f;
    }
    ops::linear_cpu(xabs, *ap, Tensor(), sabs);
    // The bound's activations: |x| (the scales are the same), the poisoned rows' values zeroed.
    const Tensor bound = w8a8_cases::w8a8_bound(xabs, *hp, q, *ap);
    const size_t es = dtype_size(odt);
    std::vector<uint8_t> row(size_t(ldo) * es);
    double err2 = 0, ref2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      LONGCTX_CUDA_CHECK(cudaMemcpy(row.data(), static_cast<uint8_t*>(y->data()) + j * ldo * es,
                                    row.size(), cudaMemcpyDeviceToHost));
      const bool poisoned = wc.poison && (j == 1 || j == n - 2);
      for (int64_t o = 0; o < out; ++o) {
        const double got = element_value(row.data() + o * es, odt);
        ++cmp.compared;
        if (poisoned) {
          if (std::isfinite(got) && cmp.bad++ == 0)
            cmp.first_bad = fmt::format("row {} (NaN/Inf in x) col {}: finite {}", j, o, got);
          continue;
        }
        const double r = ref.data<float>()[j * out + o], r16 = ref16.data<float>()[j * out + o];
        const double sa =
            sabs.data<float>()[j * out + o] + (bias ? std::abs(b32.data<float>()[o]) : 0);
        double allowed = sa * (std::ldexp(1.0, -11) + std::ldexp(1.0, -24) * (double(in) / 2 + 32));
        // One rounding of out, two with a bias (added to the rounded GEMM output).
        if (odt != DType::kF32) allowed += (bias ? 2 : 1) * ulp_of(std::abs(r), odt);
        const double err = std::abs(got - r);
        if (got != r) ++cmp.differ;
        if (!std::isfinite(got)) ++cmp.non_finite;
        if (std::isfinite(err)) {
          cmp.max_err = std::max(cmp.max_err, err);
          cmp.max_ratio = std::max(cmp.max_ratio, allowed > 0 ? err / allowed : 0.0);
        }
        if (!(err <= allowed) && cmp.bad++ == 0)
          cmp.first_bad = fmt::format("row {} col {}: got {:.9g}, want {:.9g} (allowed {:.3g})", j,
                                      o, got, r, allowed);
        // The W8A8 bound against the W8A16 reference (plus the GPU's own terms).
        const double allowed16 = bound.data<float>()[j * out + o] + allowed;
        if (!(std::abs(got - r16) <= allowed16) && cmp.bad++ == 0)
          cmp.first_bad = fmt::format("row {} col {}: got {:.9g}, W8A16 {:.9g} (bound {:.3g})", j,
                                      o, got, r16, allowed16);
        err2 += (got - r16) * (got - r16);
        ref2 += r16 * r16;
      }
      for (size_t b = size_t(out) * es; b < row.size(); ++b)
        if (row[b] != 0xFF && cmp.bad++ == 0)
          cmp.first_bad = fmt::format("row {} padding overwritten", j);
    }
    if (ref2 > 0)
      std::printf("    %s: W8A8 vs W8A16 rms %.2e of the outputs\n", c.name.c_str(),
                  std::sqrt(err2 / ref2));
    return cmp;
  };
  c.flops = 2.0 * double(n) * double(in) * double(out);
  return c;
}

TEST(GpuOps, QuantizedLinearW8a8) {
  TestStream s;
  Summary sum;
  if (!is_sm90()) {
    // Another GPU: kW8a8 is refused (checked in QuantizedLinearW8a8Refusals); nothing to compare.
    std::printf("  not sm_90: W8A8 does not run here\n");
    return;
  }
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  uint64_t seed = 100;
  for (const Format& f : w8a8_cases::formats())
    for (auto [out, in] : w8a8_cases::shapes()) {
      const QuantizedWeight host = quant_cases::random_quantized(out, in, f.q, uint32_t(seed));
      const QuantizedWeight dev = quant_cases::to_device(host, kGpu);
      Tensor abs_w = dequantize(host, f.q, DType::kF32);
      for (int64_t i = 0; i < abs_w.numel(); ++i)
        abs_w.data<float>()[i] = std::abs(abs_w.data<float>()[i]);
      std::vector<W8Case> cases = {{65},
                                   {200, bf, f32, true},
                                   {67, f16, f16, true, 8, 8},
                                   {66, bf, bf, false, 16, 8},
                                   {200, bf, bf, false, 0, 0, 32},  // 6 chunks of 32 + a tail
                                   {70, bf, bf, true, 0, 0, 0, true}};
      if (out * in <= 256 * 1024) cases.push_back({4096});
      for (const W8Case& wc : cases) run_case(s, w8a8_case(f, host, dev, abs_w, wc, seed++), sum);
    }
}

TEST(GpuOps, QuantizedLinearW8a8Refusals) {
  TestStream s;
  auto code_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  const std::vector<Format> all = quant_cases::formats();
  auto find = [&](const std::string& name) {
    for (const Format& f : all)
      if (f.name == name) return f;
    throw std::runtime_error(name);
  };
  Mirror x(80 * 384, DType::kBF16), y(80 * 256, DType::kBF16);
  x.random(3, -1.f, 1.f);
  auto run = [&](const Format& f, int64_t out, int64_t in, QuantizedLinearPath path) {
    const QuantizedWeight w =
        quant_cases::to_device(quant_cases::random_quantized(out, in, f.q, 4), kGpu);
    return code_of([&] {
      ops::quantized_linear_cuda(x.dev({80, in}), w, f.q, Tensor(), y.dev({80, out}), Tensor(),
                                 path);
      s.sync();
    });
  };
  using P = QuantizedLinearPath;
  EXPECT_EQ(run(find("awq g128"), 256, 384, P::kW8a8), ErrorCode::kUnsupported);
  EXPECT_EQ(run(find("fp8 block 48x80"), 256, 320, P::kW8a8), ErrorCode::kUnsupported);
  EXPECT_EQ(run(find("fp8 block 128x128"), 256, 200, P::kW8a8), ErrorCode::kUnsupported);
  EXPECT_EQ(run(find("fp8 block 48x80"), 256, 320, P::kAuto), ErrorCode::kInternal);  // ran
  const ErrorCode on_this_gpu = run(find("fp8 block 128x128"), 256, 384, P::kW8a8);
  EXPECT_EQ(on_this_gpu, is_sm90() ? ErrorCode::kInternal : ErrorCode::kUnsupported);
  // What kAuto runs, by its plan.
  const Format blk = find("fp8 block 128x128");
  const QuantizedWeight w =
      quant_cases::to_device(quant_cases::random_quantized(256, 384, blk.q, 5), kGpu);
  const std::string plan =
      ops::quantized_linear_cuda_plan(x.dev({80, 384}), w, blk.q, Tensor(), y.dev({80, 256}));
  std::printf("  plan at n = 80: %s\n", plan.c_str());
  EXPECT_TRUE(plan.starts_with(is_sm90() ? "w8a8" : "dequant")) << plan;
  // A workspace too small for even 4 rows: kAuto falls back to the dequantizing path, whose
  // scratch does not fit either: a clear error.
  Tensor small = Tensor::empty({64}, DType::kU8, kGpu);
  EXPECT_EQ(
      code_of([&] {
        ops::quantized_linear_cuda(x.dev({80, 384}), w, blk.q, Tensor(), y.dev({80, 256}), small);
      }),
      ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace longctx::gpu_ops_test
