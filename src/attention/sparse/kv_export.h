// Whether a KV cache's blocks can go to and come from a KV store shared by replicas
// (docs/fleet.md, "Shared KV store"), beside the policy registry that answers the policy's part.
#pragma once

#include "longctx/attention/kv_groups.h"
#include "longctx/attention/sparse_options.h"

namespace longctx::sparse {

// A KV cache of blocks (`cache`: a resident pool, or the host pool under KV offload), one
// full-attention KV group, and a policy that selects nothing (its per-block summaries would not
// see an imported block). The one answer the CPU executor and the GPU runner give.
bool exports_kv_blocks(bool cache, const KvGroups& groups, const SparseOptions& options);

}  // namespace longctx::sparse
