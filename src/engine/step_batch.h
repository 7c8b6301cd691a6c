// Executor steps -> the model's ForwardBatch: flat ids and positions, each sequence's block
// table and the slots its new tokens go to (shared by the CPU and GPU executors).
#pragma once

#include <cstdint>
#include <span>

#include "longctx/attention/forward_batch.h"
#include "longctx/engine/executor.h"

namespace longctx {

// Throws Error(kInternal) when an input's block table is too short for its tokens.
ForwardBatch make_forward_batch(std::span<const StepInput> inputs, int64_t block_size);

}  // namespace longctx
