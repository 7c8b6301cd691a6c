// Scattered reads of pinned host memory into one GPU buffer: how a sparse policy's selected KV
// pages (Quest: 16 tokens of one KV head, 4 KB at Llama-3.1-8B shapes) can cross the link. For
// each chunk size, the same random chunks of a pinned pool are read three ways:
//   copy   one cudaMemcpyAsync per chunk (the copy engine; ~4 us of latency each);
//   batch  one cudaMemcpyBatchAsync for all chunks;
//   gather a kernel whose threads read the mapped pinned memory directly (zero-copy, 16-byte
//          loads; the SMs issue the PCIe reads);
// plus one contiguous copy of the same bytes (the link's rate). Each result is checked against
// the pool. Prints GB/s (best of 3).
//   bench_scattered_reads [POOL_GIB=8] [TOTAL_MIB=256]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "longctx/core/cuda_check.h"

namespace {

__global__ void gather_kernel(const uint4* __restrict__ pool, const uint64_t* __restrict__ offsets,
                              uint4* __restrict__ dst, int64_t num_chunks, int64_t chunk_words) {
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const uint4* src = pool + offsets[c] / sizeof(uint4);
    uint4* out = dst + c * chunk_words;
    for (int64_t w = threadIdx.x; w < chunk_words; w += blockDim.x) out[w] = src[w];
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    LONGCTX_CUDA_CHECK(cudaEventCreate(&a));
    LONGCTX_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  template <typename F>
  double best_gbps(size_t bytes, cudaStream_t s, F run) {
    double best = 0;
    for (int i = 0; i < 4; ++i) {  // the first is a warm-up
      LONGCTX_CUDA_CHECK(cudaEventRecord(a, s));
      run();
      LONGCTX_CUDA_CHECK(cudaEventRecord(b, s));
      LONGCTX_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (i > 0) best = std::max(best, double(bytes) / (ms * 1e-3) / 1e9);
    }
    return best;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t pool_bytes = (argc > 1 ? std::atoll(argv[1]) : 8) << 30;
  const int64_t total = (argc > 2 ? std::atoll(argv[2]) : 256) << 20;
  uint8_t* pool = nullptr;
  LONGCTX_CUDA_CHECK(cudaHostAlloc(&pool, pool_bytes, cudaHostAllocMapped));
  std::mt19937_64 rng(1);
  for (int64_t i = 0; i < pool_bytes / 8; ++i) reinterpret_cast<uint64_t*>(pool)[i] = rng();
  uint8_t* pool_dev = nullptr;
  LONGCTX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pool_dev), pool, 0));
  uint8_t* dst = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&dst, total));
  cudaStream_t s;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0;
  LONGCTX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Timer t;
  const double link = t.best_gbps(total, s, [&] {
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dst, pool, total, cudaMemcpyHostToDevice, s));
  });
  std::printf("pinned pool %lld GiB, %lld MiB per trial; one contiguous copy: %.1f GB/s\n",
              (long long)(pool_bytes >> 30), (long long)(total >> 20), link);
  std::printf("%10s %8s %10s %10s %10s\n", "chunk", "chunks", "copy GB/s", "batch GB/s",
              "gather GB/s");
  std::vector<uint8_t> check(total);
  bool ok = true;
  for (int64_t chunk : {4096, 8192, 16384, 32768, 65536, 262144, 1048576}) {
    const int64_t n = total / chunk;
    std::vector<uint64_t> off(n);
    for (auto& o : off) o = (rng() % uint64_t(pool_bytes / chunk)) * chunk;
    std::vector<void*> dsts(n), srcs(n);
    std::vector<size_t> sizes(n, size_t(chunk));
    for (int64_t i = 0; i < n; ++i) {
      dsts[i] = dst + i * chunk;
      srcs[i] = pool + off[i];
    }
    auto verify = [&](const char* how) {
      LONGCTX_CUDA_CHECK(cudaMemcpy(check.data(), dst, total, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < n; ++i)
        if (std::memcmp(check.data() + i * chunk, pool + off[i], chunk) != 0) {
          std::printf("  %s: chunk %lld differs\n", how, (long long)i);
          ok = false;
          return;
        }
      LONGCTX_CUDA_CHECK(cudaMemset(dst, 0, total));
    };
    const double copy = t.best_gbps(total, s, [&] {
      for (int64_t i = 0; i < n; ++i)
        LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], chunk, cudaMemcpyHostToDevice, s));
    });
    verify("copy");
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeHost;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = 0;
    size_t attr_idx = 0;
    const double batch = t.best_gbps(total, s, [&] {
      LONGCTX_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), size_t(n),
                                              &attr, &attr_idx, 1, s));
    });
    verify("batch");
    uint64_t* off_dev = nullptr;
    LONGCTX_CUDA_CHECK(cudaMalloc(&off_dev, n * sizeof(uint64_t)));
    LONGCTX_CUDA_CHECK(
        cudaMemcpy(off_dev, off.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice));
    const int64_t words = chunk / int64_t(sizeof(uint4));
    const int blocks = int(std::min<int64_t>(n, int64_t(sms) * 16));
    const int threads = int(std::min<int64_t>(words, 256));
    const double gather = t.best_gbps(total, s, [&] {
      gather_kernel<<<blocks, threads, 0, s>>>(reinterpret_cast<const uint4*>(pool_dev), off_dev,
                                               reinterpret_cast<uint4*>(dst), n, words);
      LONGCTX_CUDA_CHECK(cudaGetLastError());
    });
    verify("gather");
    LONGCTX_CUDA_CHECK(cudaFree(off_dev));
    std::printf("%10lld %8lld %10.1f %10.1f %10.1f\n", (long long)chunk, (long long)n, copy, batch,
                gather);
  }
  cudaFree(dst);
  cudaFreeHost(pool);
  std::printf(ok ? "all reads checked against the pool\n" : "MISMATCH\n");
  return ok ? 0 : 1;
}
