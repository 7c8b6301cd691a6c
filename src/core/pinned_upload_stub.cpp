// Build without CUDA: there is no device to upload to.
#ifndef LONGCTX_WITH_CUDA
#include "longctx/core/error.h"
#include "longctx/core/pinned_upload.h"

namespace longctx {

struct PinnedUploader::Impl {};

PinnedUploader::PinnedUploader(int device, size_t, int) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "PinnedUploader(cuda:{}): this build of longctx has no CUDA backend (configure "
                "with -DLONGCTX_CUDA=ON)",
                device);
}
PinnedUploader::~PinnedUploader() = default;
void PinnedUploader::upload(const void*, void*, size_t) {}
void PinnedUploader::finish() {}
size_t PinnedUploader::bytes() const { return 0; }
double PinnedUploader::seconds() const { return 0; }

}  // namespace longctx
#endif
