// Device-side helpers of the op tests: deterministic random fills (so multi-GB inputs need no
// host generation or upload) and a kernel that keeps a stream busy (stream-order tests).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::gpu_ops_test {

// dst[i] = lo + (hi - lo) * u(seed, i), u uniform in [0, 1) from a hash of (seed, i), rounded to
// dtype (f32/bf16/f16; fp8 e4m3: its code, saturating). For i32, values in [int(lo), int(hi)); u8
// and i64 get raw hash bits. Deterministic for any launch shape. Without a stream: on the
// thread's current stream, done when it returns (whatever stream reads dst next).
void fill_uniform(void* dst, int64_t count, DType dtype, uint64_t seed, float lo, float hi,
                  cudaStream_t stream = nullptr);

// Number of NaN/Inf elements of the [rows, cols] float matrix at p with row stride ld (elements),
// read on the thread's current stream (after the work queued there).
int64_t count_non_finite(const void* p, DType dtype, int64_t rows, int64_t cols, int64_t ld);

// One thread sleeps on the global timer for `ns` nanoseconds.
void launch_spin(cudaStream_t stream, uint64_t ns);

}  // namespace longctx::gpu_ops_test
