// The device pool on a real GPU: the budget holds for Tensor::empty, a refused cudaMalloc is a
// clear kOutOfMemory, freed blocks come back at the same address, nothing leaks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "longctx/core/allocator.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"

using namespace longctx;

namespace {
constexpr int64_t kMiB = int64_t{1} << 20;
const Device kGpu = Device::cuda(0);

std::string oom_of(int64_t bytes) {
  try {
    Tensor t = Tensor::empty({bytes}, DType::kU8, kGpu);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "Tensor::empty of " << bytes << " bytes did not throw";
  return "";
}

// Restores the default budget even when a test fails half-way.
struct DefaultBudgetAfter {
  ~DefaultBudgetAfter() {
    configure_device_memory(0, 0, 0.9);
    release_cached_device_memory(0);
  }
};
}  // namespace

TEST(DevicePoolGpu, BudgetOf256MiBHolds) {
  DefaultBudgetAfter restore;
  release_cached_device_memory(0);
  const DeviceMemoryStats before = device_memory_stats(0);
  EXPECT_EQ(before.in_use, 0);
  configure_device_memory(0, 256 * kMiB);
  EXPECT_EQ(device_memory_stats(0).budget, 256 * kMiB);

  const std::string m = oom_of(300 * kMiB);
  std::printf("  %s\n", m.c_str());
  EXPECT_NE(m.find("cannot allocate 300.0 MiB on cuda:0"), std::string::npos) << m;
  EXPECT_NE(m.find("budget 256.0 MiB = --gpu-memory-limit"), std::string::npos) << m;
  {
    Tensor a = Tensor::empty({200 * kMiB}, DType::kU8, kGpu);
    const DeviceMemoryStats s = device_memory_stats(0);
    EXPECT_EQ(s.in_use, 200 * kMiB);
    EXPECT_EQ(s.num_allocations, 1);
    EXPECT_LE(s.reserved, s.budget);
    const std::string m2 = oom_of(100 * kMiB);
    EXPECT_NE(m2.find("in use 200.0 MiB"), std::string::npos) << m2;
    // Many small tensors still fit next to it.
    std::vector<Tensor> small;
    for (int i = 0; i < 1000; ++i)
      small.push_back(Tensor::empty({1 + (i % 100) * 37}, DType::kF32, kGpu));
    EXPECT_EQ(device_memory_stats(0).num_allocations, 1001);
  }
  EXPECT_EQ(device_memory_stats(0).in_use, 0);
  // With a's 200 MiB cached, a 250 MiB request releases it first and fits.
  { Tensor b = Tensor::empty({250 * kMiB}, DType::kU8, kGpu); }
  // Lowering the budget under what is in use is refused.
  {
    Tensor c = Tensor::empty({100 * kMiB}, DType::kU8, kGpu);
    try {
      configure_device_memory(0, 64 * kMiB);
      ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
  const DeviceMemoryStats end = device_memory_stats(0);
  EXPECT_EQ(end.in_use, 0);
  EXPECT_EQ(end.num_allocations, 0);
  EXPECT_GE(end.peak_in_use, 250 * kMiB);
  release_cached_device_memory(0);
  const DeviceMemoryStats released = device_memory_stats(0);
  EXPECT_EQ(released.reserved, 0);
  // Nothing leaked to the driver: free device memory is back where it was (a little slack for
  // the runtime's own bookkeeping).
  EXPECT_GE(released.device_free, before.device_free - 8 * kMiB)
      << format_bytes(before.device_free) << " -> " << format_bytes(released.device_free);
}

TEST(DevicePoolGpu, RefusedCudaMallocIsOutOfMemory) {
  DefaultBudgetAfter restore;
  configure_device_memory(0, 0, 1.0);
  const DeviceMemoryStats s = device_memory_stats(0);
  // Within the budget (all of the device) but more than the driver can give.
  const std::string m = oom_of(s.device_total - 16 * kMiB);
  std::printf("  %s\n", m.c_str());
  EXPECT_NE(m.find("the device refused"), std::string::npos) << m;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // no sticky error left behind
  Tensor ok = Tensor::zeros({1024}, DType::kF32, kGpu);
  std::vector<float> host(1024, 1.0f);
  ASSERT_EQ(cudaMemcpy(host.data(), ok.data_ptr(), 4096, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : host) ASSERT_EQ(v, 0.0f);
}

TEST(DevicePoolGpu, FreedBlocksComeBackAtTheSameAddress) {
  DefaultBudgetAfter restore;
  for (int64_t bytes : {int64_t(3000), 10 * kMiB, 700 * kMiB}) {
    void* first = nullptr;
    {
      Tensor t = Tensor::empty({bytes}, DType::kU8, kGpu);
      first = t.data_ptr();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 512, 0u);
    }
    const int64_t reserved = device_memory_stats(0).reserved;
    Tensor again = Tensor::empty({bytes}, DType::kU8, kGpu);
    EXPECT_EQ(again.data_ptr(), first) << bytes;
    EXPECT_EQ(device_memory_stats(0).reserved, reserved) << "reuse must not grow the pool";
  }
  // A pool pointer is real device memory of cuda:0.
  Tensor t = Tensor::empty({1000}, DType::kF32, kGpu);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, t.data_ptr()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  EXPECT_EQ(&cuda_allocator(0), &default_allocator(kGpu));
}

// Zero-fill runs on the current stream: a reused block that held bytes reads back as zeros when
// the read is ordered on the same stream.
TEST(DevicePoolGpu, ZerosOnTheCurrentStream) {
  Stream s(kGpu);
  StreamGuard guard(s);
  void* p = nullptr;
  {
    Tensor dirty = Tensor::empty({1 << 20}, DType::kU8, kGpu);
    p = dirty.data_ptr();
    ASSERT_EQ(cudaMemsetAsync(p, 0xAB, 1 << 20, static_cast<cudaStream_t>(s.handle())),
              cudaSuccess);
  }
  Tensor z = Tensor::zeros({1 << 18}, DType::kF32, kGpu);
  EXPECT_EQ(z.data_ptr(), p);
  Tensor h = z.to(Device::cpu());  // ordered on s, synchronous
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.data<float>()[i], 0.0f) << i;
}
