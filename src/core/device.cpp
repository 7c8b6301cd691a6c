#include "longctx/core/device.h"

#include <fmt/format.h>

#include <charconv>

#include "longctx/core/error.h"
#include "longctx/core/stream.h"

namespace longctx {

std::string Device::str() const {
  return kind == DeviceKind::kCPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

#ifndef LONGCTX_WITH_CUDA
bool cuda_available() { return false; }
#endif

Device resolve_device(std::string_view spec) {
  if (spec == "auto") return cuda_available() ? Device::cuda(0) : Device::cpu();
  if (spec == "cpu") return Device::cpu();
  int index = 0;
  if (spec != "cuda") {
    const std::string_view prefix = "cuda:";
    const char* end = spec.data() + spec.size();
    auto [ptr, ec] = spec.starts_with(prefix)
                         ? std::from_chars(spec.data() + prefix.size(), end, index)
                         : std::from_chars_result{spec.data(), std::errc::invalid_argument};
    LONGCTX_CHECK(ec == std::errc() && ptr == end && index >= 0, ErrorCode::kInvalidArgument,
                  "unknown device '{}' (expected auto, cpu, cuda or cuda:N)", spec);
  }
  const int count = cuda_device_count();
  LONGCTX_CHECK(index < count, ErrorCode::kUnsupported,
                "device '{}': {}", spec,
                count == 0 ? std::string("no CUDA device is visible (or this build has no CUDA "
                                         "backend); use --device cpu")
                           : fmt::format("only {} CUDA device(s) are visible", count));
  return Device::cuda(index);
}

}  // namespace longctx
