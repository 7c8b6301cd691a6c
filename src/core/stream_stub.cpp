// Build without CUDA: streams and events cannot be made, the current stream is the (absent)
// default stream, and there are no devices.
#ifndef LONGCTX_WITH_CUDA
#include <utility>

#include "longctx/core/error.h"
#include "longctx/core/stream.h"

namespace longctx {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "{}: this build of longctx has no CUDA backend (configure with -DLONGCTX_CUDA=ON)",
                what);
}
}  // namespace

Stream::Stream(Device device, int) : device_(device) { no_cuda("Stream"); }
Stream::~Stream() = default;
Stream::Stream(Stream&& other) noexcept : handle_(other.handle_), device_(other.device_) {
  other.handle_ = nullptr;
}
Stream& Stream::operator=(Stream&& other) noexcept {
  std::swap(handle_, other.handle_);
  std::swap(device_, other.device_);
  return *this;
}
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
void Stream::wait(const Event&) const { no_cuda("Stream::wait"); }

Event::Event(Device device, bool) : device_(device) { no_cuda("Event"); }
Event::~Event() = default;
Event::Event(Event&& other) noexcept : handle_(other.handle_), device_(other.device_) {
  other.handle_ = nullptr;
}
Event& Event::operator=(Event&& other) noexcept {
  std::swap(handle_, other.handle_);
  std::swap(device_, other.device_);
  return *this;
}
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::record_on(void*) { no_cuda("Event::record_on"); }
void Event::synchronize() const { no_cuda("Event::synchronize"); }
bool Event::query() const { no_cuda("Event::query"); }
float Event::elapsed_ms_since(const Event&) const { no_cuda("Event::elapsed_ms_since"); }

void* current_stream(int) { return nullptr; }

// Unreachable in practice (no Stream can exist), but well-defined.
StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device().index), prev_(nullptr) {}
StreamGuard::~StreamGuard() = default;

DeviceGuard::DeviceGuard(int device) {
  if (device >= 0) no_cuda("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;

int cuda_device_count() { return 0; }

const DeviceProperties& device_properties(int device) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "device_properties(cuda:{}): this build of longctx has no CUDA backend", device);
}

void device_synchronize(int) { no_cuda("device_synchronize"); }

}  // namespace longctx
#endif
