// LONGCTX_HD marks small helpers that host planning code and CUDA kernels share (one definition
// of a layout or an index mapping, so the two sides cannot drift apart).
#pragma once

// LONGCTX_HD_INLINE: the same, always inlined (small hot helpers: the Philox rounds, the
// sampler's math).
#if defined(__CUDACC__)
#define LONGCTX_HD __host__ __device__
#define LONGCTX_HD_INLINE __host__ __device__ __forceinline__
#else
#define LONGCTX_HD
#define LONGCTX_HD_INLINE inline
#endif
