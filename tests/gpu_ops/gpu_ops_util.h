// The op-test harness of the CUDA op twins, on top of gpu_kernels/harness.h (GuardedBuffer,
// perf_mode). Every buffer is a Mirror: a guarded device buffer pre-filled with NaN bytes (0xFF)
// and a host copy of the same bytes. A case runs the CUDA op on views of the device copy and
// the CPU twin on the same views (shape, strides, offset) of the host copy, then compares the
// whole buffers element by element: bytes that agree pass (untouched padding, exact results),
// anything else must be finite on both sides and within the case's written tolerance. So a
// write outside a view, a skipped row (NaN left behind), a NaN/Inf, or a guard-byte overwrite
// fails the case. A twin that refuses a shape with Error(kUnsupported) is reported as
// UNSUPPORTED, not failed. LONGCTX_PERF=1 also times each case (CUDA events, the op's own call
// through ops::, i.e. including host-side argument checks) and prints GB/s or TFLOP/s.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_stream.h"
#include "gpu_kernels/harness.h"
#include "gpu_ops/device_fill.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"

namespace longctx::gpu_ops_test {

using gpu_test::GuardedBuffer;
using gpu_test::perf_mode;

inline const Device kGpu = Device::cuda(0);

// The stream every op of a test launches on (made current with a StreamGuard, so the ops must
// honour current_stream()).
class TestStream {
 public:
  TestStream() : stream_(kGpu), guard_(stream_) {}
  cudaStream_t get() const { return cuda_handle(stream_); }
  void sync() const { stream_.synchronize(); }

 private:
  Stream stream_;
  StreamGuard guard_;
};

class Mirror {
 public:
  Mirror(int64_t elems, DType dtype)
      : elems_(elems),
        dtype_(dtype),
        dev_(std::max<size_t>(bytes(), 1), 0xFF),
        host_(std::max<size_t>(bytes(), 1), 0xFF) {}

  // Uniform random values in [lo, hi) made on the device, copied to the host.
  Mirror& random(uint64_t seed, float lo, float hi) {
    fill_uniform(dev_.data(), elems_, dtype_, seed, lo, hi);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    dev_.download(host_.data());
    return *this;
  }
  Mirror& set(const void* src) {
    std::memcpy(host_.data(), src, bytes());
    dev_.upload(src);
    return *this;
  }

  Tensor dev(const Shape& shape, const Shape& strides = {}, int64_t offset = 0) const {
    return view(dev_.data(), kGpu, shape, strides, offset);
  }
  Tensor host(const Shape& shape, const Shape& strides = {}, int64_t offset = 0) const {
    return view(const_cast<uint8_t*>(host_.data()), Device::cpu(), shape, strides, offset);
  }

  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(bytes());
    if (!v.empty()) dev_.download(v.data());
    return v;
  }
  bool guards_intact() const { return dev_.guards_intact(); }
  DType dtype() const { return dtype_; }
  int64_t elems() const { return elems_; }
  size_t bytes() const { return size_t(elems_) * dtype_size(dtype_); }
  const uint8_t* host_bytes() const { return host_.data(); }
  uint8_t* host_bytes() { return host_.data(); }
  void* dev_ptr() const { return dev_.data(); }

 private:
  Tensor view(void* base, Device d, const Shape& shape, const Shape& strides,
              int64_t offset) const {
    Shape st = strides.empty() ? contiguous_strides(shape) : strides;
    int64_t last = offset;
    for (size_t i = 0; i < shape.size(); ++i) last += (shape[i] - 1) * st[i];
    LONGCTX_ASSERT(shape_numel(shape) == 0 || last < elems_, "view past the mirror's end");
    return Tensor::from_blob(static_cast<char*>(base) + offset * int64_t(dtype_size(dtype_)), shape,
                             dtype_, d, nullptr, st);
  }

  int64_t elems_;
  DType dtype_;
  GuardedBuffer dev_;
  std::vector<uint8_t> host_;
};

// Allowed |got - ref| = abs + rel * |ref| + ulps * ulp(ref) in the buffer's dtype.
struct Tol {
  double abs = 0, rel = 0, ulps = 0;
};

inline double ulp_of(double v, DType dt) {
  const int mant = dt == DType::kF32 ? 23 : dt == DType::kBF16 ? 7 : 10;
  const int min_exp = dt == DType::kF16 ? -14 : -126;
  int e = 0;
  std::frexp(std::abs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mant);
}

inline double element_value(const uint8_t* p, DType dt) {
  uint16_t h;
  float f;
  switch (dt) {
    case DType::kF32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    case DType::kF16:
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    default:
      return NAN;  // integer dtypes compare by bytes only
  }
}

struct Comparison {
  int64_t compared = 0, differ = 0, bad = 0, non_finite = 0;
  double max_err = 0, max_ratio = 0;  // largest |got - ref| and |got - ref| / allowed
  std::string first_bad;
  bool guards_ok = true;
  bool ok() const { return bad == 0 && guards_ok; }
  std::string str() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "max|d| %.3g (%.2f of tol), %lld/%lld differ%s%s", max_err,
                  max_ratio, (long long)differ, (long long)compared, guards_ok ? "" : ", GUARDS",
                  bad ? (", BAD: " + first_bad).c_str() : "");
    return buf;
  }
};

// Device bytes `got` against the host mirror (the CPU twin's result), element by element.
inline Comparison compare(const Mirror& m, const std::vector<uint8_t>& got, Tol tol) {
  Comparison c;
  c.guards_ok = m.guards_intact();
  const size_t es = dtype_size(m.dtype());
  const uint8_t* ref = m.host_bytes();
  for (int64_t i = 0; i < m.elems(); ++i) {
    ++c.compared;
    const uint8_t* g = got.data() + i * es;
    const uint8_t* r = ref + i * es;
    if (std::memcmp(g, r, es) == 0) continue;
    ++c.differ;
    const double gv = element_value(g, m.dtype()), rv = element_value(r, m.dtype());
    const double err = std::abs(gv - rv);
    const double allowed = tol.abs + tol.rel * std::abs(rv) + tol.ulps * ulp_of(rv, m.dtype());
    c.non_finite += !std::isfinite(gv);
    const bool good = std::isfinite(gv) && std::isfinite(rv) && err <= allowed;
    if (std::isfinite(err)) {
      c.max_err = std::max(c.max_err, err);
      c.max_ratio = std::max(c.max_ratio, allowed > 0 ? err / allowed : INFINITY);
    }
    if (!good && c.bad++ == 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "element %lld: got %.9g, want %.9g (allowed %.3g)",
                    (long long)i, gv, rv, allowed);
      c.first_bad = buf;
    }
  }
  return c;
}

// Compares every listed mirror; the first failing one's text wins.
inline Comparison compare_all(std::initializer_list<std::pair<const Mirror*, Tol>> ms) {
  Comparison all;
  for (auto [m, tol] : ms) {
    Comparison c = compare(*m, m->download(), tol);
    all.compared += c.compared;
    all.differ += c.differ;
    all.non_finite += c.non_finite;
    all.max_err = std::max(all.max_err, c.max_err);
    all.max_ratio = std::max(all.max_ratio, c.max_ratio);
    all.guards_ok = all.guards_ok && c.guards_ok;
    if (c.bad && !all.bad) all.first_bad = c.first_bad;
    all.bad += c.bad;
  }
  return all;
}

struct Summary {
  int ok = 0, failed = 0, unsupported = 0;
  ~Summary() {
    std::printf("  %d ok, %d failed, %d unsupported\n", ok, failed, unsupported);
    std::fflush(stdout);
  }
};

// Milliseconds per call of `op` on the test stream (2 warm-up calls, then enough calls for
// ~20 ms).
inline double time_ms(const TestStream& s, const std::function<void()>& op) {
  cudaEvent_t start, stop;
  LONGCTX_CUDA_CHECK(cudaEventCreate(&start));
  LONGCTX_CUDA_CHECK(cudaEventCreate(&stop));
  auto run = [&](int iters) {
    LONGCTX_CUDA_CHECK(cudaEventRecord(start, s.get()));
    for (int i = 0; i < iters; ++i) op();
    LONGCTX_CUDA_CHECK(cudaEventRecord(stop, s.get()));
    LONGCTX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) / iters;
  };
  run(2);
  const double est = run(3);
  const int iters = int(std::clamp(20.0 / std::max(est, 1e-4), 5.0, 500.0));
  const double ms = run(iters);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// What a case reports: its comparison (or a failure text), and for perf mode the work of one
// call of `gpu`.
struct CaseSpec {
  std::string name;
  std::function<void()> gpu;          // the CUDA op once (async)
  std::function<Comparison()> check;  // the CPU twin + compare (after gpu and a sync)
  double bytes = 0;                   // moved per call (GB/s), or
  double flops = 0;                   // useful flops per call (TFLOP/s)
  bool perf_only = false;             // no check; only run in perf mode
};

inline void run_case(const TestStream& s, const CaseSpec& c, Summary& sum) {
  if (c.perf_only && !perf_mode()) return;
  Comparison cmp;
  std::string failure;
  try {
    // Buffer set-up ran on the legacy default stream (cudaMemset, pageable uploads), which the
    // non-blocking test stream does not wait for.
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    c.gpu();
    s.sync();
    if (c.check) cmp = c.check();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnsupported) {
      std::printf("  %-78s UNSUPPORTED  %s\n", c.name.c_str(), e.what());
      std::fflush(stdout);
      ++sum.unsupported;
      return;
    }
    failure = std::string("exception: ") + e.what();
  } catch (const std::exception& e) {
    failure = std::string("exception: ") + e.what();
  }
  const bool ok = failure.empty() && cmp.ok();
  std::string perf;
  if (ok && perf_mode()) {
    const double ms = time_ms(s, c.gpu);
    char buf[96];
    if (c.flops > 0)
      std::snprintf(buf, sizeof buf, "  %9.4f ms %7.1f TFLOP/s", ms, c.flops / (ms * 1e9));
    else
      std::snprintf(buf, sizeof buf, "  %9.4f ms %7.0f GB/s", ms, c.bytes / (ms * 1e6));
    perf = buf;
  }
  std::printf("  %-78s %s  %s%s\n", c.name.c_str(), ok ? "OK  " : "FAIL",
              failure.empty() ? (c.check ? cmp.str().c_str() : "(perf only)") : failure.c_str(),
              perf.c_str());
  std::fflush(stdout);
  if (ok) {
    ++sum.ok;
  } else {
    ++sum.failed;
    ADD_FAILURE() << c.name << ": " << (failure.empty() ? cmp.str() : failure);
  }
}

}  // namespace longctx::gpu_ops_test
