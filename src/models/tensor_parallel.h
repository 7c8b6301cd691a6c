// Which slice of every weight a tensor-parallel rank holds (Megatron's split, as vLLM and
// nano-vllm do it; docs/tensor_parallel.md):
//   q heads split evenly; KV heads split evenly, or, with fewer KV heads than ranks, each KV head
//   replicated on size / Hkv ranks (rank r reads KV head r / (size / Hkv));
//   qkv_proj / gate_up_proj (and their biases): the rank's rows (column-parallel);
//   o_proj / down_proj: the rank's input columns (row-parallel, partial sums all-reduced; their
//   biases on rank 0 only);
//   embed_tokens / lm_head: the rank's vocabulary rows (vocab-parallel: lookups outside it are
//   zeros, all-reduced; logits gathered);
//   norms, q/k norms and RoPE replicated.
#pragma once

#include <cstdint>

#include "longctx/loader/model_config.h"

namespace longctx::models {

struct TpShard {
  int rank = 0, size = 1;
  int64_t q_head0 = 0, num_q_heads = 0;    // q heads [q_head0, q_head0 + num_q_heads)
  int64_t kv_head0 = 0, num_kv_heads = 0;  // KV heads the rank reads
  int64_t inter0 = 0, inter = 0;           // MLP columns [inter0, inter0 + inter)
  int64_t vocab0 = 0, vocab = 0;           // vocabulary rows [vocab0, vocab0 + vocab)
};

// Throws Error(kInvalidArgument) naming what does not divide: q heads by the ranks, KV heads by
// the ranks (or the ranks by the KV heads), the MLP width by the ranks; or a rank outside [0,
// size).
TpShard tp_shard(const ModelConfig& config, int rank, int size);

// The config a rank's model runs with: its q / KV heads and MLP width (vocab_size stays the whole
// vocabulary: the logits are gathered). size 1: `config` itself.
ModelConfig tp_local_config(const ModelConfig& config, const TpShard& shard);

}  // namespace longctx::models
