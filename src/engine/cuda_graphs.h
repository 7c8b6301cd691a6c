// CUDA graphs for decode steps (vLLM's CUDAGraphRunner): one graph per batch-size bucket
// (1, 2, 4, 8, ... up to max_num_seqs), captured once at start-up, each replaying the whole
// decoder forward of a decode-only batch (every sequence one new token) in one launch instead of
// ~15 launches per layer.
//
// How a replay stays correct:
//  - Inputs: the step's ids and positions are copied into fixed device buffers before the
//    launch; the paged backend's plan() rewrites its index buffers and the decode work list in
//    place (ForwardBatch::fixed_launch_shapes keeps every device address and launch shape a
//    function of the batch size alone, but the split-KV decode grid, which follows the step's
//    kv lengths: when it changes, the backend's GraphLaunches (AttentionBackend::
//    end_graph_capture) set the graph's decode kernel nodes to the new grid before the launch; a
//    grid padded to a fixed size per bucket cost 19-22% of the kernel's time).
//  - Padding: a batch of S sequences runs the graph of the smallest bucket B >= S; the B - S
//    padding sequences have one token (id 0, position 0) in a scratch KV block that no sequence
//    uses, so their K/V writes never touch a real sequence's blocks, and the decode plan splits
//    the real sequences exactly as it would without them (ForwardBatch::num_padding_seqs). A
//    state model's padding sequences share a scratch state slot likewise (plan() zeroes it, and
//    they all compute the same values from it), so they never write a real sequence's state.
//  - Linear attention (state models): the backend's plan() writes the step's state pointers into
//    device arrays at addresses fixed per batch size (LinearLayerStates' device form), which the
//    captured ops read.
//  - Memory: everything a graph allocates while it is captured comes from a private device-pool
//    pool (core/device_pool.h) that nothing else allocates from while the graphs live; the
//    buckets share it (they never run at the same time), captured largest first.
//  - Streams: captures run on a per-device capture stream (the legacy default stream cannot be
//    captured); replays launch on the caller's current stream, after its own work.
//
// Bit-identity: a replay computes exactly the eager forward of the padded batch (same kernels,
// shapes and plans). When S is a bucket size there is no padding, so it equals Model::forward on
// the batch itself; otherwise the real rows' GEMMs run with B rows instead of S, and cuBLASLt
// may pick another algorithm for the other row count (not seen so far: every padded step of
// tests/gpu_graphs was bit-identical to the unpadded eager forward on an H200).
//
// Not thread-safe; one replay at a time (the graphs share the backend's plan buffers and their
// intermediates). The returned logits are a view of the graphs' output buffer, valid until the
// next run() (of any bucket).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/paged_kv_pool.h"
#include "longctx/attention/forward_batch.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/tensor.h"

namespace longctx {

class Model;
struct ModelConfig;

struct DecodeGraphOptions {
  std::vector<int64_t> buckets;  // batch sizes to capture, ascending; empty: the default list
  int64_t max_num_seqs = 0;      // largest decode batch (sizes the default bucket list)
  // A KV block no sequence ever uses (the caller keeps it out of its allocator): the padding
  // sequences' K/V go there. -1: taken from the pool's free list and given back at destruction.
  int32_t scratch_block = -1;
  // A state slot no sequence ever uses, for the padding sequences of a model with a state KV
  // group (linear attention); required then, ignored otherwise.
  int32_t scratch_state_slot = -1;
  // Block-table entries the backend takes per step (PagedBackendLimits::max_blocks); a batch
  // whose padded tables exceed it is refused by can_run(). 0: not checked here.
  int64_t max_blocks = 0;
};

// 1, 2, 4, 8, ... below max_num_seqs, then max_num_seqs itself. Throws Error(kInvalidArgument)
// for max_num_seqs < 1.
std::vector<int64_t> decode_graph_buckets(int64_t max_num_seqs);

// The smallest bucket >= num_seqs (buckets ascending); 0 when there is none.
int64_t pick_decode_bucket(std::span<const int64_t> buckets, int64_t num_seqs);

// Where the padding sequences go: the scratch KV block, and for a model whose KV groups (null:
// one full group) have a state group, the scratch state slot.
struct DecodePadding {
  int32_t scratch_block = -1;
  int64_t block_size = 0;
  const KvGroups* groups = nullptr;
  int32_t scratch_state_slot = -1;
};

// Why `batch` cannot run as a decode graph of one of `buckets` ("" when it can): a sequence with
// more than one new token, logits rows other than every sequence's, more sequences than the
// largest bucket, an already padded batch, a block table naming the scratch block (a state
// group's naming the scratch state slot), or padded tables past max_blocks (> 0).
std::string decode_graph_refusal(const ForwardBatch& batch, std::span<const int64_t> buckets,
                                 const DecodePadding& padding, int64_t max_blocks);

// `batch` (decode only) followed by bucket - S padding sequences: one token each, id 0 at
// position 0, in the scratch block (a state group's table: the scratch state slot, no token
// slot); logits for every row; fixed_launch_shapes and num_padding_seqs set. Throws
// Error(kInvalidArgument) when bucket < S, or for a state group without a scratch state slot.
ForwardBatch pad_decode_batch(const ForwardBatch& batch, int64_t bucket,
                              const DecodePadding& padding);

// Device bytes the graphs of buckets up to max_bucket hold (for the memory plan): the largest
// bucket's activations (the buckets share them), the fixed input and logits buffers, the capture
// stream's cuBLASLt workspace and the pool's segment rounding.
int64_t decode_graph_memory_bytes(const ModelConfig& config, int64_t max_bucket);

// A KV cache the graphs' padding sequences write into without a PagedKVPool (KV offload: the
// engine's host block ids).
struct DecodeGraphKv {
  int64_t block_size = 0;
  int64_t num_blocks = 0;
};

class DecodeGraphs {
 public:
  // `model` on a CUDA device, `attention` the paged backend over `pool`; all three must outlive
  // this object. Captures nothing yet. Throws Error(kInvalidArgument) for bad options,
  // Error(kUnsupported) in a build without CUDA.
  DecodeGraphs(Model& model, AttentionBackend& attention, PagedKVPool& pool,
               const DecodeGraphOptions& options);
  // Over another backend's KV of kv.num_blocks blocks (KV offload): options.scratch_block
  // required (a block the caller keeps from its allocator).
  DecodeGraphs(Model& model, AttentionBackend& attention, const DecodeGraphKv& kv,
               const DecodeGraphOptions& options);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Captures every bucket (largest first): per bucket one eager warm-up forward and one capture,
  // both over padding sequences in the scratch block only. Synchronizes the device. Throws
  // Error naming the bucket on failure (the graphs captured so far are dropped).
  void capture();
  bool captured() const;
  const std::vector<int64_t>& buckets() const;
  int32_t scratch_block() const;

  // True when run() takes `batch` (captured, and decode_graph_refusal() is empty).
  bool can_run(const ForwardBatch& batch) const;
  // Pads `batch` to its bucket, validates it and plans the backend as Model::forward would,
  // copies ids and positions into the graph's buffers and replays the graph on the current
  // stream. Returns device f32 logits [S, vocab]: a view valid until the next run(). Throws
  // Error(kInvalidArgument) when can_run() is false, or what validation / plan() throw.
  Tensor run(const ForwardBatch& batch);

  // Device bytes the graphs hold: their private pool and the fixed buffers.
  int64_t memory_bytes() const;
  double capture_seconds() const;  // wall time of the last capture()
  int64_t grid_updates() const;    // decode-grid updates of the graphs so far

 private:
  void init(Model& model, AttentionBackend& attention, PagedKVPool* pool, const DecodeGraphKv& kv,
            const DecodeGraphOptions& options);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx
