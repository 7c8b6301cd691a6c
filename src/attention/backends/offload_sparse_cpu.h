// The CPU simulation's sparse reader (offload_sparse.h, offload_sparse_cpu.cpp) and the memory of
// the simulated device (offload_device_cpu.cpp) it reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "attention/backends/offload_backend.h"

namespace longctx {

// The simulated device's memory as its sparse reader reads it (f32 caches; a sparse policy over
// FP8 is not simulated yet).
struct CpuOffloadMemory {
  const float* host = nullptr;  // [layers][host blocks][K, V][block_size, Hkv, d]
  const float* gpu = nullptr;   // [layers][gpu blocks][K, V][block_size, Hkv, d]
  // Lands the write-backs up to `ticket`: host blocks read in place afterwards hold them.
  std::function<void(uint64_t ticket)> land_write_backs;
};

// The reader of config.sparse over `memory`, driving the registry's CPU policy; null unless the
// policy selects a phase. Throws Error(kUnsupported) for a policy over an FP8 cache.
std::unique_ptr<OffloadSparseReader> make_cpu_offload_sparse(const OffloadDeviceConfig& config,
                                                             CpuOffloadMemory memory);

}  // namespace longctx
