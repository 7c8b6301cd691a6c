#include "bench_common.h"

#include <cstdio>
#include <random>

#include "longctx/core/tensor.h"

namespace longctx::bench {

kernels::KernelTuning g_tuning;

double time_ms(const std::function<void()>& fn, cudaStream_t stream, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  cudaEvent_t a, b;
  LONGCTX_CUDA_CHECK(cudaEventCreate(&a));
  LONGCTX_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < iters; ++i) {
    LONGCTX_CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    LONGCTX_CUDA_CHECK(cudaEventRecord(b, stream));
    LONGCTX_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TimeFn stream_timer(cudaStream_t stream) {
  return
      [stream](const std::function<void()>& fn, int iters) { return time_ms(fn, stream, iters); };
}

// Device buffer of n bf16 values, uniform in [-1, 1]: 16M values generated on the host, then
// repeated on the device (host generation of the 4 GB decode caches would dominate the run).
void* random_bf16(int64_t n, uint32_t seed) {
  const int64_t chunk = std::min<int64_t>(n, int64_t(1) << 24);
  std::vector<uint16_t> h(chunk);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : h) x = f32_to_bf16(u(rng));
  char* d = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&d, std::max<int64_t>(n, 1) * 2));
  LONGCTX_CUDA_CHECK(cudaMemcpy(d, h.data(), chunk * 2, cudaMemcpyHostToDevice));
  for (int64_t done = chunk; done < n;) {
    const int64_t c = std::min(done, n - done);
    LONGCTX_CUDA_CHECK(cudaMemcpy(d + done * 2, d, c * 2, cudaMemcpyDeviceToDevice));
    done += c;
  }
  return d;
}

// Device buffer of n FP8 E4M3 codes of values uniform in [-448, 448) (no NaN code), generated
// as random_bf16's (a chunk on the host, repeated on the device); with page scales of 2^-8 the
// elements lie in [-1.75, 1.75).
void* random_fp8(int64_t n, uint32_t seed) {
  const int64_t chunk = std::min<int64_t>(std::max<int64_t>(n, 1), int64_t(1) << 24);
  std::vector<uint8_t> h(chunk);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-448.f, 448.f);
  for (auto& x : h) x = f32_to_fp8e4m3(u(rng));
  char* d = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&d, std::max<int64_t>(n, 1)));
  LONGCTX_CUDA_CHECK(cudaMemcpy(d, h.data(), chunk, cudaMemcpyHostToDevice));
  for (int64_t done = chunk; done < n;) {
    const int64_t c = std::min(done, n - done);
    LONGCTX_CUDA_CHECK(cudaMemcpy(d + done, d, c, cudaMemcpyDeviceToDevice));
    done += c;
  }
  return d;
}

void print(const std::string& name, double ms, double flops, double bytes) {
  std::printf("%-58s %9.3f ms %8.1f TFLOP/s", name.c_str(), ms, flops / (ms * 1e9));
  if (bytes > 0) std::printf(" %8.1f GB/s", bytes / (ms * 1e6));
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace longctx::bench
