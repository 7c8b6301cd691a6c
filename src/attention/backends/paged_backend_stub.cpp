// Build without CUDA: the paged GPU backend does not exist.
#ifndef LONGCTX_WITH_CUDA
#include "attention/backends/paged_backend.h"
#include "longctx/core/error.h"

namespace longctx {

std::unique_ptr<AttentionBackend> make_paged_attention_backend(const PagedKVPool&, int64_t, float,
                                                               const PagedBackendLimits&,
                                                               const SparseOptions&) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "paged GPU attention: this build of longctx has no CUDA backend (configure with "
                "-DLONGCTX_CUDA=ON)");
}

int64_t paged_decode_grid(const AttentionBackend&) { return 0; }
std::vector<void*> take_captured_decode_nodes(AttentionBackend&) { return {}; }
void paged_backend_copy_blocks(AttentionBackend&, std::span<const KVBlockCopy>) {}
SparsePrefillCounters paged_backend_sparse_prefill_counters(const AttentionBackend&) { return {}; }

}  // namespace longctx
#endif
