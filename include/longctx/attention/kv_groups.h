// KV groups: one description of each layer's attention state, from the model's config. Layers
// that keep the same kind of state form a group (every full-attention layer; every sliding layer
// of one window; every linear-attention layer); the BlockManager gives each group its own block
// table per sequence, the memory plan sums the groups' bytes, and a backend attends a layer
// through its group (its table, its window), so the model code never knows which kind it has.
//
// Storage (as vLLM's hybrid allocator): paged groups share one pool of block ids, and the pool's
// per-layer K/V tensors are shared by the groups: a paged group's j-th layer lives in pool layer
// j, so the pool has max(layers of a paged group) layers and a block costs that many layers'
// K/V. So that no block is mostly empty, a model with paged layers of several kinds has each
// kind cut into groups of the smallest kind's layer count (Gemma-3-12B: one full group of 8
// layers and five sliding groups of 8; the last group of a kind may be shorter). One full group
// (Llama, Qwen) is today's layout exactly: pool layer = model layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/kv/kv_group_kind.h"
#include "longctx/loader/model_config.h"

namespace longctx {

struct KvGroup {
  KvGroupKind kind = KvGroupKind::kFull;
  int64_t window = 0;           // kSlidingWindow: keys a query sees, itself included
  std::vector<int64_t> layers;  // [n] model layers, ascending
  DType dtype = DType::kBF16;   // of K/V (paged), or of the state (fp32)
  int64_t bytes_per_token = 0;  // paged: K + V of the group's layers for one token
  // FP8 K/V: the fp32 K and V scales of the group's layers for one block (per KV head).
  int64_t scale_bytes_per_block = 0;
  int64_t bytes_per_seq = 0;  // kState: recurrent + conv state of its layers, per sequence
};

class KvGroups {
 public:
  // Groups in a fixed order: full, then sliding windows (ascending), then state; within a kind,
  // by first layer (paged kinds cut to equal sizes, above). kv_dtype is the paged groups'
  // (kFP8E4M3: codes + fp32 scales per block, layer and KV head); a state group is always fp32.
  // Throws Error(kInvalidArgument) for a config without layers, a sliding layer without a window
  // or a linear layer without its state sizes.
  static KvGroups from_config(const ModelConfig& config, DType kv_dtype);

  int64_t size() const { return static_cast<int64_t>(groups_.size()); }
  const KvGroup& operator[](int64_t g) const { return groups_[g]; }
  const std::vector<KvGroup>& groups() const { return groups_; }
  int64_t num_layers() const { return static_cast<int64_t>(group_of_.size()); }
  int64_t group_of(int64_t layer) const { return group_of_[layer]; }
  // The layer's pool layer: its index within its group.
  int64_t pool_layer(int64_t layer) const { return pool_layer_[layer]; }
  // Keys a query of `layer` sees (0: all earlier keys).
  int64_t window_of(int64_t layer) const { return groups_[group_of_[layer]].window; }
  // One full group: every layer attends everything (today's single-table path).
  bool single_full() const { return size() == 1 && groups_[0].kind == KvGroupKind::kFull; }
  bool has_kind(KvGroupKind kind) const;

  // Layers of the shared paged pool (the largest paged group; 0 without paged groups).
  int64_t pool_layers() const { return pool_layers_; }
  // Bytes of one pool block of `block_size` tokens (K and V of pool_layers() layers, and their
  // scales when FP8).
  int64_t block_bytes(int64_t block_size) const;
  // K/V bytes of every paged layer per token (what tokens cost when every layer keeps them),
  // without FP8's per-block scales.
  int64_t paged_bytes_per_token() const;
  int64_t state_bytes_per_seq() const;  // every state group's bytes, per sequence
  // What one sequence of `tokens` tokens keeps in blocks of `block_size`: full groups every
  // token, sliding groups at most their window (FP8: and the scales of the blocks those take),
  // state groups their state.
  int64_t bytes_per_seq(int64_t tokens, int64_t block_size) const;
  // What the BlockManager needs, in group order.
  std::vector<KvGroupAlloc> allocs() const;
  // One line per group: "group 0: full, 28 layers (0-27), bf16, 114688 B/token" (FP8: "+ N
  // B/block of scales").
  std::vector<std::string> describe() const;
  // describe()'s lines joined by "; ", for error messages.
  std::string summary() const;
  // The groups after group 0 (a model's full group), renumbered from 0, each layer keeping its
  // pool layer; group 0's layers belong to no group here (group_of is -1). KV offload keeps these
  // (the sliding groups) resident while group 0 is offloaded.
  KvGroups without_first() const;
  // Whether KV offload takes this model: one full group (group 0), offloaded, then any sliding
  // groups or any linear-attention state groups (which stay resident), but not both.
  bool offloadable() const;

 private:
  std::vector<KvGroup> groups_;
  std::vector<int64_t> group_of_;    // [layers]
  std::vector<int64_t> pool_layer_;  // [layers]
  int64_t pool_layers_ = 0;
  int64_t kv_bytes_per_layer_token_ = 0;     // K + V of one layer for one token
  int64_t scale_bytes_per_layer_block_ = 0;  // FP8: K + V scales of one layer for one block
};

}  // namespace longctx
