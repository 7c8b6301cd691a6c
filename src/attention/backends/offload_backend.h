// Attention over a KV cache offloaded to host memory (docs/offload.md). The backend plans each
// step with the OffloadPlanner (which blocks are resident on the GPU, which stream from the host)
// and drives an OffloadDevice through it:
//   plan():      pre-step moves (evicted dirty blocks out, copy-on-write, reloads), then the
//                ring's first num_slots loads;
//   store_kv(l): the new tokens into their resident blocks;
//   attend(l):   in-place attention over the resident blocks (causal, with LSE), then each ring
//                item of layer l: wait for its slot, attend (not causal, LSE), accumulate,
//                release the slot and queue the load num_slots items ahead (the next layer's
//                blocks load while this layer computes); the merged state is the output;
//   after the last layer: write-back of the blocks the step filled.
// The device is the CUDA one (copy streams, events; offload_device_cuda.cu) or the CPU
// simulation (offload_device_cpu.cpp: memcpy as the copy engine, a ring that throws when a slot
// is overwritten before its reader released it, write-backs that land late), which runs the same
// plans in CI. Under a sparse policy the device comes with a sparse reader over its memory
// (offload_sparse.h), which the backend asks, once the planner placed the step's blocks and
// before anything loads, whether it attends the step itself (then the step has no ring items).
//
// KV groups (issue 44: Gemma 3, Mistral with a sliding window): only the full group (group 0) is
// offloaded. A sliding group's KV per sequence is bounded by its window (plus a step), so it never
// needs the host: its blocks come from the BlockManager's window pool (ids from the host pool's
// size on) and stay resident in a paged pool of their own, read by a resident paged backend (the
// CUDA one, or the CPU reference in CI) over KvGroups::without_first(). Each layer goes where its
// group is: a full layer through the planner's resident blocks and the ring (offload layer =
// its pool layer), a sliding layer to the resident backend. The geometry's layers are the full
// group's, and the host pool and GPU cache hold only them; a sparse policy (Quest, XAttention)
// reads the device's memory and so selects over the full group's layers only, while a window
// layer reads its window, which is small already.
//
// Linear-attention state groups (issue 46: Qwen3-Next) are the same split: a sequence's states
// have a fixed size, so they stay resident in a StatePool (the executor's, on the ring's device)
// and never touch the host pool or the ring; only the full group's blocks move. The backend
// zeroes a new sequence's slot in plan() and hands a linear layer its sequences' slots
// (linear_states, the host form: offloaded steps are never captured in graphs); the executor
// copies the prefix cache's snapshots in and out of the pool around the step, as when resident.
// A model with both sliding and state groups is not offloaded (KvGroups::offloadable()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "attention/backends/offload_planner.h"
#include "attention/backends/offload_sparse.h"
#include "attention/backends/paged_backend.h"
#include "kernels/kv_format.h"
#include "kv/state_pool.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/attention/sparse_options.h"
#include "longctx/core/tensor.h"
#include "longctx/kernels/kernel_tuning.h"
#include "longctx/kv/block_copy.h"

namespace longctx {

struct OffloadDeviceConfig {
  OffloadGeometry geometry;
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kBF16;  // of q and (kv_format kDtype) K/V
  // kFp8E4M3: K/V are FP8 codes with fp32 scales per (block, layer, KV head) that move with
  // them (kernels/kv_format.h). Dense attention, and the sparse policies whose registry line
  // reads_fp8 (quest).
  kernels::KvCacheFormat kv_format = kernels::KvCacheFormat::kDtype;
  float sm_scale = 0.f;
  Device device = Device::cpu();
  int64_t max_tokens = 0;  // tokens per step
  int64_t max_seqs = 0;    // sequences per step
  // The sparse policy: the factories build the device's sparse reader from it (the registry's
  // policy for that device), null unless it selects a phase; the CUDA device's GPU cache then
  // ends with a prefill policy's staging.
  SparseOptions sparse;
  int64_t max_model_len = 0;
  // CUDA only: the paged kernels' choices (paged_dispatch.h; defaults: the measured ones).
  kernels::KernelTuning tuning;
  // CPU simulation only: a write-back lands this many steps after it was issued, unless a load
  // or a reuse waits for it first (tests the planner's tickets).
  int64_t cpu_write_back_lag = 1;

  int64_t page_elems() const { return geometry.block_size * num_kv_heads * head_dim; }
  bool fp8() const { return kv_format == kernels::KvCacheFormat::kFp8E4M3; }
  // K and V of one block of one layer (FP8: one byte an element, and the scales).
  int64_t layer_block_bytes() const {
    if (fp8()) return 2 * (page_elems() + num_kv_heads * static_cast<int64_t>(sizeof(float)));
    return 2 * page_elems() * static_cast<int64_t>(dtype_size(dtype));
  }
};

// Cumulative counters of an offload backend.
struct OffloadStats {
  int64_t steps = 0;
  int64_t ring_blocks_loaded = 0;  // blocks x layers through the ring
  int64_t blocks_written_back = 0;
  int64_t blocks_reloaded = 0;  // host -> GPU before a step (all layers)
  int64_t host_bytes_loaded = 0;
  int64_t host_bytes_written = 0;
};

// The ring protocol: what differs between the CUDA offload and the CPU simulation. Calls come
// in the order the file comment gives; the device keeps a pointer to the plan of begin_step until
// the next one.
class OffloadDevice {
 public:
  virtual ~OffloadDevice() = default;
  virtual bool ticket_done(uint64_t ticket) = 0;
  virtual void begin_step(const OffloadStepPlan& plan) = 0;
  // Ring slot `slot` <- layer `layer`'s host blocks of plans' item `item`; waits until the
  // slot's last reader released it and for write-back ticket `wait` (0: none).
  virtual void load_slot(int64_t slot, int64_t layer, int64_t item, uint64_t wait) = 0;
  virtual void store_kv(int64_t layer, const Tensor& k, const Tensor& v) = 0;
  virtual void attend_resident(int64_t layer, const Tensor& q) = 0;
  // Waits for the slot's load, attends item `item` over it, merges into the layer's state and
  // releases the slot.
  virtual void attend_slot(int64_t slot, int64_t layer, int64_t item, const Tensor& q) = 0;
  // The layer's merged output [T, Hq * head_dim] in q's dtype.
  virtual Tensor finish_layer(int64_t layer, const Tensor& q) = 0;
  // After the last layer: the plan's write-backs.
  virtual void end_step() = 0;

  // The KV store's block I/O, between steps. A block's bytes in the store's order (every
  // layer's K, then every layer's V, then FP8 every layer's K scales, then V scales: the resident
  // pool's, PagedKVPool::read_block) and `out` / `bytes` stay valid until the returned wait
  // (empty: done) returned, which may run on any thread.
  // Import: `bytes` into host block `host`'s copy, after the steps enqueued so far (which may
  // still read the block) and write-back ticket `wait` (0: none). The wait performs or awaits
  // the copy off the engine thread; the caller keeps the block out of every step until then.
  virtual std::function<void()> import_block(int32_t host, std::span<const std::byte> bytes,
                                             uint64_t wait) = 0;
  // Export of a full block: from GPU block `gpu` after the steps enqueued so far, issuing
  // `ticket` once the copy was read (the planner's note_export); or with `gpu` -1 from the host
  // copy, once write-back ticket `wait` (0: none) landed.
  virtual std::function<void()> export_block(int32_t host, int32_t gpu, uint64_t ticket,
                                             std::span<std::byte> out, uint64_t wait) = 0;
};

// One device as the backend drives it: the ring and, under a policy that selects, the sparse
// reader over the same memory (null otherwise). The reader reads the ring's memory, so it is
// destroyed first.
struct OffloadDeviceParts {
  std::unique_ptr<OffloadDevice> ring;
  std::unique_ptr<OffloadSparseReader> sparse;
};

// Throws Error(kUnsupported) for a sparse policy over an FP8 cache that does not read it (only
// quest's reader is simulated over FP8).
OffloadDeviceParts make_cpu_offload_device(const OffloadDeviceConfig& config);
// Throws Error(kUnsupported) in a build without CUDA or for a prefill policy the offload path has
// no staging for; Error(kOutOfMemory) naming the pool when the pinned host pool or the GPU
// buffers cannot be had.
OffloadDeviceParts make_cuda_offload_device(const OffloadDeviceConfig& config);

// One pinned host -> device copy of `bytes` on `device`, timed (the link's peak for the bench's
// bound). Throws Error(kUnsupported) without CUDA.
double measure_host_to_device_gbps(Device device, int64_t bytes);

class OffloadAttentionBackend final : public AttentionBackend {
 public:
  OffloadAttentionBackend(const OffloadGeometry& geometry, OffloadDeviceParts device);

  // A model of several KV groups (file comment): `groups` (the model's: one full group 0, then
  // sliding groups; KvGroups::offloadable()) and `resident` (a paged backend over
  // groups.without_first() and the window pool) outlive the backend; the engine's window-pool
  // ids are `window_base` + the resident pool's ids. `copy_window_blocks` runs the engine's
  // copy-on-write of window blocks (in resident pool ids) before the step.
  void set_window_groups(const KvGroups& groups, AttentionBackend& resident, int64_t window_base,
                         std::function<void(std::span<const KVBlockCopy>)> copy_window_blocks);
  // A model with linear-attention layers (file comment): `groups` (the model's: one full group 0,
  // then state groups) and `states` (their slots, as the state groups' tables name them) outlive
  // the backend. Throws Error(kInvalidArgument) for other groups or a second call.
  void set_state_groups(const KvGroups& groups, StatePool& states);
  // The engine's copy-on-write for the next plan().
  void set_copies(std::span<const KVBlockCopy> copies);
  void copy_blocks(std::span<const KVBlockCopy> copies) override { set_copies(copies); }
  void plan(const ForwardBatch& batch) override;
  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  Tensor attend(int64_t layer, const Tensor& q) override;
  // A linear-attention layer's slots of the planned batch's sequences (set_state_groups).
  LinearLayerStates linear_states(int64_t layer) override;
  // CUDA graphs (engine/cuda_graphs.h) of a one-group model's decode steps that a decode policy
  // (quest) attends: a graph-shaped batch (ForwardBatch::fixed_launch_shapes) must be such a
  // step, and its layers launch kernels only (no ring, no event); the step's write-backs follow
  // in end_graph_step(), outside the graph. The captured launches that follow the plan are the
  // sparse reader's.
  void begin_graph_capture() override;
  std::unique_ptr<GraphLaunches> end_graph_capture() override;
  void end_graph_step() override;

  const OffloadPlanner& planner() const { return planner_; }
  const OffloadStepPlan& last_plan() const { return plan_; }
  const OffloadStats& stats() const { return stats_; }
  // Host bytes the sparse reader read in place (not through the ring); synchronizes.
  int64_t sparse_host_bytes_read() const {
    return sparse_ != nullptr ? sparse_->host_bytes_read() : 0;
  }
  // Quest's pages copied from kept ones instead of read (offload_sparse.h); synchronizes.
  int64_t sparse_pages_reused() const { return sparse_ != nullptr ? sparse_->pages_reused() : 0; }
  SparsePrefillCounters sparse_prefill_counters() const override {
    return sparse_ != nullptr ? sparse_->prefill_counters() : SparsePrefillCounters{};
  }
  // A measurement mode (phase_profile.h): the planner's and the sparse reader's phases are marked
  // on `recorder` (null: off).
  void set_phase_recorder(PhaseRecorder* recorder);
  int64_t layer_block_bytes() const { return layer_block_bytes_; }
  // The KV store's block I/O (OffloadDevice::import_block / export_block), between steps: a
  // store hit goes into the host pool (the block's tier here), an export reads the GPU cache's
  // full copy when resident, else the host copy. A block's bytes: layer_block_bytes() x layers.
  std::function<void()> import_block(int32_t host, std::span<const std::byte> bytes);
  std::function<void()> export_block(int32_t host, std::span<std::byte> out);
  void set_layer_block_bytes(int64_t bytes) { layer_block_bytes_ = bytes; }

 private:
  void issue_load(int64_t g);
  void check_block_bytes(size_t bytes) const;
  // The batch as the resident backend sees it: groups 1.. as groups 0.., ids in its pool.
  void make_window_batch(const ForwardBatch& batch);
  // The offload layer of a full-group layer, or -1 for a layer kept resident (a sliding layer of
  // the resident backend, or a linear-attention layer).
  int64_t offload_layer(int64_t layer) const;

  OffloadPlanner planner_;
  std::unique_ptr<OffloadDevice> device_;
  std::unique_ptr<OffloadSparseReader> sparse_;  // null without a policy that selects
  std::vector<KVBlockCopy> copies_;
  OffloadStepPlan plan_;
  OffloadStats stats_;
  int64_t layer_block_bytes_ = 0;
  int64_t total_loads_ = 0, next_load_ = 0, next_layer_ = 0;
  bool planned_ = false;
  bool sparse_step_ = false;           // sparse_ attends this step itself (no ring items)
  bool graph_step_ = false;            // a graph-shaped batch: end_step waits for end_graph_step
  bool step_open_ = false;             // a graph step planned, end_step not yet issued
  PhaseRecorder* recorder_ = nullptr;  // a measurement mode's (phase_profile.h), else null
  // Several KV groups (null: one full group, every layer offloaded).
  const KvGroups* groups_ = nullptr;
  AttentionBackend* resident_ = nullptr;  // the sliding groups' (null without them)
  StatePool* states_ = nullptr;           // the state groups' slots (null without them)
  const ForwardBatch* batch_ = nullptr;   // the planned batch (linear_states reads its tables)
  int64_t window_base_ = 0;
  std::function<void(std::span<const KVBlockCopy>)> copy_window_blocks_;
  ForwardBatch window_batch_;
};

}  // namespace longctx
