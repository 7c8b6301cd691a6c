#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_stream.h"
#include "core/strided_copy.h"
#include "longctx/core/cuda_check.h"

namespace longctx::detail {

namespace {

// One element per thread and grid-stride step: the linear index of the (row-major) shape is
// split into coordinates, which give both offsets. Index is int64 or uint32 (faster divisions
// when everything fits).
template <typename T, typename Index>
__global__ void strided_copy_kernel(StridedCopyParams p) {
  T* dst = static_cast<T*>(p.dst);
  const T* src = static_cast<const T*>(p.src);
  const Index n = static_cast<Index>(p.numel);
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += Index(gridDim.x) * blockDim.x) {
    Index rest = i;
    int64_t doff = 0, soff = 0;
#pragma unroll
    for (int d = kMaxStridedCopyRank - 1; d >= 0; --d) {
      if (d >= p.rank) continue;
      const Index extent = static_cast<Index>(p.shape[d]);
      const Index c = rest % extent;
      rest /= extent;
      doff += int64_t(c) * p.dst_strides[d];
      soff += int64_t(c) * p.src_strides[d];
    }
    dst[doff] = src[soff];
  }
}

template <typename T>
void launch(const StridedCopyParams& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.numel + kThreads - 1) / kThreads, 1 << 16);
  if (p.numel <= INT32_MAX) {
    strided_copy_kernel<T, uint32_t><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  } else {
    strided_copy_kernel<T, int64_t><<<unsigned(blocks), kThreads, 0, stream>>>(p);
  }
  LONGCTX_CUDA_CHECK_LAUNCH("strided_copy_kernel");
}

}  // namespace

void strided_copy_cuda(const StridedCopyParams& p, int device) {
  if (p.numel == 0) return;
  DeviceGuard g(device);
  cudaStream_t stream = current_cuda_stream(device);
  switch (p.elem_size) {
    case 1:
      return launch<uint8_t>(p, stream);
    case 2:
      return launch<uint16_t>(p, stream);
    case 4:
      return launch<uint32_t>(p, stream);
    case 8:
      return launch<uint64_t>(p, stream);
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "strided copy: element size {}", p.elem_size);
  }
}

}  // namespace longctx::detail
