// Sparse reading over an offloaded KV cache (docs/sparse.md, docs/offload.md): what a sparse
// policy adds to the offload path, apart from the ring protocol (OffloadDevice). The offload
// backend gets it once, with its device (OffloadDeviceParts::sparse: null unless the registry's
// policy selects a phase), and drives it per step:
//   takes_step()      asked after the planner placed the step's blocks and before anything
//                     loads: whether the reader attends this step itself, with no ring items
//                     (host blocks read in place or staged by the reader); a decode-only step
//                     under a decode policy (quest, streaming), a step with a prefill under a
//                     prefill policy (xattention, streaming; on the GPU when the step's host keys
//                     fit the staging);
//   plan()            every step, after the ring's begin_step: the engine's copy-on-write (the
//                     policy's metadata follows it) and, on a step it takes, where each block is;
//   on_keys_stored()  after the ring stored a layer's new K/V (the policy's metadata);
//   attend()          per layer of a step it takes, instead of the ring's attend_resident ..
//                     finish_layer.
// One implementation per device, each over its device's memory and driving the policy the
// registry builds for that device: the CPU simulation's (offload_sparse_cpu.cpp, the CPU
// reference policy) and the CUDA device's (offload_sparse_cuda.cu, the policy's CUDA twin).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "attention/backends/offload_planner.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/core/tensor.h"
#include "longctx/kv/block_copy.h"

namespace longctx {

class PhaseRecorder;  // phase_profile.h

class OffloadSparseReader {
 public:
  virtual ~OffloadSparseReader() = default;
  // block_loc: each batch.block_tables entry as (GPU block g >= 0, or host block h as -h - 1).
  virtual bool takes_step(const ForwardBatch& batch, std::span<const int32_t> block_loc) const = 0;
  // `plan` (the ring's step plan: its cache slots, its load wait ticket) and `batch` stay valid
  // until the step ends. block_loc as in takes_step on a step the reader takes, empty otherwise.
  virtual void plan(const ForwardBatch& batch, const OffloadStepPlan& plan,
                    std::span<const int32_t> block_loc, std::span<const KVBlockCopy> copies) = 0;
  // k [T, Hkv, d]: the step's new keys of `layer`, already stored by the ring.
  virtual void on_keys_stored(int64_t layer, const Tensor& k) = 0;
  // The layer's output [T, Hq * head_dim] in q's dtype.
  virtual Tensor attend(int64_t layer, const Tensor& q) = 0;
  // Host bytes read in place (or staged) so far, not through the ring (synchronizes).
  virtual int64_t host_bytes_read() const = 0;
  // Quest's page reuse (SparseOptions::quest_reuse): (page, KV head) pairs copied from the pages a
  // sequence kept last step instead of read, so far (synchronizes).
  virtual int64_t pages_reused() const { return 0; }
  // A prefill policy's key blocks kept and causal so far (synchronizes).
  virtual SparsePrefillCounters prefill_counters() const { return {}; }
  // A measurement mode (phase_profile.h): the policy marks its phases there (null: off).
  virtual void set_phase_recorder(PhaseRecorder* /*recorder*/) {}
  // CUDA graphs of its decode steps (AttentionBackend's, which the offload backend forwards):
  // the launches whose shape follows the plan (a decode policy's compact decode grid).
  virtual void begin_graph_capture() {}
  virtual std::unique_ptr<GraphLaunches> end_graph_capture() { return nullptr; }
};

// XAttention over an offloaded cache on the GPU stages the host blocks of a step: `buffers`
// buffers (the next layer's keys load while one computes) of `blocks` blocks (one max_model_len
// sequence's), after the GPU cache (xattention_offload_cuda.h). The memory plan counts them.
struct XAttnStaging {
  int64_t blocks = 0;  // per buffer: one sequence's blocks
  int64_t buffers = 0;
  int64_t max_seq_len = 0;  // tokens of that sequence: max_model_len, else the host pool's
  int64_t bytes(int64_t layer_block_bytes) const { return blocks * buffers * layer_block_bytes; }
};
XAttnStaging xattn_offload_staging(const OffloadGeometry& geometry, int64_t max_model_len);
// Logs (from host code) that a step did not fit the staging and runs dense through the ring.
void warn_xattn_staging_full();

}  // namespace longctx
