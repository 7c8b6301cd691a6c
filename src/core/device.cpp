#include "longctx/core/device.h"

#include <fmt/format.h>

namespace longctx {

std::string Device::str() const {
  return kind == DeviceKind::kCPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

#ifndef LONGCTX_WITH_CUDA
bool cuda_available() { return false; }
#endif

}  // namespace longctx
