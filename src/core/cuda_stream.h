// Internal, for .cu code: the CUDA types behind stream.h's void* handles.
#pragma once

#include <cuda_runtime.h>

#include "longctx/core/stream.h"

namespace longctx {

// The stream kernels for `device` launch on from this thread (see current_stream()).
inline cudaStream_t current_cuda_stream(int device) {
  return static_cast<cudaStream_t>(current_stream(device));
}
inline cudaStream_t cuda_handle(const Stream& stream) {
  return static_cast<cudaStream_t>(stream.handle());
}
inline cudaEvent_t cuda_handle(const Event& event) {
  return static_cast<cudaEvent_t>(event.handle());
}

}  // namespace longctx
