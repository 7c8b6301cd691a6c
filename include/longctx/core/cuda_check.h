// CUDA / cuBLAS status checks that name the failing call. Include only from .cu files or
// CUDA-guarded code.
#pragma once

#include <cuda_runtime.h>

#include "longctx/core/error.h"

namespace longctx {
// Throws Error(kCuda) "file:line: call failed: reason".
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, const char* what);
}  // namespace longctx

#define LONGCTX_CUDA_CHECK(call)                                                        \
  do {                                                                                  \
    cudaError_t err_ = (call);                                                          \
    if (err_ != cudaSuccess)                                                            \
      ::longctx::throw_cuda_error(__FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronizing.
#define LONGCTX_CUDA_CHECK_LAUNCH(name) LONGCTX_CUDA_CHECK(cudaGetLastError())
