// Streams, events, the per-thread current stream and the device guard on a real GPU.
#include "longctx/core/stream.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "core/cuda_stream.h"
#include "gpu_core/spin_kernel.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

using namespace longctx;

namespace {
const Device kGpu = Device::cuda(0);

template <typename F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;  // "did not throw"
}
}  // namespace

TEST(Device, CountAndProperties) {
  ASSERT_GE(cuda_device_count(), 1);
  EXPECT_TRUE(cuda_available());
  const DeviceProperties& p = device_properties(0);
  std::printf("  cuda:0 %s sm_%d%d, %d SMs, %.1f GiB, %lld B smem opt-in\n", p.name, p.sm_major,
              p.sm_minor, p.num_sms, double(p.total_memory) / (1 << 30),
              static_cast<long long>(p.max_shared_memory_per_block_optin));
  EXPECT_GT(std::strlen(p.name), 0u);
  EXPECT_GE(p.sm_major, 8);
  EXPECT_GT(p.num_sms, 0);
  EXPECT_GT(p.total_memory, int64_t(1) << 30);
  EXPECT_GE(p.max_shared_memory_per_block_optin, 48 << 10);
  EXPECT_EQ(&device_properties(0), &p);  // cached
  EXPECT_EQ(code_of([] { device_properties(cuda_device_count()); }), ErrorCode::kInvalidArgument);
  device_synchronize(0);
}

TEST(Device, GuardSetsAndRestores) {
  int cur = -1;
  ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
  {
    DeviceGuard g(0);
    int in = -1;
    ASSERT_EQ(cudaGetDevice(&in), cudaSuccess);
    EXPECT_EQ(in, 0);
  }
  { DeviceGuard none(-1); }
  int after = -1;
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, cur);
  EXPECT_EQ(code_of([] { DeviceGuard g(cuda_device_count()); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the refused index left no sticky error
}

TEST(Stream, CreateMovePriorityAndBadDevices) {
  Stream a(kGpu);
  ASSERT_NE(a.handle(), nullptr);
  Stream hi(kGpu, -100);  // clamped to the device's range
  int prio = 0, least = 0, greatest = 0;
  ASSERT_EQ(cudaStreamGetPriority(cuda_handle(hi), &prio), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_EQ(prio, greatest);
  void* h = a.handle();
  Stream b(std::move(a));
  EXPECT_EQ(b.handle(), h);
  EXPECT_EQ(a.handle(), nullptr);
  b.synchronize();
  EXPECT_EQ(code_of([] { Stream s(Device::cpu()); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { Stream s(Device::cuda(cuda_device_count())); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { Event e(Device::cuda(99)); }), ErrorCode::kInvalidArgument);
}

TEST(Event, ElapsedTimeAndQuery) {
  Stream s(kGpu);
  Event start(kGpu, true), stop(kGpu, true);
  int* flag = nullptr;
  ASSERT_EQ(cudaMalloc(&flag, sizeof(int)), cudaSuccess);
  start.record(s);
  gpu_test::launch_spin(cuda_handle(s), 50'000'000, flag, 1);  // 50 ms
  stop.record(s);
  EXPECT_FALSE(stop.query());  // the spin is still running
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  const float ms = stop.elapsed_ms_since(start);
  std::printf("  50 ms spin measured %.2f ms\n", ms);
  EXPECT_GE(ms, 49.0f);
  EXPECT_LT(ms, 500.0f);
  // Timing off: elapsed time is refused with a CUDA error, not garbage.
  Event plain(kGpu);
  plain.record(s);
  plain.synchronize();
  EXPECT_EQ(code_of([&] { plain.elapsed_ms_since(start); }), ErrorCode::kCuda);
  cudaGetLastError();
  // record_on a raw handle (the legacy default stream too).
  plain.record_on(nullptr);
  plain.synchronize();
  EXPECT_EQ(code_of([&] {
              Stream other(kGpu);
              Event e(kGpu);
              e.record(other);
              Event moved(std::move(e));
              other.wait(e);  // moved-from
            }),
            ErrorCode::kInvalidArgument);
  cudaFree(flag);
}

// Stream::wait orders another stream behind an event without a host wait: the copy on `reader`
// sees the value the spin kernel on `writer` stores 30 ms later.
TEST(Stream, WaitOrdersStreams) {
  Stream writer(kGpu), reader(kGpu);
  int* flag = nullptr;
  int* host = nullptr;
  ASSERT_EQ(cudaMalloc(&flag, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&host, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(flag, 0, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  *host = -1;
  Event written(kGpu);
  gpu_test::launch_spin(cuda_handle(writer), 30'000'000, flag, 42);
  written.record(writer);
  reader.wait(written);
  ASSERT_EQ(cudaMemcpyAsync(host, flag, sizeof(int), cudaMemcpyDeviceToHost, cuda_handle(reader)),
            cudaSuccess);
  reader.synchronize();
  EXPECT_EQ(*host, 42);
  cudaFreeHost(host);
  cudaFree(flag);
}

TEST(StreamGuard, NestsAndIsPerThread) {
  EXPECT_EQ(current_stream(0), nullptr);
  Stream s1(kGpu), s2(kGpu);
  {
    StreamGuard g1(s1);
    EXPECT_EQ(current_stream(0), s1.handle());
    EXPECT_EQ(current_cuda_stream(0), cuda_handle(s1));
    {
      StreamGuard g2(s2);
      EXPECT_EQ(current_stream(0), s2.handle());
      void* seen = reinterpret_cast<void*>(1);
      std::thread t([&] { seen = current_stream(0); });
      t.join();
      EXPECT_EQ(seen, nullptr);  // another thread has its own current stream
      {
        StreamGuard again(s1);
        EXPECT_EQ(current_stream(0), s1.handle());
      }
      EXPECT_EQ(current_stream(0), s2.handle());
    }
    EXPECT_EQ(current_stream(0), s1.handle());
    EXPECT_EQ(current_stream(1), nullptr);  // per device
  }
  EXPECT_EQ(current_stream(0), nullptr);
  EXPECT_EQ(code_of([] { current_stream(-1); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { current_stream(16); }), ErrorCode::kInvalidArgument);
}
