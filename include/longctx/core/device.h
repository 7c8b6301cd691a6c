#pragma once

#include <string>

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

}  // namespace longctx
