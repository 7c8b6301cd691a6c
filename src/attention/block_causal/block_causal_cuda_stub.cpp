// Build without CUDA: block-causal attention runs only on the CPU. RaggedBlockCausalAttention
// asks block_causal_cuda_compiled() before anything else here, so the CPU path never reaches
// these; the throws guard any other caller.
#ifndef LONGCTX_WITH_CUDA
#include "attention/block_causal/block_causal_cuda.h"
#include "longctx/core/error.h"

namespace longctx::detail {

namespace {
[[noreturn]] void no_cuda() {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "block-causal attention on a CUDA device: this build of longctx has no CUDA "
                "backend (configure with -DLONGCTX_CUDA=ON)");
}
}  // namespace

bool block_causal_cuda_compiled() { return false; }

BlockCausalCuda* block_causal_cuda_create(int, int64_t, int64_t) { no_cuda(); }
// create() never returns a state here, so there is none to free; and a destructor calls this, so
// it must not throw.
void block_causal_cuda_destroy(BlockCausalCuda*) {}
void block_causal_cuda_reserve(BlockCausalCuda*, int64_t, int64_t) { no_cuda(); }
size_t block_causal_cuda_workspace_bytes(int64_t, int64_t, int, int64_t) { no_cuda(); }
int64_t block_causal_cuda_work_cap(int64_t, int64_t, int) { no_cuda(); }
void block_causal_cuda_plan(BlockCausalCuda*, const int32_t*, const int32_t*, const int32_t*,
                            const int32_t*, const int32_t*, int64_t, int64_t, int, int, int,
                            int64_t, int64_t, void*, size_t, void*) {
  no_cuda();
}
void block_causal_cuda_run(BlockCausalCuda*, const void*, const void*, const void*, void*, int, int,
                           int, DType, float, void*) {
  no_cuda();
}

}  // namespace longctx::detail
#endif
