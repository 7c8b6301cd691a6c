// CUDA streams and events as RAII objects, the per-thread "current stream" every op launches on,
// and a device guard. The header is CUDA-free (handles are void*) so plain C++ code can hold
// streams; .cu code casts handle() to cudaStream_t / cudaEvent_t (see core/cuda_stream.h).
// In a build without CUDA, constructing a Stream or Event throws Error(kUnsupported).
#pragma once

#include <cstdint>

#include "longctx/core/device.h"

namespace longctx {

class Event;

// An owned, non-blocking cudaStream_t on one device.
class Stream {
 public:
  // priority: 0 = default; negative = higher (cudaDeviceGetStreamPriorityRange, clamped).
  explicit Stream(Device device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;

  void* handle() const { return handle_; }  // cudaStream_t
  Device device() const { return device_; }
  void synchronize() const;
  // Work queued on this stream after the call waits for `event` (no host wait).
  void wait(const Event& event) const;

 private:
  void* handle_ = nullptr;
  Device device_;
};

// An owned cudaEvent_t. Timing is off unless asked for (timing events cost more to record).
class Event {
 public:
  explicit Event(Device device, bool enable_timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void* handle() const { return handle_; }  // cudaEvent_t
  Device device() const { return device_; }
  void record(const Stream& stream);
  void record_on(void* stream);  // a raw cudaStream_t (e.g. current_stream())
  void synchronize() const;
  bool query() const;  // true when the work before record() finished
  // Milliseconds from `start` to this event (both recorded, timing enabled).
  float elapsed_ms_since(const Event& start) const;

 private:
  void* handle_ = nullptr;
  Device device_;
};

// The stream ops launch on for `device` from this thread: the one a StreamGuard set, else the
// legacy default stream (nullptr) of that device.
void* current_stream(int device = 0);

// Makes `stream` the current stream of its device for this thread until destroyed (nests).
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  void* prev_;
};

// Sets the current CUDA device for the scope and restores the previous one (no-op without CUDA
// when device < 0).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Number of visible CUDA devices (0 in a build without CUDA or with no GPU).
int cuda_device_count();

// Facts about one GPU, queried once per device and cached (thread-safe).
struct DeviceProperties {
  int index = 0;
  char name[256] = {};
  int sm_major = 0, sm_minor = 0;
  int num_sms = 0;
  int64_t total_memory = 0;            // bytes
  int64_t max_shared_memory_per_block_optin = 0;
};
const DeviceProperties& device_properties(int device);

// Synchronizes the device (all streams). Throws Error(kCuda) with the pending error, if any.
void device_synchronize(int device = 0);

}  // namespace longctx
