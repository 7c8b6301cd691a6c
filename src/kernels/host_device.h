// LONGCTX_HD marks small helpers that host planning code and CUDA kernels share (one definition
// of a layout or an index mapping, so the two sides cannot drift apart).
#pragma once

#if defined(__CUDACC__)
#define LONGCTX_HD __host__ __device__
#else
#define LONGCTX_HD
#endif
