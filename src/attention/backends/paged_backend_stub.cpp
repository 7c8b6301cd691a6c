// Build without CUDA: the paged GPU backend does not exist.
#ifndef LONGCTX_WITH_CUDA
#include "attention/backends/paged_backend.h"
#include "longctx/core/error.h"

namespace longctx {

std::unique_ptr<AttentionBackend> make_paged_attention_backend(
    const PagedKVPool&, int64_t, float, const PagedBackendLimits&, const SparseOptions&,
    const kernels::KernelTuning&, const KvGroups*, StatePool*, PagedPhaseHook*) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "paged GPU attention: this build of longctx has no CUDA backend (configure with "
                "-DLONGCTX_CUDA=ON)");
}

}  // namespace longctx
#endif
