// Builds without NCCL (no CUDA, or a toolkit without it): GPU communicators are unavailable.
#ifndef LONGCTX_WITH_NCCL
#include "longctx/core/communicator.h"
#include "longctx/core/error.h"

namespace longctx {

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<int>&) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "tensor parallelism on GPUs needs NCCL; this build has none (configure with "
                "-DLONGCTX_CUDA=ON and a CUDA toolkit that ships NCCL)");
}

}  // namespace longctx
#endif  // LONGCTX_WITH_NCCL
