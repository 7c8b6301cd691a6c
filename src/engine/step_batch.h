// Executor steps -> the model's ForwardBatch: flat ids and positions, each sequence's block
// table and the slots its new tokens go to (shared by the CPU and GPU executors).
#pragma once

#include <cstdint>
#include <span>

#include "kv/state_pool.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/engine/executor.h"

namespace longctx {

// Throws Error(kInternal) when an input's block table is too short for its tokens. `groups`
// (the executor's KV groups in order, or empty: every group paged) marks state groups, whose
// table is one state slot per sequence and who get no token slots.
ForwardBatch make_forward_batch(std::span<const StepInput> inputs, int64_t block_size,
                                std::span<const KvGroupAlloc> groups = {});

// A state group's slots: [0, num_seqs) the sequences', then num_snapshots snapshots.
struct StateSlots {
  StatePool* pool = nullptr;  // null: the model has no state group
  int64_t group = 0;          // the state group's index (> 0)
  int64_t num_seqs = 0;
  int64_t num_snapshots = 0;
};
// A prefix hit's state comes from its snapshot before the step (save false: each input's
// state_restore); a chunk ending on a block boundary leaves one after it (save true:
// state_save). Counts the copies into `counters`. Throws Error(kInternal), naming `who`, for a
// snapshot or slot out of range, or a snapshot named without a state group.
void copy_state_snapshots(const StateSlots& slots, std::span<const StepInput> inputs, bool save,
                          ExecutorCounters& counters, const char* who);

// The model part of an executor's step, after its block copies, shared by the CPU executor and
// the GPU runner: the prefix hits' states restored, `forward()` (the model over the step's
// ForwardBatch: eager, a graph replay or through offload), the boundary snapshots saved.
template <class Forward>
Tensor run_model_step(const StateSlots& slots, std::span<const StepInput> inputs,
                      ExecutorCounters& counters, const char* who, Forward&& forward) {
  copy_state_snapshots(slots, inputs, /*save=*/false, counters, who);
  Tensor logits = forward();
  copy_state_snapshots(slots, inputs, /*save=*/true, counters, who);
  return logits;
}

}  // namespace longctx
