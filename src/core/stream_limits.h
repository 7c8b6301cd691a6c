// Internal: the fixed number of CUDA devices the per-device tables (current streams, device
// pools, cached properties) are sized for.
#pragma once

namespace longctx {

inline constexpr int kMaxCudaDevices = 16;

}  // namespace longctx
