#include <algorithm>
#include <cstdio>

#include "longctx/core/cuda_check.h"
#include "read_ceiling.h"

namespace longctx::bench {

namespace {

constexpr int kThreads = 512;
constexpr int kCtasPerSm = 4;  // 2048 threads: a full SM
constexpr int kUnroll = 8;     // 16-byte loads in flight per thread (256 KB per SM)

__global__ void __launch_bounds__(kThreads)
    read_kernel(const uint4* __restrict__ src, int64_t n, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0) atomicXor(sink + blockIdx.x, acc);
}

__global__ void empty_kernel() {}

}  // namespace

int read_grid_ctas() {
  int dev = 0, sms = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&dev));
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms * kCtasPerSm;
}

int launch_read(const void* src, size_t bytes, uint32_t* sink, cudaStream_t stream) {
  const int ctas = read_grid_ctas();
  read_kernel<<<ctas, kThreads, 0, stream>>>(static_cast<const uint4*>(src), int64_t(bytes / 16),
                                             sink);
  LONGCTX_CUDA_CHECK_LAUNCH("read_kernel");
  return ctas;
}

void launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  LONGCTX_CUDA_CHECK_LAUNCH("empty_kernel");
}

std::pair<double, double> time_isolated_and_stream(const std::function<void()>& launch,
                                                   const TimeFn& time_ms, int iters,
                                                   int stream_iters) {
  const double isolated = time_ms(launch, iters);
  const double stream = time_ms(
                            [&] {
                              for (int i = 0; i < 20; ++i) launch();
                            },
                            stream_iters) /
                        20;
  return {isolated, stream};
}

void read_table(cudaStream_t stream, const TimeFn& time_ms) {
  std::printf(
      "# read ceiling: one launch streaming the bytes once; same timing as the decode table\n");
  std::printf("| bytes (MB) | as decode B=1 at | CTAs | isolated ms | GB/s | stream ms | GB/s |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  uint32_t* sink = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t) * read_grid_ctas()));
  LONGCTX_CUDA_CHECK(cudaMemset(sink, 0, sizeof(uint32_t) * read_grid_ctas()));
  for (int64_t kv : {int64_t(1024), int64_t(32768), int64_t(131072), int64_t(1048576)}) {
    const int64_t bytes = kv * 8 * 128 * 2 * 2;  // K + V: 8 kv heads, head_dim 128, bf16
    const int64_t reps = std::clamp<int64_t>((int64_t(512) << 20) / bytes, 2, 32);
    char* pool = nullptr;
    LONGCTX_CUDA_CHECK(cudaMalloc(&pool, bytes * reps));
    LONGCTX_CUDA_CHECK(cudaMemset(pool, 1, bytes * reps));
    int64_t rep = 0;
    int ctas = 0;
    auto launch = [&] {
      ctas = launch_read(pool + rep * bytes, size_t(bytes), sink, stream);
      rep = (rep + 1) % reps;
    };
    const auto [iso, burst] = time_isolated_and_stream(launch, time_ms, 50, 9);
    std::printf("| %.1f | %lld keys | %d | %.4f | %.0f | %.4f | %.0f |\n", bytes / 1e6,
                static_cast<long long>(kv), ctas, iso, bytes / (iso * 1e6), burst,
                bytes / (burst * 1e6));
    std::fflush(stdout);
    cudaFree(pool);
  }
  const double empty = time_ms([&] { launch_empty(stream); }, 50);
  std::printf("| 0 | empty kernel | 1 | %.4f | | | |\n", empty);
  cudaFree(sink);
}

}  // namespace longctx::bench
