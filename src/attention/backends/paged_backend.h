// The GPU-resident paged attention backend: K/V of every sequence live in a PagedKVPool; plan()
// checks the batch's block tables and slot mapping against the pool, stages the index arrays
// into one pinned buffer and copies them to the device once per step; per layer store_kv()
// writes the new tokens into their slots and attend() runs the paged kernels the dispatcher
// (paged_dispatch.h, shared with the CUDA offload device) picks under the backend's KernelTuning:
//   every sequence decoding (q_len 1) and head_dim 64/128 -> split-KV decode (decode.h);
//   head_dim 64/128 otherwise                               -> paged prefill (prefill.h);
//   any other head_dim (8..256), or KernelTuning::attention kGeneric -> the generic kernel
//   (paged_generic.h).
// An FP8 pool (PagedKVPoolConfig::fp8(): codes + per (block, KV head) scales) takes the same
// kernels reading FP8 (its prefill is the mma.sync kernel); sparse policies refuse it.
// Nothing after plan() reads host memory or synchronizes. With ForwardBatch::fixed_launch_shapes
// (decode batches, or any batch on the generic kernel) every device address and launch shape
// depends on the batch size alone, except the split-KV decode kernel's grid: a CUDA graph
// captured after one plan() (begin_graph_capture / end_graph_capture) replays any later plan()
// of the same size once GraphLaunches::update() gave its decode kernel nodes that grid.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kv/paged_kv_pool.h"
#include "kv/state_pool.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/attention/sparse_options.h"
#include "longctx/kernels/kernel_tuning.h"
#include "longctx/kv/block_copy.h"

namespace longctx {

class PhaseRecorder;  // phase_profile.h

struct PagedBackendLimits {
  int64_t max_tokens = 0;   // tokens per step
  int64_t max_seqs = 0;     // sequences per step
  int64_t max_blocks = 0;   // block-table entries per step (all sequences)
  int64_t max_seq_len = 0;  // keys per sequence, 0: unchecked (sparse policies size buffers by it)
};

// Throws Error(kUnsupported) in a build without CUDA, for a pool not on a CUDA device, or for a
// shape no kernel takes. `tuning` (defaults: the measured choices) steers the kernels. The
// sparse policy's CUDA twin comes from the registry (attention/sparse/sparse_policy_cuda.h): a
// decode policy (quest, streaming) reads its pages on decode steps (other steps run dense, and
// CUDA graphs' steps too unless the policy's PolicyDef::decode_graphs: quest's replay its select,
// gather and compact decode, whose grid GraphLaunches update as the dense decode's), a prefill
// policy (xattention, streaming) masks steps with a prefill (head_dim
// 64 / 128).
//
// KV groups (optional; null or one full group: pool layer = model layer, one table): each layer
// reads and writes its group's tables and pool layer (groups->pool_layer), and a sliding group's
// kernels take its window over tables trimmed to the blocks from the one holding the first new
// token's window start (the dropped ones before it are never named). limits.max_blocks holds per
// group. Sparse policies run models of one full group only.
//
// State groups (linear attention; listed after the paged groups) need `states`, a StatePool on
// the pool's device whose slots the state group's tables name: plan() zeroes the slot of every
// sequence whose step starts at its first token, copies every linear-attention layer's state
// pointers (and qo_indptr, with the index arrays) to device arrays whose addresses follow the
// batch size alone, and linear_states() hands a layer views of them (LinearLayerStates' device
// form): decode graphs of state models replay them like the page tables.
// phase_hook, where given, is set to the backend's switch for a measurement mode
// (phase_profile.h): hook(recorder) makes its sparse policy mark its phases on recorder (null:
// off); valid while the backend lives.
using PagedPhaseHook = std::function<void(PhaseRecorder*)>;
std::unique_ptr<AttentionBackend> make_paged_attention_backend(
    const PagedKVPool& pool, int64_t num_qo_heads, float sm_scale, const PagedBackendLimits& limits,
    const SparseOptions& sparse = {}, const kernels::KernelTuning& tuning = {},
    const KvGroups* groups = nullptr, StatePool* states = nullptr,
    PagedPhaseHook* phase_hook = nullptr);
// The checks plan() makes on the host, exposed for tests: block ids inside the pool, each
// sequence's table long enough for its kv_len, every new token's slot equal to the one its
// table names, sizes within `limits` (keys per sequence too where max_seq_len > 0). Throws
// Error(kInvalidArgument / kOutOfRange) naming the first problem.
void check_paged_batch(const ForwardBatch& batch, int64_t block_size, int64_t num_blocks,
                       const PagedBackendLimits& limits);
// Its sizes part, for any number of KV groups: tokens and sequences per step, each group's table
// entries, keys per sequence (where max_seq_len > 0). Throws Error(kOutOfRange).
void check_paged_limits(const ForwardBatch& batch, const PagedBackendLimits& limits);
// check_paged_batch for every KV group of a multi-group batch: each group's tables (a sliding
// group's may name -1 for blocks wholly before the window of the sequence's first new token),
// slots and the positions. Throws Error(kInvalidArgument / kOutOfRange) naming the problem.
// A state group's table names one slot per sequence (below num_state_slots) and no token slots.
void check_group_batch(const ForwardBatch& batch, const KvGroups& groups, int64_t block_size,
                       int64_t num_blocks, int64_t num_state_slots = 0);
// Linear-attention layer `layer`'s states for each sequence of a planned batch: its state
// group's table names the sequence's slot of `states`. `who` names the backend in errors;
// throws Error(kInvalidArgument) for a layer that keeps no state (or no pool).
LinearLayerStates paged_linear_states(const ForwardBatch& batch, const KvGroups* groups,
                                      const StatePool* states, int64_t layer, const char* who);
// Zeroes the state slots of the sequences whose step starts at their first token (a slot may
// have held an earlier sequence's); a later start continues its own state, or the prefix hit's
// snapshot the executor copied into its slot before the step. Nothing without a pool.
void reset_new_sequence_states(const ForwardBatch& batch, const KvGroups* groups,
                               StatePool* states);

}  // namespace longctx
