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
// Mixture-of-experts layers are sliced the same way, expert by expert ("expert slicing", vLLM's
// default TP for fused MoE): every rank holds every expert's gate/up rows and down columns
// [moe_inter0, moe_inter0 + moe_inter), and the shared expert's [shared_inter0, ...); the router
// and the shared expert's gate are replicated, so every rank routes identically and the MoE
// output is one more row-parallel partial sum, all-reduced with nothing else changed. Expert
// parallelism (whole experts per rank) would instead need an all-to-all of tokens per layer and
// leave ranks idle or overloaded as routing skews (a decode step of one token touches k of E
// experts: with EP only the ranks holding those k work); it pays off across nodes and with
// expert counts far above the rank count, not for the 2-8 GPUs of one host that longctx shards
// over. The cost: each expert's slice must stay divisible (Qwen3-30B-A3B's 768 and
// Qwen3-235B-A22B's 1536 split 8 ways into 96 and 192 columns) and the per-expert GEMMs get
// narrower.
#pragma once

#include <cstdint>

#include "longctx/loader/model_config.h"

namespace longctx::models {

struct TpShard {
  int rank = 0, size = 1;
  int64_t q_head0 = 0, num_q_heads = 0;         // q heads [q_head0, q_head0 + num_q_heads)
  int64_t kv_head0 = 0, num_kv_heads = 0;       // KV heads the rank reads
  int64_t inter0 = 0, inter = 0;                // MLP columns [inter0, inter0 + inter)
  int64_t vocab0 = 0, vocab = 0;                // vocabulary rows [vocab0, vocab0 + vocab)
  int64_t moe_inter0 = 0, moe_inter = 0;        // each routed expert's columns
  int64_t shared_inter0 = 0, shared_inter = 0;  // the shared expert's columns
};

// Throws Error(kInvalidArgument) naming what does not divide: q heads by the ranks, KV heads by
// the ranks (or the ranks by the KV heads), the MLP width by the ranks; or a rank outside [0,
// size).
TpShard tp_shard(const ModelConfig& config, int rank, int size);

// The config a rank's model runs with: its q / KV heads and MLP width (vocab_size stays the whole
// vocabulary: the logits are gathered). size 1: `config` itself.
ModelConfig tp_local_config(const ModelConfig& config, const TpShard& shard);

}  // namespace longctx::models
