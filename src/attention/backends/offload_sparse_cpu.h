// The CPU simulation's sparse reader (offload_sparse.h, offload_sparse_cpu.cpp) and the memory of
// the simulated device (offload_device_cpu.cpp) it reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "attention/backends/offload_backend.h"

namespace longctx {

// The simulated device's memory as its sparse reader reads it: f32 elements, or FP8 E4M3 codes
// with each block's scales beside them.
struct CpuOffloadMemory {
  const void* host = nullptr;          // [layers][host blocks][K, V][block_size, Hkv, d]
  const void* gpu = nullptr;           // [layers][gpu blocks][K, V][block_size, Hkv, d]
  const float* host_scales = nullptr;  // FP8: [layers][host blocks][K, V][Hkv]
  const float* gpu_scales = nullptr;   // FP8: [layers][gpu blocks][K, V][Hkv]
  // Lands the write-backs up to `ticket`: host blocks read in place afterwards hold them.
  std::function<void(uint64_t ticket)> land_write_backs;
};

// The reader of config.sparse over `memory`, driving the registry's CPU policy; null unless the
// policy selects a phase. Throws Error(kUnsupported) for a policy over an FP8 cache unless its
// registry line reads_fp8 (quest) and it selects no prefill.
std::unique_ptr<OffloadSparseReader> make_cpu_offload_sparse(const OffloadDeviceConfig& config,
                                                             CpuOffloadMemory memory);

}  // namespace longctx
