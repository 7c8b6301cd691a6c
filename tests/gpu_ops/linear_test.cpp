// CUDA linear (cuBLASLt GEMM and the decode GEMV) against the CPU twin (fp32 x = the same bf16
// values, sequential fp32 sums), n in {1, 7, 128, 4096} x (in, out) in {(4096, 6144),
// (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256) f32 out, (128, 80)}, plus biases
// (epilogue and separate add), strided x / out rows, both backends at n = 1 and 7, f16 and f32
// operands, and sizes that are not multiples of 8.
//
// The CPU reference covers sampled rows (first, last, evenly spaced; all when n <= 8) x all
// columns, and all rows x sampled columns (first, last, evenly spaced); the NaN/Inf check runs
// over the whole output on the device, and the sampled rows' padding must keep its NaN bytes.
// Tolerance per element, with S = sum_k |x_k w_k| + |bias| (the CPU twin on |x|, |w|):
//   |got - ref| <= S * 2^-24 * (in / 4 + 16)   fp32 accumulation in different orders (tensor
//                                               cores may truncate partial sums); one product
//                                               left out would cost ~S / in, 4x more;
//              + 1 ulp(|ref| + |bias|) of out's dtype for a 16-bit out (its rounding; twice
//                with a separate bias add).
//
// Perf mode (LONGCTX_PERF=1): Llama-3.1-8B's GEMMs at n = 1 (GB/s of weight read, GEMV and
// cuBLASLt, weights rotated through copies larger than L2 so every call reads HBM), 4, 512,
// 8192, 32768 (TFLOP/s).
#include "ops/linear.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "gpu_ops/gpu_ops_util.h"
#include "kernels/cuda/pdl.h"
#include "ops/cast.h"

namespace longctx::gpu_ops_test {
namespace {

using ops::LinearBackend;

const char* backend_name(LinearBackend b) {
  return b == LinearBackend::kGemv ? "gemv" : b == LinearBackend::kCublasLt ? "cublaslt" : "auto";
}

// A CPU copy of x or weight converted to f32 (the CPU twin's x), optionally |.|.
Tensor to_f32(const Tensor& t, bool absolute) {
  Tensor f = t.to_dtype(DType::kF32);
  if (absolute)
    for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = std::abs(f.data<float>()[i]);
  return f;
}

// |t| for a float CPU tensor of any float dtype, same dtype.
Tensor abs_copy(const Tensor& t) {
  Tensor a = t.contiguous().to(Device::cpu());
  if (a.dtype() == DType::kF32) return to_f32(a, true);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<uint16_t>()[i] &= 0x7fff;
  return a;
}

// One weight (and its |w|) shared by the cases of a shape.
struct Weight {
  int64_t in, out;
  DType dtype;
  std::shared_ptr<Mirror> m;
  Tensor host_abs;  // [out, in]
  Weight(int64_t in_, int64_t out_, DType dt, uint64_t seed) : in(in_), out(out_), dtype(dt) {
    m = std::make_shared<Mirror>(in * out, dt);
    const float a = 2.0f / std::sqrt(float(in));
    m->random(seed, -a, a);
    host_abs = abs_copy(m->host({out, in}));
  }
};

struct LinearCase {
  int64_t n;
  DType out_dtype = DType::kBF16;
  DType bias_dtype = DType::kU8;   // kU8: no bias
  int64_t x_pad = 0, out_pad = 0;  // extra row elements (strided rows)
  LinearBackend backend = LinearBackend::kAuto;
};

std::vector<int64_t> sample(int64_t count, int64_t want) {
  std::set<int64_t> s;
  if (count <= want) {
    for (int64_t i = 0; i < count; ++i) s.insert(i);
  } else {
    for (int64_t i = 0; i < want; ++i) s.insert(i * (count - 1) / (want - 1));
    s.insert(count / 2 + 1);
  }
  return {s.begin(), s.end()};
}

CaseSpec linear_case(const Weight& w, const LinearCase& lc, uint64_t seed) {
  const int64_t n = lc.n, in = w.in, out = w.out;
  const int64_t ldx = in + lc.x_pad, ldo = out + lc.out_pad;
  const DType xdt = w.dtype, odt = lc.out_dtype;
  auto x = std::make_shared<Mirror>(n * ldx, xdt);
  x->random(seed, -1.f, 1.f);
  std::shared_ptr<Mirror> bias;
  if (lc.bias_dtype != DType::kU8) {
    bias = std::make_shared<Mirror>(out, lc.bias_dtype);
    bias->random(seed + 1, -0.5f, 0.5f);
  }
  auto y = std::make_shared<GuardedBuffer>(size_t(n * ldo) * dtype_size(odt), 0xFF);
  auto wm = w.m;
  CaseSpec c;
  c.name =
      fmt::format("linear(n={} in={} out={} {}->{}{}{}{} {})", n, in, out, dtype_name(xdt),
                  dtype_name(odt), bias ? fmt::format(" bias {}", dtype_name(lc.bias_dtype)) : "",
                  lc.x_pad ? fmt::format(" ldx={}", ldx) : "",
                  lc.out_pad ? fmt::format(" ldo={}", ldo) : "", backend_name(lc.backend));
  auto xv = [=](bool dev) { return dev ? x->dev({n, in}, {ldx, 1}) : x->host({n, in}, {ldx, 1}); };
  c.gpu = [=] {
    Tensor yv = Tensor::from_blob(y->data(), {n, out}, odt, kGpu, nullptr, {ldo, 1});
    ops::linear_cuda(xv(true), wm->dev({out, in}), bias ? bias->dev({out}) : Tensor(), yv,
                     lc.backend);
  };
  const Weight* wp = &w;
  c.check = [=] {
    Comparison cmp;
    cmp.guards_ok = y->guards_intact();
    const int64_t nf = count_non_finite(y->data(), odt, n, out, ldo);
    cmp.non_finite = nf;
    if (nf) {
      cmp.bad = nf;
      cmp.first_bad = fmt::format("{} NaN/Inf outputs", nf);
    }
    const std::vector<int64_t> rows = sample(n, 8), cols = sample(out, 16);
    const size_t es = dtype_size(odt);
    auto got_at = [&](const uint8_t* p) { return element_value(p, odt); };
    Tensor bias_h = bias ? bias->host({out}) : Tensor();
    Tensor bias_abs = bias ? abs_copy(bias_h) : Tensor();
    Tensor x_all = to_f32(xv(false), false), x_abs = to_f32(xv(false), true);
    auto check = [&](double got, double ref, double s, double b) {
      double allowed = s * std::ldexp(1.0, -24) * (double(in) / 4 + 16);
      if (odt != DType::kF32) allowed += ulp_of(std::abs(ref) + std::abs(b), odt);
      const double err = std::abs(got - ref);
      ++cmp.compared;
      if (got != ref) ++cmp.differ;
      if (std::isfinite(err)) {
        cmp.max_err = std::max(cmp.max_err, err);
        cmp.max_ratio = std::max(cmp.max_ratio, err / allowed);
      }
      if (!(err <= allowed) && cmp.bad++ == 0)
        cmp.first_bad = fmt::format("got {:.9g}, want {:.9g} (allowed {:.3g})", got, ref, allowed);
    };
    // Sampled rows x all columns (and the rows' padding).
    {
      const int64_t r = int64_t(rows.size());
      Tensor xr = Tensor::empty({r, in}, DType::kF32), xra = Tensor::empty({r, in}, DType::kF32);
      for (int64_t i = 0; i < r; ++i) {
        std::memcpy(xr.data<float>() + i * in, x_all.data<float>() + rows[i] * in, in * 4);
        std::memcpy(xra.data<float>() + i * in, x_abs.data<float>() + rows[i] * in, in * 4);
      }
      Tensor ref = Tensor::empty({r, out}, DType::kF32),
             sabs = Tensor::empty({r, out}, DType::kF32);
      ops::linear_cpu(xr, wm->host({out, in}), bias_h, ref);
      ops::linear_cpu(xra, wp->host_abs, bias_abs, sabs);
      std::vector<uint8_t> row(size_t(ldo) * es);
      for (int64_t i = 0; i < r; ++i) {
        LONGCTX_CUDA_CHECK(cudaMemcpy(row.data(),
                                      static_cast<uint8_t*>(y->data()) + rows[i] * ldo * es,
                                      row.size(), cudaMemcpyDeviceToHost));
        for (int64_t j = 0; j < out; ++j)
          check(got_at(row.data() + j * es), ref.data<float>()[i * out + j],
                sabs.data<float>()[i * out + j],
                bias ? element_value(static_cast<const uint8_t*>(bias_h.data_ptr()) +
                                         j * dtype_size(lc.bias_dtype),
                                     lc.bias_dtype)
                     : 0.0);
        for (size_t b = size_t(out) * es; b < row.size(); ++b)
          if (row[b] != 0xFF && cmp.bad++ == 0)
            cmp.first_bad = fmt::format("row {} padding overwritten", rows[i]);
      }
    }
    // All rows x sampled columns.
    {
      const int64_t k = int64_t(cols.size());
      const size_t wes = dtype_size(w.dtype);
      Tensor wc = Tensor::empty({k, in}, w.dtype), wca = Tensor::empty({k, in}, w.dtype);
      Tensor bc, bca;
      if (bias) {
        bc = Tensor::empty({k}, lc.bias_dtype);
        bca = Tensor::empty({k}, lc.bias_dtype);
      }
      const size_t bes = bias ? dtype_size(lc.bias_dtype) : 0;
      for (int64_t j = 0; j < k; ++j) {
        std::memcpy(static_cast<char*>(wc.data_ptr()) + j * in * wes,
                    wm->host_bytes() + cols[j] * in * wes, in * wes);
        std::memcpy(static_cast<char*>(wca.data_ptr()) + j * in * wes,
                    static_cast<const char*>(wp->host_abs.data_ptr()) + cols[j] * in * wes,
                    in * wes);
        if (bias) {
          std::memcpy(static_cast<char*>(bc.data_ptr()) + j * bes,
                      static_cast<const char*>(bias_h.data_ptr()) + cols[j] * bes, bes);
          std::memcpy(static_cast<char*>(bca.data_ptr()) + j * bes,
                      static_cast<const char*>(bias_abs.data_ptr()) + cols[j] * bes, bes);
        }
      }
      Tensor ref = Tensor::empty({n, k}, DType::kF32), sabs = Tensor::empty({n, k}, DType::kF32);
      ops::linear_cpu(x_all, wc, bc, ref);
      ops::linear_cpu(x_abs, wca, bca, sabs);
      std::vector<uint8_t> col(size_t(n) * es);
      for (int64_t j = 0; j < k; ++j) {
        LONGCTX_CUDA_CHECK(cudaMemcpy2D(col.data(), es,
                                        static_cast<uint8_t*>(y->data()) + cols[j] * es, ldo * es,
                                        es, n, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; ++i)
          check(got_at(col.data() + i * es), ref.data<float>()[i * k + j],
                sabs.data<float>()[i * k + j],
                bias ? element_value(static_cast<const uint8_t*>(bc.data_ptr()) + j * bes,
                                     lc.bias_dtype)
                     : 0.0);
      }
    }
    return cmp;
  };
  c.flops = 2.0 * double(n) * double(in) * double(out);
  return c;
}

void run_shape(const TestStream& s, Summary& sum, int64_t in, int64_t out, DType wdt,
               const std::vector<LinearCase>& cases, uint64_t seed) {
  std::unique_ptr<Weight> w;
  try {
    w = std::make_unique<Weight>(in, out, wdt, seed);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "weight " << in << "x" << out << ": " << e.what();
    return;
  }
  for (size_t i = 0; i < cases.size(); ++i)
    run_case(s, linear_case(*w, cases[i], seed + 10 + i), sum);
}

// The task's matrix: n in {1, 7, 128, 4096} per shape; at n = 1 and 7 both backends.
std::vector<LinearCase> matrix(DType out_dtype, bool small) {
  std::vector<LinearCase> v;
  for (int64_t n : small ? std::vector<int64_t>{1, 7} : std::vector<int64_t>{1, 7, 128, 4096}) {
    v.push_back({n, out_dtype});
    if (n == 1) v.push_back({n, out_dtype, DType::kU8, 0, 0, LinearBackend::kCublasLt});
    if (n == 7) v.push_back({n, out_dtype, DType::kU8, 0, 0, LinearBackend::kGemv});
  }
  return v;
}

TEST(GpuOps, LinearLlamaShapes) {
  TestStream s;
  Summary sum;
  run_shape(s, sum, 4096, 6144, DType::kBF16, matrix(DType::kBF16, false), 1);
  run_shape(s, sum, 4096, 4096, DType::kBF16, matrix(DType::kBF16, false), 2);
  run_shape(s, sum, 4096, 28672, DType::kBF16, matrix(DType::kBF16, false), 3);
  run_shape(s, sum, 14336, 4096, DType::kBF16, matrix(DType::kBF16, false), 4);
  run_shape(s, sum, 4096, 128256, DType::kBF16, matrix(DType::kF32, false), 5);
  run_shape(s, sum, 128, 80, DType::kBF16, matrix(DType::kBF16, false), 6);
}

// Qwen2's fused qkv bias (epilogue when bias and out share a dtype, else a separate add),
// strided x (down_proj reading the gate half of [n, 2I]) and strided out.
std::vector<LinearCase> variants(bool small) {
  using B = LinearBackend;
  const DType bf = DType::kBF16, f32 = DType::kF32, none = DType::kU8;
  std::vector<LinearCase> v = {
      {1, bf, bf, 0, 0, B::kAuto},      {7, bf, bf, 0, 0, B::kAuto},
      {1, bf, bf, 0, 0, B::kCublasLt},  {3, bf, f32, 0, 0, B::kAuto},
      {7, bf, f32, 0, 0, B::kAuto},     {7, f32, bf, 0, 0, B::kAuto},
      {5, f32, f32, 0, 0, B::kAuto},    {1, bf, none, 1024, 0, B::kAuto},
      {7, bf, none, 1024, 0, B::kAuto}, {4, bf, bf, 1024, 8, B::kGemv},
      {7, f32, none, 0, 24, B::kAuto},
  };
  if (!small) {
    v.push_back({128, bf, bf, 0, 0, B::kAuto});
    v.push_back({1000, bf, f32, 1024, 16, B::kAuto});
  }
  return v;
}

TEST(GpuOps, LinearBiasAndStrides) {
  TestStream s;
  Summary sum;
  run_shape(s, sum, 1024, 1536, DType::kBF16, variants(false), 20);
}

// f16 and f32 operands; sizes that are not multiples of 8 (cuBLASLt at the operands' real
// alignment, or a clear kUnsupported).
TEST(GpuOps, LinearOtherDtypesAndOddSizes) {
  TestStream s;
  Summary sum;
  const DType f16 = DType::kF16, f32 = DType::kF32, none = DType::kU8;
  run_shape(s, sum, 4096, 4096, f16,
            {{1, f16}, {7, f16}, {128, f32, f16}, {4, f32, none, 0, 0, LinearBackend::kGemv}}, 30);
  run_shape(s, sum, 512, 384, f32, {{1, f32}, {7, f32, f32}, {300, f32, none, 8, 8}}, 31);
  run_shape(s, sum, 61, 37, DType::kBF16,
            {{1, DType::kBF16}, {5, f32, DType::kBF16}, {100, DType::kBF16}}, 32);
  run_shape(s, sum, 100, 33, DType::kBF16, {{1, f32}, {9, DType::kBF16, DType::kBF16}}, 33);
}

TEST(GpuOpsSmall, Linear) {
  TestStream s;
  Summary sum;
  run_shape(s, sum, 128, 80, DType::kBF16, matrix(DType::kBF16, true), 6);
  run_shape(s, sum, 1024, 512, DType::kBF16, variants(true), 20);
  run_shape(s, sum, 61, 37, DType::kBF16, {{1, DType::kBF16}, {5, DType::kF32, DType::kBF16}}, 32);
  run_shape(s, sum, 256, 96, DType::kF16, {{1, DType::kF16}, {7, DType::kF32}}, 34);
}

TEST(GpuOps, LinearRunsOnTheCurrentStream) {
  TestStream s;
  for (LinearBackend b : {LinearBackend::kGemv, LinearBackend::kCublasLt}) {
    const int64_t n = 2, in = 512, out = 256;
    Weight w(in, out, DType::kBF16, 40);
    Mirror x(n * in, DType::kBF16), late(n * in, DType::kBF16);
    x.random(41, -1.f, 1.f);
    GuardedBuffer y(size_t(n * out) * 4, 0xFF);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    launch_spin(s.get(), 20'000'000);
    LONGCTX_CUDA_CHECK(
        cudaMemcpyAsync(late.dev_ptr(), x.dev_ptr(), x.bytes(), cudaMemcpyDeviceToDevice, s.get()));
    ops::linear_cuda(late.dev({n, in}), w.m->dev({out, in}), Tensor(),
                     Tensor::from_blob(y.data(), {n, out}, DType::kF32, kGpu), b);
    s.sync();
    EXPECT_EQ(count_non_finite(y.data(), DType::kF32, n, out, out), 0) << backend_name(b);
  }
}

// Programmatic dependent launch (kernels/cuda/pdl.cuh): the GEMV may start before the kernel
// ahead of it ends. It must still see that kernel's writes and the one's before, x and its
// weights alike: two casts write x and then W right before it
// (both NaN until then), behind a spin that keeps them queued. Eagerly and in a CUDA graph, the
// output must equal, bit for bit, the GEMV run after a synchronize.
TEST(GpuOps, DependentLaunchesSeeTheKernelsBefore) {
  TestStream s;
  int major = 0;
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major >= 9)
    EXPECT_TRUE(kernels::cuda::pdl_enabled()) << "sm_90+ launches with PDL by default";
  const int64_t in = 4096, out = 4096;
  Mirror x32(in, DType::kF32), w32(out * in, DType::kF32);
  x32.random(60, -1.f, 1.f);
  w32.random(61, -0.05f, 0.05f);
  Mirror x(in, DType::kBF16), w(out * in, DType::kBF16), ref(out, DType::kF32),
      got(out, DType::kF32);
  auto produce_and_multiply = [&](const Mirror& y) {
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(x.dev_ptr(), 0xFF, x.bytes(), s.get()));
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(w.dev_ptr(), 0xFF, w.bytes(), s.get()));
    launch_spin(s.get(), 1'000'000);
    ops::cast(x32.dev({1, in}), x.dev({1, in}));
    ops::cast(w32.dev({out, in}), w.dev({out, in}));
    ops::linear_cuda(x.dev({1, in}), w.dev({out, in}), Tensor(), y.dev({1, out}),
                     LinearBackend::kGemv);
  };
  ops::cast(x32.dev({1, in}), x.dev({1, in}));
  ops::cast(w32.dev({out, in}), w.dev({out, in}));
  s.sync();
  ops::linear_cuda(x.dev({1, in}), w.dev({out, in}), Tensor(), ref.dev({1, out}),
                   LinearBackend::kGemv);
  s.sync();
  const std::vector<uint8_t> want = ref.download();
  ASSERT_EQ(count_non_finite(ref.dev_ptr(), DType::kF32, 1, out, out), 0);

  produce_and_multiply(got);
  s.sync();
  EXPECT_EQ(got.download(), want) << "eager";

  LONGCTX_CUDA_CHECK(cudaMemset(got.dev_ptr(), 0xFF, got.bytes()));
  cudaGraph_t graph = nullptr;
  LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  produce_and_multiply(got);
  LONGCTX_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
    s.sync();
    EXPECT_EQ(got.download(), want) << "graph replay " << replay;
  }
  LONGCTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LONGCTX_CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST(GpuOps, LinearClearErrors) {
  TestStream s;
  Weight w(64, 32, DType::kBF16, 50);
  Mirror x(4 * 64, DType::kBF16), xf(4 * 64, DType::kF32), y(4 * 32, DType::kBF16);
  auto code_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  // f32 x with a bf16 weight; f16 out with bf16 x; wrong out shape; GEMV forced at n = 9.
  EXPECT_EQ(code_of([&] {
              ops::linear(xf.dev({4, 64}), w.m->dev({32, 64}), Tensor(), y.dev({4, 32}));
            }),
            ErrorCode::kUnsupported);
  Mirror yh(4 * 32, DType::kF16);
  EXPECT_EQ(code_of([&] {
              ops::linear(x.dev({4, 64}), w.m->dev({32, 64}), Tensor(), yh.dev({4, 32}));
            }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([&] {
              ops::linear(x.dev({4, 64}), w.m->dev({32, 64}), Tensor(), y.dev({4, 16}, {32, 1}));
            }),
            ErrorCode::kInvalidArgument);
  Mirror x9(9 * 64, DType::kBF16), y9(9 * 32, DType::kBF16);
  EXPECT_EQ(code_of([&] {
              ops::linear_cuda(x9.dev({9, 64}), w.m->dev({32, 64}), Tensor(), y9.dev({9, 32}),
                               LinearBackend::kGemv);
            }),
            ErrorCode::kUnsupported);
  s.sync();
}

// ---------------------------------------------------------------------------------------------
// Perf mode.

struct PerfShape {
  const char* name;
  int64_t in, out;
  DType out_dtype;
};
const PerfShape kLlama8B[] = {{"qkv_proj", 4096, 6144, DType::kBF16},
                              {"o_proj", 4096, 4096, DType::kBF16},
                              {"gate_up_proj", 4096, 28672, DType::kBF16},
                              {"down_proj", 14336, 4096, DType::kBF16},
                              {"lm_head", 4096, 128256, DType::kF32}};

// n = 1 and 4: the weight is read once per call, from copies that together exceed L2 (50 MB on
// an H200), so the GB/s are HBM's.
TEST(GpuOpsPerf, LinearDecodeLlama8B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  for (const PerfShape& p : kLlama8B) {
    const size_t wbytes = size_t(p.in * p.out) * 2;
    const int copies = int(std::max<size_t>(1, (size_t(400) << 20) / wbytes + 1));
    GuardedBuffer ws(wbytes * copies, 0);
    fill_uniform(ws.data(), p.in * p.out * copies, DType::kBF16, 7, -0.03f, 0.03f);
    for (int64_t n : {1, 4}) {
      Mirror x(n * p.in, DType::kBF16);
      x.random(8, -1.f, 1.f);
      GuardedBuffer y(size_t(n * p.out) * dtype_size(p.out_dtype), 0);
      LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
      for (LinearBackend b : {LinearBackend::kGemv, LinearBackend::kCublasLt}) {
        int call = 0;
        auto op = [&] {
          const char* w = static_cast<const char*>(ws.data()) + (call++ % copies) * wbytes;
          ops::linear_cuda(
              x.dev({n, p.in}),
              Tensor::from_blob(const_cast<char*>(w), {p.out, p.in}, DType::kBF16, kGpu), Tensor(),
              Tensor::from_blob(y.data(), {n, p.out}, p.out_dtype, kGpu), b);
        };
        op();
        s.sync();
        const double ms = time_ms(s, op);
        const std::string plan = ops::linear_cuda_plan(
            x.dev({n, p.in}), Tensor::from_blob(ws.data(), {p.out, p.in}, DType::kBF16, kGpu),
            Tensor(), Tensor::from_blob(y.data(), {n, p.out}, p.out_dtype, kGpu), b);
        std::printf(
            "  %-14s n=%-5lld in=%-6lld out=%-7lld %-9s %9.4f ms %7.0f GB/s weight read  [%s]\n",
            p.name, (long long)n, (long long)p.in, (long long)p.out, backend_name(b), ms,
            double(wbytes) / (ms * 1e6), plan.c_str());
        std::fflush(stdout);
      }
    }
  }
}

TEST(GpuOpsPerf, LinearPrefillLlama8B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  for (const PerfShape& p : kLlama8B) {
    GuardedBuffer w(size_t(p.in * p.out) * 2, 0);
    fill_uniform(w.data(), p.in * p.out, DType::kBF16, 9, -0.03f, 0.03f);
    for (int64_t n : {512, 8192, 32768}) {
      GuardedBuffer x(size_t(n * p.in) * 2, 0);
      fill_uniform(x.data(), n * p.in, DType::kBF16, 10, -1.f, 1.f);
      GuardedBuffer y(size_t(n * p.out) * dtype_size(p.out_dtype), 0);
      LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
      auto op = [&] {
        ops::linear(Tensor::from_blob(x.data(), {n, p.in}, DType::kBF16, kGpu),
                    Tensor::from_blob(w.data(), {p.out, p.in}, DType::kBF16, kGpu), Tensor(),
                    Tensor::from_blob(y.data(), {n, p.out}, p.out_dtype, kGpu));
      };
      op();
      s.sync();
      const double ms = time_ms(s, op);
      const std::string plan = ops::linear_cuda_plan(
          Tensor::from_blob(x.data(), {n, p.in}, DType::kBF16, kGpu),
          Tensor::from_blob(w.data(), {p.out, p.in}, DType::kBF16, kGpu), Tensor(),
          Tensor::from_blob(y.data(), {n, p.out}, p.out_dtype, kGpu));
      std::printf("  %-14s n=%-5lld in=%-6lld out=%-7lld -> %-4s %9.3f ms %7.1f TFLOP/s  [%s]\n",
                  p.name, (long long)n, (long long)p.in, (long long)p.out,
                  dtype_name(p.out_dtype).data(), ms, 2.0 * n * p.in * p.out / (ms * 1e9),
                  plan.c_str());
      std::fflush(stdout);
      EXPECT_EQ(count_non_finite(y.data(), p.out_dtype, n, p.out, p.out), 0) << p.name << " " << n;
    }
  }
}

}  // namespace
}  // namespace longctx::gpu_ops_test
