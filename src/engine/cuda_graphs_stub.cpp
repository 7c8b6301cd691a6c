// Build without CUDA: decode graphs do not exist (the host-side logic in cuda_graphs.cpp does).
#ifndef LONGCTX_WITH_CUDA
#include "engine/cuda_graphs.h"
#include "longctx/core/error.h"

namespace longctx {

struct DecodeGraphs::Impl {
  std::vector<int64_t> buckets;
};

DecodeGraphs::DecodeGraphs(Model&, AttentionBackend&, PagedKVPool&, const DecodeGraphOptions&) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "CUDA graphs: this build of longctx has no CUDA backend (configure with "
                "-DLONGCTX_CUDA=ON)");
}
DecodeGraphs::DecodeGraphs(Model&, AttentionBackend&, const DecodeGraphKv&,
                           const DecodeGraphOptions&) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "CUDA graphs: no CUDA backend in this build");
}
DecodeGraphs::~DecodeGraphs() = default;
void DecodeGraphs::capture() {}
bool DecodeGraphs::captured() const { return false; }
const std::vector<int64_t>& DecodeGraphs::buckets() const { return impl_->buckets; }
int32_t DecodeGraphs::scratch_block() const { return -1; }
bool DecodeGraphs::can_run(const ForwardBatch&) const { return false; }
Tensor DecodeGraphs::run(const ForwardBatch&) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "CUDA graphs: no CUDA backend in this build");
}
int64_t DecodeGraphs::memory_bytes() const { return 0; }
double DecodeGraphs::capture_seconds() const { return 0; }
int64_t DecodeGraphs::grid_updates() const { return 0; }

}  // namespace longctx
#endif
