// Programmatic dependent launch (sm_90+): a kernel launched with launch_pdl may start while the
// kernel before it in the stream is still running, so its launch latency and its prologue hide
// under that kernel's tail. The contract on both sides:
//   - the dependent kernel calls pdl_wait() before it reads anything an earlier kernel wrote or
//     writes anything an earlier kernel may still read (work before it may touch only its
//     parameters and shared memory); pdl_wait returns once every earlier kernel has completed
//     and its writes are visible;
//   - any kernel may call pdl_launch_dependents() to let the next kernel start before it ends
//     (without it, the next starts as this one's CTAs exit). It is a hint, never a data
//     dependency: the next kernel's pdl_wait still waits for this whole grid.
// On older devices and where KernelTuning::pdl is off (set_pdl_allowed, pdl.h) launch_pdl is an
// ordinary launch and both calls are no-ops. Stream capture keeps the programmatic edges in the
// CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/pdl.h"
#include "longctx/core/cuda_check.h"

namespace longctx::kernels::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the previous kernel of the
// stream where pdl_enabled(). The kernel must call pdl_wait() as described above.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl_enabled() ? 1 : 0;
  LONGCTX_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace longctx::kernels::cuda
