#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/stream_limits.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace {

// Per thread, per device: the stream a StreamGuard made current (nullptr = legacy default).
thread_local void* t_current[kMaxCudaDevices] = {};

void check_device_index(int device, const char* what) {
  LONGCTX_CHECK(device >= 0 && device < kMaxCudaDevices, ErrorCode::kInvalidArgument,
                "{}: device index {} out of range [0, {})", what, device, kMaxCudaDevices);
}

void check_cuda_device(Device device, const char* what) {
  LONGCTX_CHECK(device.is_cuda(), ErrorCode::kInvalidArgument, "{} needs a CUDA device, got {}",
                what, device.str());
  check_device_index(device.index, what);
  const int n = cuda_device_count();
  LONGCTX_CHECK(device.index < n, ErrorCode::kInvalidArgument,
                "{}: {} does not exist ({} CUDA device(s) visible)", what, device.str(), n);
}

}  // namespace

Stream::Stream(Device device, int priority) : device_(device) {
  check_cuda_device(device, "Stream");
  DeviceGuard g(device.index);
  int least = 0, greatest = 0;  // greatest is the most negative (highest) priority
  LONGCTX_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int p = std::clamp(priority, greatest, least);
  cudaStream_t s = nullptr;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, p));
  handle_ = s;
}

Stream::~Stream() {
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

Stream::Stream(Stream&& other) noexcept : handle_(other.handle_), device_(other.device_) {
  other.handle_ = nullptr;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  std::swap(handle_, other.handle_);
  std::swap(device_, other.device_);
  return *this;
}

void Stream::synchronize() const {
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

void Stream::wait(const Event& event) const {
  LONGCTX_CHECK(event.handle(), ErrorCode::kInvalidArgument, "Stream::wait on a moved-from Event");
  LONGCTX_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(handle_),
                                         static_cast<cudaEvent_t>(event.handle()), 0));
}

Event::Event(Device device, bool enable_timing) : device_(device) {
  check_cuda_device(device, "Event");
  DeviceGuard g(device.index);
  cudaEvent_t e = nullptr;
  LONGCTX_CUDA_CHECK(
      cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = e;
}

Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

Event::Event(Event&& other) noexcept : handle_(other.handle_), device_(other.device_) {
  other.handle_ = nullptr;
}

Event& Event::operator=(Event&& other) noexcept {
  std::swap(handle_, other.handle_);
  std::swap(device_, other.device_);
  return *this;
}

void Event::record(const Stream& stream) {
  LONGCTX_CHECK(stream.device() == device_, ErrorCode::kInvalidArgument,
                "Event on {} recorded on a stream of {}", device_.str(), stream.device().str());
  record_on(stream.handle());
}

void Event::record_on(void* stream) {
  // The legacy default stream (nullptr) is the current device's: record with ours current.
  DeviceGuard g(device_.index);
  LONGCTX_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream)));
}

void Event::synchronize() const {
  LONGCTX_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

bool Event::query() const {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (err == cudaErrorNotReady) return false;
  LONGCTX_CUDA_CHECK(err);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  LONGCTX_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                          static_cast<cudaEvent_t>(handle_)));
  return ms;
}

void* current_stream(int device) {
  check_device_index(device, "current_stream");
  return t_current[device];
}

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device().index) {
  check_device_index(device_, "StreamGuard");
  prev_ = t_current[device_];
  t_current[device_] = stream.handle();
}

StreamGuard::~StreamGuard() { t_current[device_] = prev_; }

DeviceGuard::DeviceGuard(int device) {
  if (device < 0) return;
  int cur = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device) {
    const cudaError_t err = cudaSetDevice(device);
    if (err == cudaErrorInvalidDevice) {
      cudaGetLastError();
      LONGCTX_THROW(ErrorCode::kInvalidArgument, "cuda:{} does not exist ({} CUDA device(s))",
                    device, cuda_device_count());
    }
    LONGCTX_CUDA_CHECK(err);
  }
  prev_ = cur;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) cudaSetDevice(prev_);
}

int cuda_device_count() {
  // Asked once: the count cannot change in a process, and cudaGetDeviceCount is not free.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver / no device: not an error for the caller
      return 0;
    }
    return std::min(n, kMaxCudaDevices);
  }();
  return count;
}

const DeviceProperties& device_properties(int device) {
  static DeviceProperties props[kMaxCudaDevices];
  static std::once_flag once[kMaxCudaDevices];
  check_cuda_device(Device::cuda(device), "device_properties");
  std::call_once(once[device], [device] {
    cudaDeviceProp p{};
    LONGCTX_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    int smem_optin = 0;
    LONGCTX_CUDA_CHECK(
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    DeviceProperties& d = props[device];
    d.index = device;
    std::strncpy(d.name, p.name, sizeof(d.name) - 1);
    d.sm_major = p.major;
    d.sm_minor = p.minor;
    d.num_sms = p.multiProcessorCount;
    d.total_memory = static_cast<int64_t>(p.totalGlobalMem);
    d.max_shared_memory_per_block_optin = smem_optin;
  });
  return props[device];
}

void device_synchronize(int device) {
  DeviceGuard g(device);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace longctx
