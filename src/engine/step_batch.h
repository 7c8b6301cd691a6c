// Executor steps -> the model's ForwardBatch: flat ids and positions, each sequence's block
// table and the slots its new tokens go to (shared by the CPU and GPU executors).
#pragma once

#include <cstdint>
#include <span>

#include "longctx/attention/forward_batch.h"
#include "longctx/engine/executor.h"

namespace longctx {

// Throws Error(kInternal) when an input's block table is too short for its tokens. `groups`
// (the executor's KV groups in order, or empty: every group paged) marks state groups, whose
// table is one state slot per sequence and who get no token slots.
ForwardBatch make_forward_batch(std::span<const StepInput> inputs, int64_t block_size,
                                std::span<const KvGroupAlloc> groups = {});

}  // namespace longctx
