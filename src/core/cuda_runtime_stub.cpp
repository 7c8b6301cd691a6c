// Build without CUDA: every CUDA service reports that this build has none.
#ifndef LONGCTX_WITH_CUDA
#include "core/cuda_runtime.h"
#include "longctx/core/error.h"

namespace longctx::detail {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "{}: this build of longctx has no CUDA backend (configure with -DLONGCTX_CUDA=ON)",
                what);
}
}  // namespace

void* cuda_malloc(size_t, int) { no_cuda("cudaMalloc"); }
void* cuda_try_malloc(size_t, int) { no_cuda("cudaMalloc"); }
void cuda_free(void*, int) { no_cuda("cudaFree"); }
int64_t cuda_free_memory(int) { no_cuda("cudaMemGetInfo"); }
void* cuda_malloc_host(size_t) { no_cuda("cudaMallocHost"); }
void cuda_free_host(void*) { no_cuda("cudaFreeHost"); }
void cuda_copy(void*, Device, const void*, Device, size_t) { no_cuda("cudaMemcpy"); }
void cuda_copy_async(void*, Device, const void*, Device, size_t, void*) {
  no_cuda("cudaMemcpyAsync");
}
void cuda_memset_zero(void*, size_t, int) { no_cuda("cudaMemset"); }

}  // namespace longctx::detail
#endif
