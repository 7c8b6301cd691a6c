// The GPU model runner: a model on a CUDA device, its paged KV pool (sized by an explicit memory
// plan, gpu_memory_plan.h) and the paged attention backend. Driven through make_gpu_executor, it
// runs each step's sequences in one batched forward over the block tables a BlockManager gives:
// the engine's, or an ExecutorSession's for standalone use (benchmarks, `longctx forward`,
// tests: make_gpu_session), which also cuts long prompts into chunks of max_num_batched_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/attention/sparse_options.h"
#include "longctx/core/tensor.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/executor_session.h"
#include "longctx/engine/gpu_memory_plan.h"
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

class GpuRunner {
 public:
  // `model` must be on a CUDA device. Allocates the KV pool and the backend's buffers.
  GpuRunner(std::shared_ptr<Model> model, const GpuRunnerOptions& options);
  ~GpuRunner();

  const GpuMemoryPlan& memory_plan() const;
  const GpuRunnerOptions& options() const;
  int64_t vocab_size() const;
  KVBlockLayout kv_layout() const;
  // Executor::execute: the block copies, then one forward of every input over its block table
  // (the step must fit max_num_batched_tokens / max_num_seqs). Device f32 logits [rows, vocab].
  // Refused before attach_engine().
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies);
  // Executor::sample on the device (one row per logits row), after attach_engine().
  std::vector<SampleResult> sample(const Tensor& logits,
                                   std::span<const SamplingParams* const> params,
                                   std::span<SamplerState* const> states);
  int64_t graph_memory_bytes() const;  // held by the decode graphs (0 without)
  // KV offload counters (zeros without offload): blocks through the ring, written back, ...
  struct OffloadCounters {
    int64_t steps = 0, ring_blocks_loaded = 0, blocks_written_back = 0, blocks_reloaded = 0;
    int64_t host_bytes_loaded = 0, host_bytes_written = 0;
    int64_t sparse_host_bytes_read = 0;  // a sparse policy's reads of host pages in place
    // Quest's page reuse (--quest-reuse): (page, KV head) pairs copied from kept pages, not read.
    int64_t sparse_pages_reused = 0;
  };
  OffloadCounters offload_counters() const;
  // Sparse prefill (xattention): key blocks the masks kept and the blocks causal attention would
  // have read, over every step so far; zeros for other policies. Synchronizes.
  struct SparseCounters {
    int64_t prefill_blocks_kept = 0, prefill_blocks_causal = 0;
  };
  SparseCounters sparse_counters() const;
  // A measurement mode (`bench offload --profile-phases`): from the next step on, the host's and
  // the GPU's time per phase of the attention calls (attention/backends/phase_profile.h: the plan,
  // the layers' rest, store_kv, Quest's select / gather / decode, ...), which adds a few us of
  // host time per mark. Eager runners only (throws Error(kInvalidArgument) with decode graphs).
  void profile_phases();
  // The per-step table since profile_phases() or the last call (synchronizes); "" when off.
  std::string phase_profile();
  // The linear-attention state snapshots' copies (ExecutorCounters' state_* fields; the rest 0).
  ExecutorCounters state_counters() const;
  // The KV store's block I/O (Executor::kv_block_bytes etc.): a KV cache of one full attention
  // group without a sparse policy, resident or offloaded (its bytes in the resident pool's order
  // and format either way); 0 bytes (no export) otherwise.
  int64_t kv_block_bytes() const;
  std::string kv_block_format() const;
  void read_kv_block(int32_t block, std::span<std::byte> out) const;
  void write_kv_block(int32_t block, std::span<const std::byte> in);
  // Resident: the same copies enqueued on `stream` (a cudaStream_t) with no host wait
  // (PagedKVPool::read_block_async); the caller orders them with the steps.
  void read_kv_block_async(int32_t block, std::span<std::byte> out, void* stream) const;
  void write_kv_block_async(int32_t block, std::span<const std::byte> in, void* stream);
  // Offloaded (kv_offloaded()): the offload backend's import into the host pool and export
  // (OffloadAttentionBackend::import_block / export_block), ordered with the steps by it; the
  // returned wait (empty: done) returns once the copy did, from any thread.
  bool kv_offloaded() const;
  std::function<void()> import_offloaded_kv_block(int32_t block, std::span<const std::byte> in);
  std::function<void()> export_offloaded_kv_block(int32_t block, std::span<std::byte> out);
  Device device() const;  // the model's CUDA device

  // From now on a block manager (the engine's or an ExecutorSession's) owns the KV blocks;
  // make_gpu_executor calls it, once per runner: makes the device sampler and, unless
  // enforce_eager (or a policy that selects decode pages), captures the decode graphs.
  void attach_engine();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Executor> make_gpu_executor(std::shared_ptr<GpuRunner> runner);

// A standalone session over the runner (make_gpu_executor, so decode steps replay CUDA graphs
// unless enforce_eager), with the runner's max_num_batched_tokens, max_num_seqs and
// max_model_len. Keep the shared_ptr to read the runner's plan and counters.
ExecutorSession make_gpu_session(std::shared_ptr<GpuRunner> runner);

}  // namespace longctx
