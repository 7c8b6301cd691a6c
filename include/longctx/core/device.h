#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace longctx {

enum class DeviceKind : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::kCUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  bool is_cuda() const { return kind == DeviceKind::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// True when this build has CUDA and a device is visible.
bool cuda_available();

// "auto" (cuda:0 when a GPU is visible, else cpu), "cpu", "cuda" (= cuda:0) or "cuda:N". Throws
// Error(kInvalidArgument) for another spelling, Error(kUnsupported) for a CUDA device this build
// or machine does not have.
Device resolve_device(std::string_view spec);

}  // namespace longctx
