#include "attention/backends/offload_sparse.h"

#include <algorithm>

#include "longctx/core/logging.h"

namespace longctx {

XAttnStaging xattn_offload_staging(const OffloadGeometry& g, int64_t max_model_len) {
  const int64_t tokens = max_model_len > 0 ? max_model_len : g.num_host_blocks * g.block_size;
  return {std::min<int64_t>((tokens + g.block_size - 1) / g.block_size, g.num_host_blocks),
          std::min<int64_t>(2, g.num_layers), tokens};
}

void warn_xattn_staging_full() {
  LONGCTX_LOG_WARN(
      "xattention with KV offload: a step's host blocks exceed the GPU staging (one "
      "max_model_len sequence); such steps run dense attention through the ring");
}

}  // namespace longctx
