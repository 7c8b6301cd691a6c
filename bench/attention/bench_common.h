// What bench_attention's tables share: event timing, random device buffers, the line format,
// the Llama-3.1-8B attention shape and the run's kernel tuning (the flags).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "longctx/core/cuda_check.h"
#include "longctx/kernels/kernel_tuning.h"
#include "read_ceiling.h"

namespace longctx::bench {

inline constexpr int kHq = 32, kHk = 8, kD = 128;

// The kernels' tuning for every plan of this run (the flags; defaults: the measured choices).
extern kernels::KernelTuning g_tuning;

// Median ms of `iters` event-timed calls of fn on stream, after 3 warm-up calls.
double time_ms(const std::function<void()>& fn, cudaStream_t stream, int iters = 20);
// time_ms on `stream` as the shared tables take it (read_ceiling.h).
TimeFn stream_timer(cudaStream_t stream);
// Device buffer of n bf16 values, uniform in [-1, 1]: 16M values generated on the host, then
// repeated on the device (host generation of the 4 GB decode caches would dominate the run).
void* random_bf16(int64_t n, uint32_t seed);
// Device buffer of n FP8 E4M3 codes of values uniform in [-448, 448) (no NaN code), generated
// as random_bf16's; with page scales of 2^-8 the elements lie in [-1.75, 1.75).
void* random_fp8(int64_t n, uint32_t seed);
// One line of a table: name, ms, TFLOP/s of `flops` and, given bytes, GB/s.
void print(const std::string& name, double ms, double flops, double bytes = 0);

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
  if (!v.empty())
    LONGCTX_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace longctx::bench
