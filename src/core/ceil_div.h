// ceil_div: how many blocks of b cover a (a >= 0, b > 0), for the counts of scale blocks, tiles
// and splits. One definition that host planning code, CPU ops and CUDA kernels share; in core,
// since the loader (which sizes FP8 scale grids) does not depend on kernels.
#pragma once

#include <cstdint>

namespace longctx {

#if defined(__CUDACC__)
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
#else
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
#endif

}  // namespace longctx
