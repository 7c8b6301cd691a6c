// The GPU model runner: a model on a CUDA device, its paged KV pool (sized by an explicit memory
// plan) and the paged attention backend. Driven by the engine (make_gpu_executor), it runs each
// step's sequences in one batched forward over the block tables the engine's block manager
// gives. Standalone (benchmarks, `longctx forward`, tests) it keeps blocks per sequence itself
// and cuts long prompts into chunks of max_num_batched_tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/attention/sparse_options.h"
#include "longctx/core/tensor.h"
#include "longctx/engine/executor.h"
#include "longctx/kernels/kernel_tuning.h"

namespace longctx {

class Model;
struct ModelConfig;

struct GpuRunnerOptions {
  int64_t block_size = 0;                  // tokens per KV block; 0: kDefaultBlockSize
  int64_t max_num_batched_tokens = 16384;  // tokens per forward (prefill chunk size)
  int64_t max_num_seqs = 256;              // sequences per forward
  // Models with linear-attention layers: prefix-cache snapshots of their state (each as large as
  // one sequence's states), taken from the budget up front.
  int64_t max_state_snapshots = kDefaultStateSnapshots;
  int64_t max_model_len = 0;   // tokens per sequence; 0: max_position_embeddings
  int64_t num_gpu_blocks = 0;  // 0: as many as the memory plan leaves
  // The KV cache's elements: bf16 (the activations'), or kFP8E4M3, which the memory plan counts
  // (codes + per-block scales) but the runner refuses until the CUDA kernels read it
  // (docs/fp8_kv.md).
  DType kv_dtype = DType::kBF16;
  bool enforce_eager = false;  // no CUDA graphs for decode steps
  // Speculative decoding's draft tokens per sequence (0: off): a verifying sequence returns
  // 1 + K logits rows, which the workspaces are sized for.
  int64_t num_speculative_tokens = 0;
  // KV offload to pinned host memory (docs/offload.md): the engine's blocks live in a host pool
  // of host_kv_bytes (0: half the machine's memory); the GPU keeps a cache of gpu_kv_bytes of them
  // (0: what the memory plan leaves) and a ring of offload_slots slots, each offload_slot_tokens
  // tokens of one layer. Decode steps run without CUDA graphs.
  bool kv_offload = false;
  int64_t host_kv_bytes = 0;
  int64_t gpu_kv_bytes = 0;
  int64_t offload_slots = 4;
  int64_t offload_slot_tokens = 32768;
  // Sparse attention (docs/sparse.md): any registered policy, with or without offload (a policy
  // that selects decode pages runs its decode steps without CUDA graphs).
  SparseOptions sparse;
  // The attention kernels' choices (defaults: the measured ones; benchmarks override them).
  kernels::KernelTuning tuning;
};

// See docs/architecture.md for the measurement behind the default.
inline constexpr int64_t kDefaultBlockSize = 128;

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

class GpuRunner {
 public:
  // `model` must be on a CUDA device. Allocates the KV pool and the backend's buffers.
  GpuRunner(std::shared_ptr<Model> model, const GpuRunnerOptions& options);
  ~GpuRunner();

  const GpuMemoryPlan& memory_plan() const;
  int64_t vocab_size() const;
  KVBlockLayout kv_layout() const;
  // Executor::execute: the block copies, then one forward of every input over its block table
  // (the step must fit max_num_batched_tokens / max_num_seqs). Device f32 logits [rows, vocab].
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies);
  // Executor::sample on the device (one row per logits row); engine mode only.
  std::vector<SampleResult> sample(const Tensor& logits,
                                   std::span<const SamplingParams* const> params,
                                   std::span<SamplerState* const> states);
  int64_t graph_memory_bytes() const;  // held by the decode graphs (0 without)
  // KV offload counters (zeros without offload): blocks through the ring, written back, ...
  struct OffloadCounters {
    int64_t steps = 0, ring_blocks_loaded = 0, blocks_written_back = 0, blocks_reloaded = 0;
    int64_t host_bytes_loaded = 0, host_bytes_written = 0;
    int64_t sparse_host_bytes_read = 0;  // a sparse policy's reads of host pages in place
  };
  OffloadCounters offload_counters() const;
  // Sparse prefill (xattention): key blocks the masks kept and the blocks causal attention would
  // have read, over every step so far; zeros for other policies. Synchronizes.
  struct SparseCounters {
    int64_t prefill_blocks_kept = 0, prefill_blocks_causal = 0;
  };
  SparseCounters sparse_counters() const;
  // The linear-attention state snapshots' copies (ExecutorCounters' state_* fields; the rest 0).
  ExecutorCounters state_counters() const;
  // The KV store's block I/O (Executor::kv_block_bytes etc.): a resident pool of one full
  // attention group without a sparse policy; 0 bytes (no export) otherwise.
  int64_t kv_block_bytes() const;
  std::string kv_block_format() const;
  void read_kv_block(int32_t block, std::span<std::byte> out) const;
  void write_kv_block(int32_t block, std::span<const std::byte> in);
  // The same copies enqueued on `stream` (a cudaStream_t) with no host wait
  // (PagedKVPool::read_block_async); the caller orders them with the steps.
  void read_kv_block_async(int32_t block, std::span<std::byte> out, void* stream) const;
  void write_kv_block_async(int32_t block, std::span<const std::byte> in, void* stream);
  Device device() const;  // the model's CUDA device

  // Standalone use, refused once an engine drives the runner. Inputs' block tables are ignored
  // (the runner keeps each seq_id's blocks until release()); num_new 0 runs all the rest.
  // Host f32 logits [inputs.size(), vocab] of each input's last token.
  Tensor execute_standalone(std::span<const StepInput> inputs);
  // Logits of every position of `ids` as a fresh sequence (host f32 [n, vocab]): `forward`
  // and tests. The sequence is released afterwards.
  Tensor prompt_logits(std::span<const int32_t> ids);
  void release(uint64_t seq_id);
  // From now on an engine's block manager owns the KV blocks (make_gpu_executor calls it):
  // makes the device sampler and, unless enforce_eager, captures the decode graphs.
  void attach_engine();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Executor> make_gpu_executor(std::shared_ptr<GpuRunner> runner);

}  // namespace longctx
