// CUDA quantized Linear against the CPU twin (the loader's dequantize + the dense CPU linear) on
// every format of tests/common/quantized_linear_cases.h, odd shapes (out not a multiple of the
// GEMV tiles, in past one CTA's staged slice) and n = 1..9, 17, 512: the GEMV (n <= 8) and the
// dequantize + cuBLASLt path (n > 8, and forced at small n), bf16 and f16 x, bf16 and f32 out,
// a bias, strided x and out rows; every GEMV kernel with split K reduced by the last CTA of a
// tile and by the second kernel, and with the weights' L2 prefetch off or before the wait (one
// test replays a graph of last-CTA reductions twice: the tile counters must be back at zero).
// The output buffer is guarded and pre-filled with NaN bytes:
// every element must be finite and within tolerance, the rows' padding untouched, the guards
// intact.
//
// Tolerance per element, with S = sum_k |x_k w_k| + |bias| (the CPU twin on |x| and |W|):
//   GEMV: S * 2^-24 * (in / 2 + 32): fp32 sums in another order, the scale applied to partial
//         sums (int4 products (q - z) x are exact, FP8 products too);
//   dequantize + GEMM: + S * 2^-8 (bf16) or 2^-11 (f16): the weight rounded once to x's dtype;
//   + 1 ulp of a 16-bit out (its rounding).
//
// Perf mode (LONGCTX_PERF=1): GpuOpsPerf.QuantizedLinearDecodeLlama8B, Llama-3.1-8B's layer
// shapes at n = 1, 4 and 8 in each format against the bf16 GEMV and cuBLASLt on the same shape:
// the schedule's choice (" auto"), then each kernel x reduction x prefetch, and at n = 1 each at
// other targets of CTAs per SM and forced slice counts (plans already timed are skipped)
// (ms, GB/s of the bytes read: packed weight + scales + zeros; weights rotated through copies
// larger than L2), and the prefill path at n = 512 and 4096 against the dense GEMM alone (the
// difference is the dequantizing kernel's time).
#include "ops/quantized_linear.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "common/quantized_linear_cases.h"
#include "gpu_ops/gpu_ops_util.h"
#include "loader/quantized_weights.h"
#include "ops/linear.h"

namespace longctx::gpu_ops_test {
namespace {

using ops::QuantizedLinearPath;
using quant_cases::Format;

const char* path_name(QuantizedLinearPath p) {
  return p == QuantizedLinearPath::kGemv          ? "gemv"
         : p == QuantizedLinearPath::kDequantGemm ? "dequant"
         : p == QuantizedLinearPath::kW8a8        ? "w8a8"
                                                  : "auto";
}

Tensor abs_f32(const Tensor& t) {
  Tensor f = t.to_dtype(DType::kF32).contiguous();
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = std::abs(f.data<float>()[i]);
  return f;
}

struct QWeight {
  Format f;
  int64_t out, in;
  QuantizedWeight host, dev;
  Tensor abs_dense;  // [out, in] f32 |dequantize(w)|
};

struct QCase {
  int64_t n;
  DType x_dtype = DType::kBF16, out_dtype = DType::kBF16;
  bool bias = false;
  int64_t x_pad = 0, out_pad = 0;
  QuantizedLinearPath path = QuantizedLinearPath::kAuto;
  ops::QuantizedGemvKernel kernel = ops::QuantizedGemvKernel::kAuto;
  int64_t splits = 0;  // K slices forced (0: the schedule's)
  ops::QuantizedGemvReduce reduce = ops::QuantizedGemvReduce::kAuto;
  ops::QuantizedGemvPrefetch prefetch = ops::QuantizedGemvPrefetch::kOff;
  ops::QuantizedGemvOptions gemv() const { return {kernel, 0, splits, reduce, prefetch}; }
};

const char* kernel_name(ops::QuantizedGemvKernel k) {
  return k == ops::QuantizedGemvKernel::kSimt       ? " simt"
         : k == ops::QuantizedGemvKernel::kMma      ? " mma"
         : k == ops::QuantizedGemvKernel::kMmaAsync ? " mma-async"
                                                    : "";
}

CaseSpec quantized_case(const QWeight& w, const QCase& qc, uint64_t seed) {
  const int64_t n = qc.n, in = w.in, out = w.out;
  const int64_t ldx = in + qc.x_pad, ldo = out + qc.out_pad;
  const DType xdt = qc.x_dtype, odt = qc.out_dtype;
  auto x = std::make_shared<Mirror>(n * ldx, xdt);
  x->random(seed, -1.f, 1.f);
  std::shared_ptr<Mirror> bias;
  if (qc.bias) {
    bias = std::make_shared<Mirror>(out, DType::kBF16);
    bias->random(seed + 1, -0.5f, 0.5f);
  }
  auto y = std::make_shared<GuardedBuffer>(size_t(n * ldo) * dtype_size(odt), 0xFF);
  CaseSpec c;
  c.name =
      fmt::format("{} [{}, {}] n={} {}->{}{}{}{} {}{}{}{}{}", w.f.name, out, in, n, dtype_name(xdt),
                  dtype_name(odt), bias ? " bias" : "", qc.x_pad ? " ldx" : "",
                  qc.out_pad ? " ldo" : "", path_name(qc.path), kernel_name(qc.kernel),
                  qc.splits ? fmt::format(" splits {}", qc.splits) : std::string(),
                  qc.reduce == ops::QuantizedGemvReduce::kKernel    ? " reduce kernel"
                  : qc.reduce == ops::QuantizedGemvReduce::kLastCta ? " reduce last-cta"
                                                                    : "",
                  qc.prefetch == ops::QuantizedGemvPrefetch::kAfterWait    ? " prefetch after-wait"
                  : qc.prefetch == ops::QuantizedGemvPrefetch::kBeforeWait ? " prefetch before-wait"
                                                                           : "");
  auto xv = [=](bool dev) { return dev ? x->dev({n, in}, {ldx, 1}) : x->host({n, in}, {ldx, 1}); };
  const QWeight* wp = &w;
  c.gpu = [=] {
    Tensor yv = Tensor::from_blob(y->data(), {n, out}, odt, kGpu, nullptr, {ldo, 1});
    ops::quantized_linear_cuda(xv(true), wp->dev, wp->f.q, bias ? bias->dev({out}) : Tensor(), yv,
                               Tensor(), qc.path, qc.gemv());
  };
  c.check = [=] {
    Comparison cmp;
    cmp.guards_ok = y->guards_intact();
    const int64_t nf = count_non_finite(y->data(), odt, n, out, ldo);
    cmp.non_finite = nf;
    if (nf) {
      cmp.bad = nf;
      cmp.first_bad = fmt::format("{} NaN/Inf outputs", nf);
    }
    const Tensor x32 = xv(false).to_dtype(DType::kF32).contiguous(), xabs = abs_f32(xv(false));
    const Tensor b32 = bias ? bias->host({out}).to_dtype(DType::kF32) : Tensor();
    const Tensor babs = bias ? abs_f32(bias->host({out})) : Tensor();
    const std::string plan = ops::quantized_linear_cuda_plan(
        xv(true), wp->dev, wp->f.q, Tensor(),
        Tensor::from_blob(y->data(), {n, out}, odt, kGpu, nullptr, {ldo, 1}), qc.path, qc.gemv());
    const bool gemv = plan.starts_with("gemv"), w8a8 = plan.starts_with("w8a8");
    Tensor ref = Tensor::empty({n, out}, DType::kF32), sabs = Tensor::empty({n, out}, DType::kF32);
    // W8A8 (FP8 formats on sm_90 past the GEMV's rows) against the CPU twin's W8A8: the same
    // codes and scales, fp32 sums in another order (quantized_linear_w8a8_test.cpp says why
    // 2^-11).
    ops::quantized_linear_cpu(x32, wp->host, wp->f.q, b32, ref,
                              w8a8 ? QuantizedLinearPath::kW8a8 : QuantizedLinearPath::kAuto);
    ops::linear_cpu(xabs, wp->abs_dense, babs, sabs);
    const double weight_round = gemv                  ? 0.0
                                : w8a8                ? std::ldexp(1.0, -11)
                                : xdt == DType::kBF16 ? std::ldexp(1.0, -8)
                                                      : std::ldexp(1.0, -11);
    const size_t es = dtype_size(odt);
    std::vector<uint8_t> row(size_t(ldo) * es);
    for (int64_t j = 0; j < n; ++j) {
      LONGCTX_CUDA_CHECK(cudaMemcpy(row.data(), static_cast<uint8_t*>(y->data()) + j * ldo * es,
                                    row.size(), cudaMemcpyDeviceToHost));
      for (int64_t o = 0; o < out; ++o) {
        const double got = element_value(row.data() + o * es, odt);
        const double r = ref.data<float>()[j * out + o], s = sabs.data<float>()[j * out + o];
        double allowed = s * (std::ldexp(1.0, -24) * (double(in) / 2 + 32) + weight_round);
        if (odt != DType::kF32) allowed += ulp_of(std::abs(r), odt);
        const double err = std::abs(got - r);
        ++cmp.compared;
        if (got != r) ++cmp.differ;
        if (std::isfinite(err)) {
          cmp.max_err = std::max(cmp.max_err, err);
          cmp.max_ratio = std::max(cmp.max_ratio, allowed > 0 ? err / allowed : 0.0);
        }
        if (!(err <= allowed) && cmp.bad++ == 0)
          cmp.first_bad = fmt::format("row {} col {}: got {:.9g}, want {:.9g} (allowed {:.3g})", j,
                                      o, got, r, allowed);
      }
      for (size_t b = size_t(out) * es; b < row.size(); ++b)
        if (row[b] != 0xFF && cmp.bad++ == 0)
          cmp.first_bad = fmt::format("row {} padding overwritten", j);
    }
    return cmp;
  };
  c.flops = 2.0 * double(n) * double(in) * double(out);
  return c;
}

std::unique_ptr<QWeight> make_weight(const Format& f, int64_t out, int64_t in, uint32_t seed) {
  auto w = std::make_unique<QWeight>();
  w->f = f;
  w->out = out;
  w->in = in;
  w->host = quant_cases::random_quantized(out, in, f.q, seed);
  w->dev = quant_cases::to_device(w->host, kGpu);
  w->abs_dense = abs_f32(dequantize(w->host, f.q, DType::kF32));
  return w;
}

// n = 1..9, 17 (and 64, 65, 512 with `large`: the GEMV's last row count in passes of 8 and the
// first past it), with variants: f16 x, f32 out, a bias, strided rows, the GEMV and the
// dequantizing path forced; 20 strided rows (GEMV passes of 8, 8 and 4). kAuto runs the int4
// formats' tensor-core GEMV where it takes the shape; the CUDA-core one is forced on a few.
std::vector<QCase> matrix(bool large) {
  using P = QuantizedLinearPath;
  using K = ops::QuantizedGemvKernel;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  std::vector<QCase> v;
  for (int64_t n = 1; n <= 9; ++n) v.push_back({n});
  v.push_back({17});
  if (large) {
    v.push_back({64});
    v.push_back({65});
    v.push_back({512, bf, f32});
  }
  v.push_back({20, f16, f32, true, 8, 3});
  v.push_back({1, bf, f32, true});
  v.push_back({4, f16, f16, true, 8, 3});
  v.push_back({3, bf, bf, false, 16, 0, P::kGemv});
  v.push_back({2, bf, bf, true, 0, 0, P::kDequantGemm});
  v.push_back({6, f16, f32, false, 0, 5, P::kDequantGemm});
  v.push_back({8, f32, f32, true, 0, 0, P::kAuto});  // f32 x: the dequantizing path
  // The kernels kAuto does not pick (where they take the shape; kAuto falls back otherwise).
  for (K k : {K::kSimt, K::kMma}) {
    for (int64_t n : {1, 2, 5, 8}) v.push_back({n, bf, bf, n == 5, 0, 0, P::kAuto, k});
    v.push_back({3, f16, f32, true, 8, 3, P::kAuto, k});
  }
  // Split K reduced by the last CTA of each tile and by the second kernel, on every kernel: 3
  // slices, and 64 (clamped to the kernel's most).
  for (K k : {K::kSimt, K::kMma, K::kMmaAsync})
    for (ops::QuantizedGemvReduce r :
         {ops::QuantizedGemvReduce::kLastCta, ops::QuantizedGemvReduce::kKernel}) {
      v.push_back({1, bf, bf, true, 0, 0, P::kAuto, k, 3, r});
      v.push_back({5, f16, f32, false, 8, 3, P::kAuto, k, 64, r});
    }
  for (K k : {K::kSimt, K::kMma, K::kMmaAsync})
    for (ops::QuantizedGemvPrefetch f :
         {ops::QuantizedGemvPrefetch::kAfterWait, ops::QuantizedGemvPrefetch::kBeforeWait})
      v.push_back({2, bf, bf, false, 0, 0, P::kAuto, k, 0, ops::QuantizedGemvReduce::kAuto, f});
  return v;
}

void run_formats(bool large) {
  TestStream s;
  Summary sum;
  uint32_t seed = 1;
  for (const Format& f : quant_cases::formats())
    for (auto [out, in] : quant_cases::odd_shapes(f.q, large)) {
      std::unique_ptr<QWeight> w;
      try {
        w = make_weight(f, out, in, seed++);
      } catch (const std::exception& e) {
        ADD_FAILURE() << f.name << " weight " << out << "x" << in << ": " << e.what();
        continue;
      }
      const std::vector<QCase> cases = matrix(large && out * in <= 1 << 20);
      for (size_t i = 0; i < cases.size(); ++i)
        run_case(s, quantized_case(*w, cases[i], seed * 100 + i), sum);
    }
}

TEST(GpuOps, QuantizedLinearEveryFormat) { run_formats(true); }

TEST(GpuOpsSmall, QuantizedLinear) { run_formats(false); }

// The GEMV refuses what it cannot run, with a reason (and kAuto falls back to the dequantizing
// path, checked above): n > kQuantizedGemvMaxRows, f32 x, an FP8 width or block width that is not a
// multiple of 16.
TEST(GpuOps, QuantizedLinearGemvRefusals) {
  TestStream s;
  Summary sum;
  auto code_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  const Format awq = quant_cases::formats().front();
  const std::unique_ptr<QWeight> w = make_weight(awq, 64, 128, 9);
  // One row past what the GEMV takes (its passes of 8 rows stop at kQuantizedGemvMaxRows).
  constexpr int64_t kRows = ops::kQuantizedGemvMaxRows + 1;
  Mirror xn(kRows * 128, DType::kBF16), yn(kRows * 64, DType::kBF16), x32(128, DType::kF32),
      y32(64, DType::kF32);
  EXPECT_EQ(code_of([&] {
              ops::quantized_linear_cuda(xn.dev({kRows, 128}), w->dev, awq.q, Tensor(),
                                         yn.dev({kRows, 64}), Tensor(), QuantizedLinearPath::kGemv);
            }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] {
              ops::quantized_linear_cuda(x32.dev({1, 128}), w->dev, awq.q, Tensor(),
                                         y32.dev({1, 64}), Tensor(), QuantizedLinearPath::kGemv);
            }),
            ErrorCode::kUnsupported);
  Format ct = quant_cases::formats().back();
  const std::unique_ptr<QWeight> f = make_weight(ct, 16, 40, 10);
  Mirror x40(40, DType::kBF16), y16(16, DType::kBF16);
  EXPECT_EQ(code_of([&] {
              ops::quantized_linear_cuda(x40.dev({1, 40}), f->dev, ct.q, Tensor(), y16.dev({1, 16}),
                                         Tensor(), QuantizedLinearPath::kGemv);
            }),
            ErrorCode::kUnsupported);
  // A block width that is not a multiple of 16: a 16-input chunk would span two scales.
  Format blk = quant_cases::formats()[8];
  ASSERT_EQ(blk.q.method, QuantMethod::kFp8Block);
  blk.q.block_in = 40;
  const std::unique_ptr<QWeight> b = make_weight(blk, 16, 160, 11);
  Mirror x160(160, DType::kBF16);
  EXPECT_EQ(code_of([&] {
              ops::quantized_linear_cuda(x160.dev({1, 160}), b->dev, blk.q, Tensor(),
                                         y16.dev({1, 16}), Tensor(), QuantizedLinearPath::kGemv);
            }),
            ErrorCode::kUnsupported);
  run_case(s, quantized_case(*b, {1}, 12), sum);  // kAuto: the dequantizing path
  s.sync();
}

TEST(GpuOps, QuantizedLinearBadInputsAreClearErrors) {
  TestStream s;
  quant_cases::expect_bad_inputs_rejected(
      [](const Tensor& x, const QuantizedWeight& w, const QuantConfig& q, const Tensor& out) {
        ops::quantized_linear(x, w, q, Tensor(), out);
      },
      kGpu, DType::kBF16);
  s.sync();
}

// A caller's workspace (what graph capture needs) gives the same bytes as the op's own, and one
// that is too small is a clear error.
TEST(GpuOps, QuantizedLinearWorkspace) {
  TestStream s;
  const Format gptq = quant_cases::formats()[3];
  const std::unique_ptr<QWeight> w = make_weight(gptq, 256, 4096, 11);
  for (int64_t n : {1, 5, 40}) {
    Mirror x(n * 4096, DType::kBF16), a(n * 256, DType::kBF16), b(n * 256, DType::kBF16);
    x.random(12, -1.f, 1.f);
    const int64_t bytes = ops::quantized_linear_workspace_bytes(n, w->host, DType::kBF16);
    Tensor ws = Tensor::empty({bytes}, DType::kU8, kGpu);
    ops::quantized_linear_cuda(x.dev({n, 4096}), w->dev, gptq.q, Tensor(), a.dev({n, 256}));
    ops::quantized_linear_cuda(x.dev({n, 4096}), w->dev, gptq.q, Tensor(), b.dev({n, 256}), ws);
    s.sync();
    EXPECT_EQ(a.download(), b.download()) << "n " << n;
    Tensor small = Tensor::empty({16}, DType::kU8, kGpu);
    try {
      ops::quantized_linear_cuda(x.dev({n, 4096}), w->dev, gptq.q, Tensor(), b.dev({n, 256}),
                                 small);
      ADD_FAILURE() << "a 16-byte workspace accepted at n " << n;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
}

// The last-CTA reduction of split K inside a CUDA graph: each replay leaves the tile counters at
// zero for the next (two replays in a row, two GEMVs of different tile counts in each), and its
// bits equal the second kernel's reduction (both add the slices in slice order).
TEST(GpuOps, QuantizedLinearLastCtaReduceGraphReplay) {
  using R = ops::QuantizedGemvReduce;
  TestStream s;
  uint32_t seed = 40;
  for (const Format& f : quant_cases::formats()) {
    // Shapes the GEMV takes that split in 3 (FP8: widths a multiple of 16).
    auto shapes = quant_cases::odd_shapes(f.q, false);
    if (!quant_cases::is_int4(f.q)) shapes = {{8, 16}, {136, 96}, {72, 256}};
    const std::unique_ptr<QWeight> w1 = make_weight(f, shapes[2].first, shapes[2].second, seed++);
    const std::unique_ptr<QWeight> w2 = make_weight(f, shapes[1].first, shapes[1].second, seed++);
    for (int64_t n : {1, 3}) {
      const ops::QuantizedGemvOptions last{ops::QuantizedGemvKernel::kAuto, 0, 3, R::kLastCta};
      const ops::QuantizedGemvOptions second{ops::QuantizedGemvKernel::kAuto, 0, 3, R::kKernel};
      Mirror x1(n * w1->in, DType::kBF16), x2(n * w2->in, DType::kBF16);
      x1.random(seed++, -1.f, 1.f);
      x2.random(seed++, -1.f, 1.f);
      Mirror y1(n * w1->out, DType::kBF16), y2(n * w2->out, DType::kBF16);
      const int64_t bytes = std::max(ops::quantized_linear_workspace_bytes(
                                         n, w1->host, DType::kBF16, QuantizedLinearPath::kGemv),
                                     ops::quantized_linear_workspace_bytes(
                                         n, w2->host, DType::kBF16, QuantizedLinearPath::kGemv));
      Tensor ws = Tensor::empty({bytes}, DType::kU8, kGpu);
      auto run = [&](const ops::QuantizedGemvOptions& opt) {
        ops::quantized_linear_cuda(x1.dev({n, w1->in}), w1->dev, f.q, Tensor(),
                                   y1.dev({n, w1->out}), ws, QuantizedLinearPath::kGemv, opt);
        ops::quantized_linear_cuda(x2.dev({n, w2->in}), w2->dev, f.q, Tensor(),
                                   y2.dev({n, w2->out}), ws, QuantizedLinearPath::kGemv, opt);
      };
      const std::string what = fmt::format("{} n {}", f.name, n);
      const std::string plan =
          ops::quantized_linear_cuda_plan(x1.dev({n, w1->in}), w1->dev, f.q, Tensor(),
                                          y1.dev({n, w1->out}), QuantizedLinearPath::kGemv, last);
      EXPECT_NE(plan.find("reduce last-cta"), std::string::npos) << what << ": " << plan;
      run(second);
      s.sync();
      const std::vector<uint8_t> want1 = y1.download(), want2 = y2.download();
      EXPECT_EQ(count_non_finite(y1.dev_ptr(), DType::kBF16, n, w1->out, w1->out), 0) << what;
      run(last);  // eager (and the tile counters' allocation, outside the capture)
      s.sync();
      EXPECT_EQ(y1.download(), want1) << what << " eager";
      EXPECT_EQ(y2.download(), want2) << what << " eager";
      cudaGraph_t graph = nullptr;
      LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
      run(last);
      LONGCTX_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
      cudaGraphExec_t exec = nullptr;
      LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 2; ++replay) {
        LONGCTX_CUDA_CHECK(cudaMemset(y1.dev_ptr(), 0xFF, y1.bytes()));
        LONGCTX_CUDA_CHECK(cudaMemset(y2.dev_ptr(), 0xFF, y2.bytes()));
        LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
        s.sync();
        EXPECT_EQ(y1.download(), want1) << what << " replay " << replay;
        EXPECT_EQ(y2.download(), want2) << what << " replay " << replay;
      }
      LONGCTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
      LONGCTX_CUDA_CHECK(cudaGraphDestroy(graph));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Perf mode.

struct PerfShape {
  const char* name;
  int64_t out, in;
};
const PerfShape kLlama8B[] = {{"qkv_proj", 6144, 4096},
                              {"o_proj", 4096, 4096},
                              {"gate_up_proj", 28672, 4096},
                              {"down_proj", 4096, 14336}};

// The packed tensors of a [out, in] Linear in q's format filled on the device with random bytes
// (int4 words, FP8 bytes with the NaN encodings cleared), scales in [0.001, 0.01).
struct DeviceQuantized {
  QuantizedWeight w;
  std::vector<std::shared_ptr<GuardedBuffer>> keep;
  int64_t bytes = 0;  // read per call: qweight + scales + qzeros
};

DeviceQuantized device_weight(const PerfShape& p, const QuantConfig& q, uint64_t seed) {
  DeviceQuantized d;
  const QuantizedWeight layout = quantized_layout(p.out, p.in, q, p.name);
  d.w.method = q.method;
  d.w.out_features = p.out;
  d.w.in_features = p.in;
  auto make = [&](const Tensor& t, float lo, float hi) {
    if (!t.defined()) return Tensor();
    auto buf = std::make_shared<GuardedBuffer>(t.nbytes(), 0);
    if (t.dtype() == DType::kI32 || t.dtype() == DType::kFP8E4M3)
      fill_uniform(buf->data(), int64_t(t.nbytes()), DType::kU8, seed++, 0, 0);
    else
      fill_uniform(buf->data(), t.numel(), t.dtype(), seed++, lo, hi);
    d.keep.push_back(buf);
    d.bytes += int64_t(t.nbytes());
    return Tensor::from_blob(buf->data(), t.shape(), t.dtype(), kGpu);
  };
  d.w.qweight = make(layout.qweight, 0, 0);
  d.w.scales = make(layout.scales, 0.001f, 0.01f);
  d.w.qzeros = make(layout.qzeros, 0, 0);
  if (q.method == QuantMethod::kFp8Block || q.method == QuantMethod::kCompressedFp8) {
    // 0x7f / 0xff are E4M3's NaNs: clear bit 0 of those (0x7e: 448).
    std::vector<uint8_t> h(d.w.qweight.nbytes());
    LONGCTX_CUDA_CHECK(cudaMemcpy(h.data(), d.w.qweight.data_ptr(), h.size(), cudaMemcpyDefault));
    for (uint8_t& b : h)
      if ((b & 0x7f) == 0x7f) b &= 0xfe;
    LONGCTX_CUDA_CHECK(cudaMemcpy(d.w.qweight.data_ptr(), h.data(), h.size(), cudaMemcpyDefault));
  }
  return d;
}

std::vector<Format> perf_formats() {
  std::vector<Format> v;
  for (const Format& f : quant_cases::formats())
    if (f.name == "awq g128" || f.name == "gptq v1 sym g128" || f.name == "fp8 block 128x128" ||
        f.name == "ct-fp8 channel")
      v.push_back(f);
  return v;
}

// n = 1, 4 and 8: every weight is read from HBM (copies that together exceed L2, used in turn).
TEST(GpuOpsPerf, QuantizedLinearDecodeLlama8B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  for (const PerfShape& p : kLlama8B) {
    const size_t dense_bytes = size_t(p.in * p.out) * 2;
    const int dense_copies = int(std::max<size_t>(1, (size_t(400) << 20) / dense_bytes + 1));
    GuardedBuffer dense(dense_bytes * dense_copies, 0);
    fill_uniform(dense.data(), p.in * p.out * dense_copies, DType::kBF16, 7, -0.03f, 0.03f);
    for (int64_t n : {1, 4, 8}) {
      Mirror x(n * p.in, DType::kBF16);
      x.random(8, -1.f, 1.f);
      GuardedBuffer y(size_t(n * p.out) * 2, 0);
      const Tensor xv = x.dev({n, p.in});
      const Tensor yv = Tensor::from_blob(y.data(), {n, p.out}, DType::kBF16, kGpu);
      LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
      for (ops::LinearBackend b : {ops::LinearBackend::kGemv, ops::LinearBackend::kCublasLt}) {
        int call = 0;
        auto op = [&] {
          char* w = static_cast<char*>(dense.data()) + (call++ % dense_copies) * dense_bytes;
          ops::linear_cuda(xv, Tensor::from_blob(w, {p.out, p.in}, DType::kBF16, kGpu), Tensor(),
                           yv, b);
        };
        op();
        s.sync();
        const double ms = time_ms(s, op);
        std::printf("  %-13s n=%lld out=%-6lld in=%-6lld %-18s %8.4f ms %6.0f GB/s\n", p.name,
                    (long long)n, (long long)p.out, (long long)p.in,
                    b == ops::LinearBackend::kGemv ? "bf16 gemv" : "bf16 cublaslt", ms,
                    double(dense_bytes) / (ms * 1e6));
      }
      // The schedule's choice ("auto"), then each kernel with each reduction of split K at the
      // schedule's split and (n = 1) at other targets of CTAs per SM and forced slice counts;
      // plans already timed are not timed again.
      using K = ops::QuantizedGemvKernel;
      using R = ops::QuantizedGemvReduce;
      std::vector<ops::QuantizedGemvOptions> variants{{}};
      for (K k : {K::kAuto, K::kMmaAsync, K::kMma, K::kSimt})
        for (ops::QuantizedGemvPrefetch f :
             {ops::QuantizedGemvPrefetch::kAfterWait, ops::QuantizedGemvPrefetch::kBeforeWait})
          variants.push_back({k, 0, 0, R::kAuto, f});
      for (K k : {K::kMmaAsync, K::kMma, K::kSimt})
        for (R r : {R::kLastCta, R::kKernel}) {
          variants.push_back({k, 0, 0, r});
          if (n != 1) continue;
          for (int target : {1, 2, 4, 8}) variants.push_back({k, target, 0, r});
          for (int64_t splits : {2, 4, 8, 16, 32}) variants.push_back({k, 0, splits, r});
        }
      for (const Format& f : perf_formats()) {
        std::vector<DeviceQuantized> copies;
        copies.push_back(device_weight(p, f.q, 20));
        const int count = int(std::max<int64_t>(1, (int64_t(400) << 20) / copies[0].bytes + 1));
        for (int i = 1; i < count; ++i) copies.push_back(device_weight(p, f.q, 20 + 10 * i));
        const int64_t ws_bytes = ops::quantized_linear_workspace_bytes(n, copies[0].w, DType::kBF16,
                                                                       QuantizedLinearPath::kGemv);
        Tensor ws = Tensor::empty({std::max<int64_t>(ws_bytes, 1)}, DType::kU8, kGpu);
        std::set<std::string> timed;
        for (size_t v = 0; v < variants.size(); ++v) {
          const ops::QuantizedGemvOptions& opt = variants[v];
          std::string plan;
          try {
            plan = ops::quantized_linear_cuda_plan(xv, copies[0].w, f.q, Tensor(), yv,
                                                   QuantizedLinearPath::kGemv, opt);
          } catch (const Error&) {
            continue;  // a forced kernel that does not take the format
          }
          if (!plan.starts_with("gemv") || (v > 0 && !timed.insert(plan).second)) continue;
          int call = 0;
          auto op = [&] {
            ops::quantized_linear_cuda(xv, copies[call++ % count].w, f.q, Tensor(), yv, ws,
                                       QuantizedLinearPath::kGemv, opt);
          };
          op();
          s.sync();
          const double ms = time_ms(s, op);
          std::printf("  %-13s n=%lld out=%-6lld in=%-6lld %-18s %8.4f ms %6.0f GB/s  [%s%s]%s\n",
                      p.name, (long long)n, (long long)p.out, (long long)p.in, f.name.c_str(), ms,
                      double(copies[0].bytes) / (ms * 1e6), plan.c_str(),
                      opt.ctas_per_sm ? fmt::format(", target {}/SM", opt.ctas_per_sm).c_str() : "",
                      v == 0 ? " auto" : "");
          std::fflush(stdout);
          EXPECT_EQ(count_non_finite(y.data(), DType::kBF16, n, p.out, p.out), 0)
              << p.name << " " << f.name << " n " << n << " " << plan;
        }
      }
    }
  }
}

// The prefill path: dequantize into the scratch + cuBLASLt, against cuBLASLt on a bf16 weight of
// the same shape; the difference is the dequantizing kernel's time.
TEST(GpuOpsPerf, QuantizedLinearPrefillLlama8B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  for (const PerfShape& p : kLlama8B) {
    GuardedBuffer dense(size_t(p.in * p.out) * 2, 0);
    fill_uniform(dense.data(), p.in * p.out, DType::kBF16, 9, -0.03f, 0.03f);
    const Tensor dv = Tensor::from_blob(dense.data(), {p.out, p.in}, DType::kBF16, kGpu);
    for (int64_t n : {512, 4096}) {
      GuardedBuffer x(size_t(n * p.in) * 2, 0), y(size_t(n * p.out) * 2, 0);
      fill_uniform(x.data(), n * p.in, DType::kBF16, 10, -1.f, 1.f);
      const Tensor xv = Tensor::from_blob(x.data(), {n, p.in}, DType::kBF16, kGpu);
      const Tensor yv = Tensor::from_blob(y.data(), {n, p.out}, DType::kBF16, kGpu);
      LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
      auto gemm = [&] { ops::linear_cuda(xv, dv, Tensor(), yv); };
      gemm();
      s.sync();
      const double gemm_ms = time_ms(s, gemm);
      std::printf("  %-13s n=%-5lld out=%-6lld in=%-6lld %-18s %8.4f ms\n", p.name, (long long)n,
                  (long long)p.out, (long long)p.in, "bf16 gemm", gemm_ms);
      for (const Format& f : perf_formats()) {
        DeviceQuantized w = device_weight(p, f.q, 30);
        const int64_t ws_bytes = ops::quantized_linear_workspace_bytes(
            n, w.w, DType::kBF16, QuantizedLinearPath::kDequantGemm);
        Tensor ws = Tensor::empty({ws_bytes}, DType::kU8, kGpu);
        auto op = [&] {
          ops::quantized_linear_cuda(xv, w.w, f.q, Tensor(), yv, ws,
                                     QuantizedLinearPath::kDequantGemm);
        };
        op();
        s.sync();
        const double ms = time_ms(s, op);
        std::printf(
            "  %-13s n=%-5lld out=%-6lld in=%-6lld %-18s %8.4f ms (dequant %.4f ms = %.0f%% of "
            "the GEMM; scratch %.1f MiB)\n",
            p.name, (long long)n, (long long)p.out, (long long)p.in, f.name.c_str(), ms,
            ms - gemm_ms, 100 * (ms - gemm_ms) / gemm_ms, double(ws_bytes) / (1 << 20));
        std::fflush(stdout);
        EXPECT_EQ(count_non_finite(y.data(), DType::kBF16, n, p.out, p.out), 0)
            << p.name << " " << f.name << " n " << n;
      }
    }
  }
}

// W8A8 at Llama-3.1-8B's layer shapes, n = 4096 and 16384: cuBLASLt on a bf16 weight, the
// dequantizing path (W8A16) and W8A8 (activation quantization included) for the FP8 block format,
// W8A8 for compressed-tensors FP8 per channel; TFLOP/s of 2 n in out.
TEST(GpuOpsPerf, QuantizedLinearW8a8Llama8B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  for (const PerfShape& p : kLlama8B) {
    GuardedBuffer dense(size_t(p.in * p.out) * 2, 0);
    fill_uniform(dense.data(), p.in * p.out, DType::kBF16, 9, -0.03f, 0.03f);
    const Tensor dv = Tensor::from_blob(dense.data(), {p.out, p.in}, DType::kBF16, kGpu);
    for (int64_t n : {4096, 16384}) {
      GuardedBuffer x(size_t(n * p.in) * 2, 0), y(size_t(n * p.out) * 2, 0);
      fill_uniform(x.data(), n * p.in, DType::kBF16, 10, -1.f, 1.f);
      const Tensor xv = Tensor::from_blob(x.data(), {n, p.in}, DType::kBF16, kGpu);
      const Tensor yv = Tensor::from_blob(y.data(), {n, p.out}, DType::kBF16, kGpu);
      const double flops = 2.0 * double(n) * double(p.in) * double(p.out);
      auto report = [&](const char* what, double ms, const std::string& plan) {
        std::printf("  %-13s n=%-5lld out=%-6lld in=%-6lld %-24s %8.4f ms %7.1f TFLOP/s  [%s]\n",
                    p.name, (long long)n, (long long)p.out, (long long)p.in, what, ms,
                    flops / (ms * 1e9), plan.c_str());
        std::fflush(stdout);
      };
      LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
      auto gemm = [&] { ops::linear_cuda(xv, dv, Tensor(), yv); };
      gemm();
      s.sync();
      report("bf16 cublaslt", time_ms(s, gemm), ops::linear_cuda_plan(xv, dv, Tensor(), yv));
      for (const Format& f : perf_formats()) {
        if (f.q.method != QuantMethod::kFp8Block && f.q.method != QuantMethod::kCompressedFp8)
          continue;
        DeviceQuantized w = device_weight(p, f.q, 30);
        for (QuantizedLinearPath path :
             {QuantizedLinearPath::kDequantGemm, QuantizedLinearPath::kW8a8}) {
          if (path == QuantizedLinearPath::kDequantGemm && f.q.method != QuantMethod::kFp8Block)
            continue;
          const int64_t ws_bytes =
              ops::quantized_linear_workspace_bytes(n, w.w, DType::kBF16, path);
          Tensor ws = Tensor::empty({ws_bytes}, DType::kU8, kGpu);
          auto op = [&] { ops::quantized_linear_cuda(xv, w.w, f.q, Tensor(), yv, ws, path); };
          try {
            op();
            s.sync();
          } catch (const Error& e) {
            std::printf("  %-13s n=%-5lld %s %s: %s\n", p.name, (long long)n, f.name.c_str(),
                        path_name(path), e.what());
            continue;
          }
          const std::string what = f.name + " " + path_name(path);
          report(what.c_str(), time_ms(s, op),
                 ops::quantized_linear_cuda_plan(xv, w.w, f.q, Tensor(), yv, path));
          EXPECT_EQ(count_non_finite(y.data(), DType::kBF16, n, p.out, p.out), 0)
              << p.name << " " << what << " n " << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace longctx::gpu_ops_test
