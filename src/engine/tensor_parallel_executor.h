// An executor over the ranks of a tensor-parallel model (docs/tensor_parallel.md): each step runs
// on every rank at once, rank 0 on the calling thread and each other rank on a worker thread of
// its own, since the collectives inside the forward need every rank; rank 0's logits are the
// step's and rank 0 samples. Every rank receives the same inputs, so a malformed step fails on
// every rank before its first collective.
#pragma once

#include <memory>
#include <vector>

#include "longctx/engine/executor.h"

namespace longctx {

// `ranks[r]` runs rank r's model (same KV layout on every rank) on `devices[r]`: a CUDA rank's
// thread makes its device current for the step. Throws Error(kInvalidArgument) for no ranks, a
// device list of another length, or ranks whose KV layouts differ.
std::unique_ptr<Executor> make_tensor_parallel_executor(
    std::vector<std::unique_ptr<Executor>> ranks, std::vector<Device> devices);

}  // namespace longctx
