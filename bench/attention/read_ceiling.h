// What one kernel launch can read from HBM: the ceiling the decode table's GB/s are held against.
// A plain streaming read (16-byte loads, 8 in flight per thread, one wave of CTAs), no paging, no
// compute, timed exactly as the decode rows are.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

namespace longctx::bench {

// Reads `bytes` (a multiple of 16) at `src` once; `sink` [grid CTAs] u32 receives one word per
// CTA so the loads are not dead code. Returns the CTAs launched.
int launch_read(const void* src, size_t bytes, uint32_t* sink, cudaStream_t stream);

// An empty kernel: the launch gap alone, as event timing sees it.
void launch_empty(cudaStream_t stream);

// CTAs launch_read uses (size of its sink).
int read_grid_ctas();

// A timer: the median ms of `iters` timed calls of the function (after warm-up).
using TimeFn = std::function<double(const std::function<void()>&, int)>;

// ms of one launch alone (median of `iters`) and of one of 20 back-to-back launches (median of
// `stream_iters` bursts, / 20): the decode table's "isolated" and "stream" columns.
std::pair<double, double> time_isolated_and_stream(const std::function<void()>& launch,
                                                   const TimeFn& time_ms, int iters,
                                                   int stream_iters);

// The ceiling of the decode table: a plain read of the same K+V bytes as the batch-1 rows (1K,
// 32K, 128K, 1M keys), timed as they are (isolated / stream), from windows of a pool of >= 512 MB
// so no window is still in the L2; and the launch gap alone (an empty kernel). Prints markdown.
void read_table(cudaStream_t stream, const TimeFn& time_ms);

}  // namespace longctx::bench
