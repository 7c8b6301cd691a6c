// One step of the model over many sequences, as flat host arrays (the ModelRunner builds it, the
// AttentionBackend plans from it, the model reads its ids and positions), and the attention seam
// the model calls per layer without knowing where K/V live (CPU caches, a paged GPU pool, host
// memory through a ring, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/kv/block_copy.h"

namespace longctx {

// One KV group's block tables and new-token slots in a step (attention/kv_groups.h), laid out as
// ForwardBatch's own fields (which are group 0's).
struct GroupBlockTables {
  std::vector<int32_t> block_table_indptr;  // [S + 1]
  // [block_table_indptr[S]] block ids; -1 (kNoBlock) where a sliding window dropped a block
  // (never read: it lies wholly before every query's window)
  std::vector<int32_t> block_tables;
  std::vector<int64_t> slot_mapping;  // [T] block * block_size + offset of each new token
};

// A view of one group's tables, wherever they are stored.
struct BlockTablesView {
  std::span<const int32_t> block_table_indptr;  // [S + 1]
  std::span<const int32_t> block_tables;        // [block_table_indptr[S]]
  std::span<const int64_t> slot_mapping;        // [T]
};

struct ForwardBatch {
  std::vector<int32_t> input_ids;  // [T] the new tokens of every sequence, sequence by sequence
  std::vector<int64_t> positions;  // [T] position of each token in its sequence
  std::vector<int32_t> qo_indptr;  // [S + 1] sequence s owns tokens [qo_indptr[s], qo_indptr[s+1])
  std::vector<int32_t> kv_lens;    // [S] tokens in s's KV after this step (cached + new)
  // Paged backends: sequence s's blocks are block_tables[block_table_indptr[s] ..
  // block_table_indptr[s + 1]) in order; token j of s (0 = its first cached token) lives in block
  // block_tables[... + j / block_size] at offset j % block_size.
  std::vector<int32_t> block_table_indptr;  // [S + 1]
  std::vector<int32_t> block_tables;        // [block_table_indptr[S]] block ids
  std::vector<int64_t> slot_mapping;        // [T] block * block_size + offset of each new token
  std::vector<int32_t> logits_indices;      // [R] rows of the T tokens that need logits
  std::vector<uint64_t> seq_ids;            // [S] the engine's ids (backends keyed by sequence)
  // Models of several KV groups: groups 1..G-1's tables (the fields above are group 0's); empty
  // with one group, so the single-group step carries nothing more than before.
  std::vector<GroupBlockTables> group_tables;  // [G - 1]
  // CUDA-graph replay (engine/cuda_graphs.h): every device address and launch shape of the step
  // must follow from num_tokens() / num_seqs() alone, or be reported by the backend for the graph
  // to update; the last num_padding_seqs sequences only fill the graph's batch size (their results
  // are dropped), so backends keep them from changing how the real sequences' work is split.
  bool fixed_launch_shapes = false;
  int32_t num_padding_seqs = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(input_ids.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(kv_lens.size()); }
  int32_t q_len(int64_t s) const { return qo_indptr[s + 1] - qo_indptr[s]; }
  int64_t num_groups() const { return 1 + static_cast<int64_t>(group_tables.size()); }
  // Group g's tables (g = 0: the fields above).
  BlockTablesView tables(int64_t g) const {
    if (g == 0) return {block_table_indptr, block_tables, slot_mapping};
    const GroupBlockTables& t = group_tables[g - 1];
    return {t.block_table_indptr, t.block_tables, t.slot_mapping};
  }

  // Appends sequence `seq_id` with new tokens `ids` after `num_cached` tokens already in its KV,
  // at positions num_cached, num_cached + 1, ...; the logits rows of its last num_logits new
  // tokens (1: the last one; more: a speculative draft's verification) are requested when
  // want_logits.
  void add_sequence(uint64_t seq_id, const int32_t* ids, int64_t n, int64_t num_cached,
                    bool want_logits, int64_t num_logits = 1);

  // Throws Error(kInvalidArgument) naming the first inconsistency: array lengths, empty
  // sequences, kv_len < q_len, logits rows out of range or not ascending, token ids outside
  // [0, vocab_size), positions outside [0, max_positions) (max_positions <= 0: unchecked),
  // num_padding_seqs outside [0, S).
  // Paged fields are checked by the paged backend (it knows the block size and pool).
  void validate(int64_t vocab_size, int64_t max_positions) const;
};

// A sparse prefill policy's reads so far (XAttention: key blocks its masks kept, and the blocks
// causal attention would have read).
struct SparsePrefillCounters {
  int64_t kept = 0, causal = 0;
};

// The launches of a captured CUDA graph whose shape follows the backend's plan (the split-KV
// decode kernel's grid), recorded by the backend while the engine captured a step. The engine
// keeps one per graph and, after each later plan(), asks it to bring the instantiated graph up to
// date; opaque to the engine (no CUDA types in this interface).
class GraphLaunches {
 public:
  virtual ~GraphLaunches() = default;
  // Points `graph_exec` (the cudaGraphExec_t instantiated from the captured graph) at the last
  // plan(); returns whether any node changed.
  virtual bool update(void* graph_exec) = 0;
};

// A linear-attention layer's state (a kState KV group) for each sequence of the planned batch,
// in batch order: fp32 tensors on the model's device that the layer reads and updates in place.
// A sequence whose step starts at its first token gets zeroed states.
// The CPU backends hand tensors; the CUDA paged backend hands device arrays instead, written once
// per step with its other per-step metadata at addresses that depend on the batch size alone, so
// a CUDA graph's launches read the current step's states.
struct LinearLayerStates {
  std::vector<Tensor> recurrent;  // [S] each [value_heads, key_head_dim, value_head_dim]
  std::vector<Tensor> conv;       // [S] each [conv_kernel - 1, conv channels (q, k and v)]
  // The device form (null on the CPU): the step's qo_indptr [S + 1] and each sequence's state.
  const int32_t* device_qo_indptr = nullptr;
  float* const* device_recurrent = nullptr;  // [S]
  float* const* device_conv = nullptr;       // [S]
  int64_t num_seqs = 0;                      // S, of the device form
};

// What Model::forward needs from attention. plan() runs once per step on the host before the
// first layer; store_kv() then attend() once per layer, in layer order.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // Checks the batch against what the backend holds (throws Error naming the problem; nothing
  // is written then) and prepares index buffers for every layer.
  virtual void plan(const ForwardBatch& batch) = 0;
  // The step's new keys and values, after RoPE: k, v [T, Hkv, head_dim] (last dim contiguous,
  // rows may be strided views of a fused QKV output), in the model's activation dtype.
  virtual void store_kv(int64_t layer, const Tensor& k, const Tensor& v) = 0;
  // Causal (by position) attention of q [T, Hq, head_dim] over each sequence's KV (the new
  // tokens' own keys included). Returns o [T, Hq * head_dim] in q's dtype, contiguous.
  virtual Tensor attend(int64_t layer, const Tensor& q) = 0;
  // The planned batch's states of linear-attention layer `layer` (see LinearLayerStates).
  // Backends without state storage throw Error(kUnsupported).
  virtual LinearLayerStates linear_states(int64_t layer);

  // What the engine asks of a backend beside the step (defaults: nothing to do).
  // The engine copied whole blocks (copy-on-write) before the step: metadata the backend keeps
  // per block (a sparse policy's) follows.
  virtual void copy_blocks(std::span<const KVBlockCopy> copies) { (void)copies; }
  // A sparse prefill policy's counters over every step so far (may synchronize); zeros without.
  virtual SparsePrefillCounters sparse_prefill_counters() const { return {}; }
  // CUDA graphs (engine/cuda_graphs.h). begin_graph_capture() before a capture starts (forgets
  // launches recorded before); end_graph_capture() after it ended: the captured launches that
  // follow the plan, for the engine to update after each later plan(), or nullptr when the
  // captured step has none. Throws Error(kInternal) when the capture holds fewer or more of them
  // than the step launched.
  virtual void begin_graph_capture() {}
  virtual std::unique_ptr<GraphLaunches> end_graph_capture() { return nullptr; }
  // After each forward of a graph-shaped batch (ForwardBatch::fixed_launch_shapes) ran or was
  // captured, and after each replay was launched: the step's work that follows its last layer
  // but cannot be in a graph (KV offload's write-backs on its own stream). Nothing by default.
  virtual void end_graph_step() {}
};

}  // namespace longctx
