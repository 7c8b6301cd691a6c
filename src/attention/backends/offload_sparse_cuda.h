// The CUDA offload device's sparse reader (offload_sparse.h, offload_sparse_cuda.cu; CUDA builds
// only) and the memory of the device (offload_device_cuda.cu) it reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "attention/backends/offload_backend.h"
#include "longctx/core/stream.h"

namespace longctx {

// The device's memory and streams as its sparse reader uses them (the layouts of
// offload_device_cuda.cu: K and V of a block of a layer adjacent, layer-major).
struct CudaOffloadMemory {
  // [layers * gpu blocks + staging blocks] blocks: the GPU cache, then a prefill policy's
  // staging (xattn_offload_staging) in the same allocation.
  char* gpu = nullptr;
  const char* host = nullptr;   // [layers * host blocks] blocks, pinned
  const Stream* h2d = nullptr;  // the ring's copy stream (a prefill policy's keys load on it too)
  // Makes `stream` wait for write-back `ticket` (host blocks read after it hold the copy).
  std::function<void(cudaStream_t stream, uint64_t ticket)> wait_write_back;
  // FP8: the blocks' scales [layers * blocks][K, V][Hkv] f32 of the GPU cache and of the host
  // pool (pinned); null otherwise.
  const float* gpu_scales = nullptr;
  const float* host_scales = nullptr;
};

// The GPU cache's staging blocks under config.sparse (zeros unless its prefill stages host keys);
// throws Error(kUnsupported) for a prefill policy without an offload path.
XAttnStaging cuda_offload_sparse_staging(const OffloadDeviceConfig& config);
// The reader of config.sparse over `memory` (whose GPU cache ends with `staging`), driving the
// registry's CUDA twin of the policy; null unless the policy selects a phase.
std::unique_ptr<OffloadSparseReader> make_cuda_offload_sparse(const OffloadDeviceConfig& config,
                                                              const XAttnStaging& staging,
                                                              const CudaOffloadMemory& memory);

}  // namespace longctx
