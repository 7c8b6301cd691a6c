// The op-test harness for the CUDA attention kernels (in the spirit of llama.cpp's
// test-backend-ops): every kernel case is a small class that builds its inputs on the host,
// runs the CUDA kernel and its CPU reference, and compares with written tolerances; the harness
// adds the checks every case gets:
//   - outputs are allocated with guard bytes on both sides (GuardedBuffer) filled with a pattern
//     that must survive the kernel, and the output itself is pre-filled with NaN bytes, so a
//     row the kernel forgets to write fails the NaN/Inf check;
//   - NaN / Inf checks over the whole GPU output;
//   - "unsupported" (the kernel refuses the shape, e.g. head_dim 96) is reported apart from
//     "failed";
//   - perf mode (env LONGCTX_PERF=1): each case is also timed with CUDA events and its TFLOP/s
//     printed.
//
// Adding a kernel: derive from OpCase, fill name()/supported()/prepare()/launch()/check()/flops(),
// and hand a list of cases to run_cases() from a TEST (see prefill_test.cpp).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/cuda_check.h"
#include "longctx/core/dtype.h"

namespace longctx::gpu_test {

inline bool perf_mode() {
  const char* v = std::getenv("LONGCTX_PERF");
  return v && *v && std::string(v) != "0";
}

// Device buffer with kGuardBytes of a fixed pattern before and after the payload.
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 4096;
  static constexpr uint8_t kGuardPattern = 0x5A;

  GuardedBuffer() = default;
  explicit GuardedBuffer(size_t bytes, uint8_t fill = 0xFF) : bytes_(bytes) {
    LONGCTX_CUDA_CHECK(cudaMalloc(&base_, bytes_ + 2 * kGuardBytes));
    LONGCTX_CUDA_CHECK(cudaMemset(base_, kGuardPattern, bytes_ + 2 * kGuardBytes));
    LONGCTX_CUDA_CHECK(cudaMemset(data(), fill, bytes_));
    // The fills run on the legacy stream, which the tests' non-blocking streams do not wait
    // for: a plan's upload there (cudaMemcpyAsync into a fresh workspace) could land first and
    // be overwritten by the fill (work items all (0, 0): only the first tile written).
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  GuardedBuffer(GuardedBuffer&& o) noexcept { *this = std::move(o); }
  GuardedBuffer& operator=(GuardedBuffer&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~GuardedBuffer() {
    if (base_) cudaFree(base_);
  }

  void* data() const { return static_cast<uint8_t*>(base_) + kGuardBytes; }
  size_t bytes() const { return bytes_; }
  void upload(const void* src) {
    LONGCTX_CUDA_CHECK(cudaMemcpy(data(), src, bytes_, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy returns once the source is staged, before the DMA lands.
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void download(void* dst) const {
    LONGCTX_CUDA_CHECK(cudaMemcpy(dst, data(), bytes_, cudaMemcpyDeviceToHost));
  }
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> v(bytes_ / sizeof(T));
    download(v.data());
    return v;
  }
  // True when both guard regions still hold the pattern.
  bool guards_intact() const {
    if (!base_) return true;
    std::vector<uint8_t> g(kGuardBytes);
    for (const uint8_t* at :
         {static_cast<const uint8_t*>(base_), static_cast<const uint8_t*>(data()) + bytes_}) {
      LONGCTX_CUDA_CHECK(cudaMemcpy(g.data(), at, kGuardBytes, cudaMemcpyDeviceToHost));
      for (uint8_t b : g)
        if (b != kGuardPattern) return false;
    }
    return true;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host vector (at least one byte, so an empty vector still gets a valid,
// guarded pointer).
template <typename T>
GuardedBuffer upload_vector(const std::vector<T>& v) {
  GuardedBuffer b(std::max<size_t>(v.size() * sizeof(T), 1), 0);
  if (!v.empty()) b.upload(v.data());
  return b;
}

enum class Status { kOk, kFailed, kUnsupported };

struct CaseResult {
  Status status = Status::kOk;
  std::string detail;  // why it failed / what was compared
  double max_abs_out = 0, max_abs_lse = 0;
};

// Max-abs comparison of 16-bit float outputs over selected rows, plus NaN/Inf over all rows.
struct HalfCompare {
  double max_abs = 0;
  int64_t non_finite = 0;  // NaN/Inf anywhere in `got`
};
inline float half_bits_to_f32(uint16_t v, DType dt) {
  return dt == DType::kBF16 ? bf16_to_f32(v) : f16_to_f32(v);
}
// got/ref: [rows, row_elems]; rows: which rows to compare (all when empty).
inline HalfCompare compare_half_rows(const std::vector<uint16_t>& got,
                                     const std::vector<uint16_t>& ref, DType dt, int64_t row_elems,
                                     const std::vector<int64_t>& rows) {
  HalfCompare c;
  for (uint16_t v : got) c.non_finite += !std::isfinite(half_bits_to_f32(v, dt));
  auto cmp_row = [&](int64_t r) {
    for (int64_t e = r * row_elems; e < (r + 1) * row_elems; ++e) {
      const double d =
          std::abs(double(half_bits_to_f32(got[e], dt)) - half_bits_to_f32(ref[e], dt));
      c.max_abs = std::isnan(d) ? INFINITY : std::max(c.max_abs, d);
    }
  };
  if (rows.empty()) {
    for (int64_t r = 0; r < int64_t(got.size()) / row_elems; ++r) cmp_row(r);
  } else {
    for (int64_t r : rows) cmp_row(r);
  }
  return c;
}

// LSE comparison: -inf must match -inf exactly (rows that see no key); NaN / +inf are failures.
struct LseCompare {
  double max_abs = 0;
  int64_t bad = 0;  // NaN, +inf, or -inf on one side only
};
inline LseCompare compare_lse_rows(const std::vector<float>& got, const std::vector<float>& ref,
                                   int64_t row_elems, const std::vector<int64_t>& rows) {
  LseCompare c;
  for (float v : got) c.bad += std::isnan(v) || v == INFINITY;
  auto cmp_row = [&](int64_t r) {
    for (int64_t e = r * row_elems; e < (r + 1) * row_elems; ++e) {
      if (std::isinf(ref[e]) || std::isinf(got[e])) {
        c.bad += !(ref[e] == -INFINITY && got[e] == -INFINITY);
      } else {
        c.max_abs = std::max(c.max_abs, double(std::abs(got[e] - ref[e])));
      }
    }
  };
  if (rows.empty()) {
    for (int64_t r = 0; r < int64_t(got.size()) / row_elems; ++r) cmp_row(r);
  } else {
    for (int64_t r : rows) cmp_row(r);
  }
  return c;
}

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string name() const = 0;
  // False when the kernel does not handle this shape (reported as "unsupported", not failed).
  virtual bool supported() const = 0;
  // Builds host inputs, uploads them, allocates guarded outputs, plans.
  virtual void prepare(cudaStream_t stream) = 0;
  // Launches the kernel(s) once; no host sync (timed in perf mode).
  virtual void launch(cudaStream_t stream) = 0;
  // Runs the CPU reference and compares against the GPU outputs (after launch + sync).
  virtual CaseResult check() = 0;
  // Useful floating-point operations of one launch (for TFLOP/s).
  virtual double flops() const = 0;
  // When false, correctness is still checked but the case is only run in perf mode.
  virtual bool perf_only() const { return false; }
};

struct RunSummary {
  int ok = 0, failed = 0, unsupported = 0, skipped = 0;
};

// Times `launch` with CUDA events: 2 warm-up launches, then `iters` launches; returns ms/launch.
inline double time_launch(OpCase& c, cudaStream_t stream, int iters) {
  for (int i = 0; i < 2; ++i) c.launch(stream);
  cudaEvent_t start, stop;
  LONGCTX_CUDA_CHECK(cudaEventCreate(&start));
  LONGCTX_CUDA_CHECK(cudaEventCreate(&stop));
  LONGCTX_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaEventRecord(stop, stream));
  LONGCTX_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

// Captures c.launch(stream) into a CUDA graph, calls before_replay (e.g. to refill the outputs
// with NaN bytes, so that the replay must write every row), replays the graph once and waits for
// it: run() must be graph-safe (no host sync, no host-side state read at launch).
template <typename BeforeReplay>
void replay_in_graph(OpCase& c, cudaStream_t stream, BeforeReplay before_replay) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  before_replay();
  // before_replay's cudaMemset runs on the legacy stream, which a non-blocking `stream` does not
  // wait for.
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Runs every case: prepare, launch, sync, check; in perf mode also times. Prints one line per
// case and records a GoogleTest failure for each failed case.
inline RunSummary run_cases(const std::vector<std::unique_ptr<OpCase>>& cases) {
  RunSummary sum;
  const bool perf = perf_mode();
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreate(&stream));
  for (const auto& c : cases) {
    const std::string name = c->name();
    if (c->perf_only() && !perf) {
      ++sum.skipped;
      continue;
    }
    if (!c->supported()) {
      std::printf("  %-90s UNSUPPORTED\n", name.c_str());
      ++sum.unsupported;
      continue;
    }
    CaseResult r;
    try {
      c->prepare(stream);
      c->launch(stream);
      LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
      r = c->check();
    } catch (const std::exception& e) {
      r.status = Status::kFailed;
      r.detail = std::string("exception: ") + e.what();
    }
    std::string perf_txt;
    if (perf && r.status == Status::kOk) {
      const double ms = time_launch(*c, stream, 10);
      char buf[96];
      std::snprintf(buf, sizeof buf, "  %9.3f ms  %7.1f TFLOP/s", ms, c->flops() / (ms * 1e9));
      perf_txt = buf;
    }
    std::printf("  %-90s %s  out %.2e lse %.2e%s%s%s\n", name.c_str(),
                r.status == Status::kOk ? "OK  " : "FAIL", r.max_abs_out, r.max_abs_lse,
                perf_txt.c_str(), r.detail.empty() ? "" : "  ", r.detail.c_str());
    std::fflush(stdout);
    if (r.status == Status::kOk) {
      ++sum.ok;
    } else {
      ++sum.failed;
      ADD_FAILURE() << name << ": " << r.detail;
    }
  }
  cudaStreamDestroy(stream);
  std::printf("  %d ok, %d failed, %d unsupported, %d perf-only skipped\n", sum.ok, sum.failed,
              sum.unsupported, sum.skipped);
  return sum;
}

}  // namespace longctx::gpu_test
