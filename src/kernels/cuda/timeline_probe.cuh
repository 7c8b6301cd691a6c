// Per-CTA timestamps that show where a kernel's time goes (configure with
// -DLONGCTX_TIMELINE_PROBE=ON; other builds compile the marks to nothing). Thread 0 of each CTA
// writes %globaltimer (ns, one clock for every SM) at a few numbered points of the kernel; the
// host prints, for each point, the quantiles over CTAs relative to the earliest CTA's first mark.
// Sampled events (Nsight Systems) see a kernel as one bar; this shows its prologue, stream,
// imbalance and tail. Include it in one .cu per kernel family: the buffer is that unit's own.
#pragma once

#ifdef LONGCTX_TIMELINE_PROBE
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace longctx::kernels::cuda::timeline {

constexpr int kCtas = 8192;  // CTAs past this are not recorded
constexpr int kMarks = 8;

static __device__ unsigned long long g_marks[kCtas][kMarks];

__device__ __forceinline__ void mark(int i) {
  if (threadIdx.x == 0 && blockIdx.x < kCtas) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_marks[blockIdx.x][i] = t;
  }
}

inline void reset() {
  static unsigned long long zero[kCtas][kMarks];
  cudaMemcpyToSymbol(g_marks, zero, sizeof zero);
}

// After the launch(es) to look at have finished: one line per named mark with min / p10 / p50 /
// p90 / max over the CTAs that wrote it, in us from the earliest mark 0. A CTA's marks older than
// its own mark 0 were left by an earlier launch of the grid and are skipped.
inline void print(int ctas, const std::vector<const char*>& names) {
  static unsigned long long h[kCtas][kMarks];
  cudaDeviceSynchronize();
  cudaMemcpyFromSymbol(h, g_marks, sizeof h);
  ctas = std::min(ctas, kCtas);
  unsigned long long t0 = ~0ull;
  for (int c = 0; c < ctas; ++c)
    if (h[c][0]) t0 = std::min(t0, h[c][0]);
  std::printf("#   timeline of %d CTAs, us from the first entry: min p10 p50 p90 max (CTAs)\n",
              ctas);
  for (size_t i = 0; i < names.size() && i < size_t(kMarks); ++i) {
    std::vector<double> v;
    for (int c = 0; c < ctas; ++c)
      if (h[c][0] >= t0 && h[c][i] >= h[c][0]) v.push_back((h[c][i] - t0) / 1e3);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    auto q = [&](double f) { return v[std::min(v.size() - 1, size_t(f * double(v.size())))]; };
    std::printf("#   %-12s %8.2f %8.2f %8.2f %8.2f %8.2f (%zu)\n", names[i], v.front(), q(0.1),
                q(0.5), q(0.9), v.back(), v.size());
  }
}

}  // namespace longctx::kernels::cuda::timeline

#define LONGCTX_TIMELINE_MARK(i) ::longctx::kernels::cuda::timeline::mark(i)
#else
#define LONGCTX_TIMELINE_MARK(i) ((void)0)
#endif
