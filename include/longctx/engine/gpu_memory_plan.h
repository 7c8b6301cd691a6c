// The GPU memory plan: where a device's memory goes (weights, activations, workspaces, CUDA
// graphs, a sparse policy's buffers, the KV pool per KV group, the offload host pool and ring),
// computed from the config and the runner's options before anything is allocated. `longctx info`
// prints it; the GPU runner sizes its pools by it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace longctx {

struct GpuRunnerOptions;
struct ModelConfig;

// Bytes of one forward's activations per token (bf16 activations, f32 residual; the peak of
// what is live at once, with headroom for the caching pool's rounding).
int64_t activation_bytes_per_token(const ModelConfig& config);

// Where the device's memory goes.
struct GpuMemoryPlan {
  int64_t budget = 0;          // device pool budget (--gpu-memory-utilization / -limit)
  int64_t weights = 0;         // bf16 weights on the device
  int64_t expert_weights = 0;  // of which the routed experts of MoE layers
  int64_t activations = 0;     // max_num_batched_tokens x activation_bytes_per_token
  int64_t workspaces = 0;      // GEMM, attention plans, logits, sampler
  int64_t graphs = 0;          // CUDA graphs of decode steps (their private pool)
  int64_t sparse = 0;          // a sparse policy's metadata and selection buffers
  int64_t kv_block_bytes = 0;  // K + V of one block (every layer of the largest KV group)
  int64_t kv_state_bytes = 0;  // per-sequence states (linear attention) of max_num_seqs sequences
  int64_t kv_snapshot_bytes = 0;  // their prefix-cache snapshots (max_state_snapshots of them)
  int64_t num_state_snapshots = 0;
  std::vector<std::string> kv_groups;  // KvGroups::describe(): kind, window, layers, bytes
  int64_t num_kv_blocks = 0;           // the GPU pool (with offload: the GPU cache of host blocks)
  int64_t block_size = 0;
  int64_t max_model_len = 0;
  // KV offload (0 without): the host pool, the ring and the offload merge buffers.
  int64_t num_host_blocks = 0;
  int64_t ring_bytes = 0;
  int64_t offload_buffers = 0;
  int64_t slot_blocks = 0;
  // KV offload of a model with sliding groups: only the full group is offloaded (kv_block_bytes
  // is its layers' block); the sliding groups' blocks stay on the GPU in a window pool of
  // num_window_blocks blocks of window_block_bytes (max_num_seqs windows, a step's tokens).
  int64_t num_window_blocks = 0;
  int64_t window_block_bytes = 0;
  int64_t window_bytes() const { return num_window_blocks * window_block_bytes; }
  int64_t kv_bytes() const { return num_kv_blocks * kv_block_bytes; }
  int64_t kv_tokens() const { return num_kv_blocks * block_size; }
  int64_t host_kv_bytes() const { return num_host_blocks * kv_block_bytes; }
  bool offload() const { return num_host_blocks > 0; }
  std::string str() const;           // a few lines for `longctx info`
  std::string experts_note() const;  // " (routed experts N)" for a MoE model, else empty
};

// The plan for `config` on a device pool of `budget` bytes (before anything is allocated).
// Throws Error(kOutOfMemory) when not even one max_model_len sequence fits, naming the numbers.
GpuMemoryPlan plan_gpu_memory(const ModelConfig& config, const GpuRunnerOptions& options,
                              int64_t budget);

}  // namespace longctx
