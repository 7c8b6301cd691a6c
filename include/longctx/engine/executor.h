// What the engine asks of a model backend: run one step (each scheduled sequence's next tokens,
// their K/V written into the blocks the engine's block manager gave them), give back the
// next-token logits of the sequences that reached their end, and sample from them.
// Implementations: the CPU reference model (a CPU paged KV pool), the GPU runner (a device
// paged pool) and scripted logits for tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/attention/sparse_options.h"
#include "longctx/core/tensor.h"
#include "longctx/engine/sampler.h"
#include "longctx/kv/block_copy.h"
#include "longctx/kv/kv_group_kind.h"

namespace longctx {

class Model;

// One sequence's part of a step: run tokens all_tokens[num_computed, num_computed + num_new).
struct StepInput {
  uint64_t seq_id = 0;
  std::span<const int32_t> all_tokens;  // prompt + generated so far
  int64_t num_computed = 0;             // tokens whose K/V are in the sequence's blocks
  int64_t num_new = 0;                  // tokens to run now (>= 1)
  // The sequence's KV blocks, covering at least num_computed + num_new tokens (group 0's).
  std::span<const int32_t> block_table;
  bool want_logits = true;  // logits of the last new token (the sequence reached its end)
  // Models of several KV groups: groups 1..G-1's tables, each as block_table (a sliding group's
  // entries before its window are -1); empty with one group.
  std::span<const std::span<const int32_t>> group_tables;
  // A state group's snapshots (KVBlockLayout::num_state_snapshots; -1: none): copied into the
  // sequence's state slot before the step (a prefix hit starts from it), and the slot's state
  // copied into state_save after the step (it ends on a block boundary).
  int32_t state_restore = -1;
  int32_t state_save = -1;
  // With want_logits: rows for the last num_logits new tokens (speculative decoding verifies a
  // draft with the logits of the last sampled token and of every draft token), in token order.
  int64_t num_logits = 1;
};

// The KV blocks an executor offers the engine's block manager.
struct KVBlockLayout {
  int64_t num_blocks = 0;
  int64_t block_size = 0;  // tokens per block
  // The model's KV groups in order (attention/kv_groups.h); empty: one full group.
  std::vector<KvGroupAlloc> groups;
  int64_t num_state_slots = 0;      // per-sequence states the executor holds (with a kState group)
  int64_t num_state_snapshots = 0;  // prefix-cache snapshots of a state (StepInput::state_*)
  // KV offload of a model with sliding groups: their blocks' pool, resident on the GPU (ids from
  // num_blocks on; BlockManager's window pool). 0: the sliding groups share the one pool.
  int64_t num_window_blocks = 0;
};

// Cumulative counters of an executor, for the engine's stats (zeros where they do not apply).
struct ExecutorCounters {
  int64_t offload_host_bytes_loaded = 0;     // KV offload: host -> GPU (ring and reloads)
  int64_t offload_host_bytes_written = 0;    // KV offload: GPU -> host (write-backs)
  int64_t sparse_prefill_blocks_kept = 0;    // a sparse prefill policy's key blocks read ...
  int64_t sparse_prefill_blocks_causal = 0;  // ... of the causal ones (density = kept / causal)
  // Linear-attention state snapshots (prefix caching of state models): taken at block
  // boundaries, restored for prefix hits, and the bytes both copied.
  int64_t state_snapshots_saved = 0;
  int64_t state_snapshots_restored = 0;
  int64_t state_snapshot_bytes = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual int64_t vocab_size() const = 0;
  virtual KVBlockLayout kv_layout() const = 0;
  // Runs one step: first the copies (copy-on-write of shared blocks), then every input in one
  // batched forward. Returns f32 logits [rows, vocab], num_logits rows per input with
  // want_logits, in input order; on the host or on the executor's device (sample() takes it as it
  // is).
  virtual Tensor execute(std::span<const StepInput> inputs,
                         std::span<const KVBlockCopy> copies) = 0;
  // A KV block as bytes, for a KV store shared by replicas (docs/fleet.md): every layer's K, then
  // V, of one block. kv_block_bytes() 0: this executor cannot (no store is used then);
  // kv_block_format() names the bytes' layout and numerics, part of the store's keys.
  virtual ExecutorCounters counters() const { return {}; }
  virtual int64_t kv_block_bytes() const { return 0; }
  virtual std::string kv_block_format() const { return {}; }
  virtual void read_kv_block(int32_t block, std::span<std::byte> out) const;
  virtual void write_kv_block(int32_t block, std::span<const std::byte> in);
  // The same copies started without waiting for them (a GPU executor: on a copy stream, from and
  // into pinned host memory, see kv_block_io_pinned()); the returned wait (empty: the copy
  // finished already) blocks until the copy did, from any thread, and `out` / `in` must stay
  // valid until then. An export reads the block after the step that computed it, and the
  // executor keeps any later step or import from writing the block before the export read it.
  // An import's wait must return before the next step (which reads the block). The default
  // copies at once (read_kv_block / write_kv_block).
  virtual std::function<void()> read_kv_block_async(int32_t block, std::span<std::byte> out);
  virtual std::function<void()> write_kv_block_async(int32_t block, std::span<const std::byte> in);
  // Whether the host buffers of those copies should be page-locked (KvBlockBuffers).
  virtual bool kv_block_io_pinned() const { return false; }
  // For measurements: write_kv_block_async enqueues its copies on the calling (engine) thread
  // rather than in the wait, as before the wait did it (a GPU executor's; others ignore it).
  virtual void set_kv_imports_enqueued_by_caller(bool) {}
  // Samples one token per row of execute()'s logits. The default samples on the host.
  virtual std::vector<SampleResult> sample(const Tensor& logits,
                                           std::span<const SamplingParams* const> params,
                                           std::span<SamplerState* const> states);
};

// State snapshots a state model's engine keeps for prefix hits unless told otherwise (the
// memory cost per snapshot: docs/architecture.md, KV groups).
inline constexpr int64_t kDefaultStateSnapshots = 64;
// The snapshots an engine keeps: none without prefix caching, else `asked` (-1: the default).
// Throws Error(kInvalidArgument) below -1.
int64_t resolve_state_snapshots(bool prefix_caching, int64_t asked);

struct CpuExecutorOptions {
  int64_t block_size = 16;
  // The KV cache's elements: kF32 (the reference's unquantized cache) or kFP8E4M3 (codes and
  // fp32 scales per block, layer and KV head: docs/fp8_kv.md).
  DType kv_dtype = DType::kF32;
  // Bytes of the CPU KV pool (K and V of every layer); its pages are touched only as
  // blocks fill. 0: 4 GiB (as vLLM's CPU backend's default VLLM_CPU_KVCACHE_SPACE).
  int64_t kv_cache_bytes = 0;
  // Blocks, instead of kv_cache_bytes (tests).
  int64_t num_blocks = 0;
  // KV offload simulated on the CPU (docs/offload.md; tests of the planner and the ring): the
  // pool above is the host pool and a cache of offload_gpu_blocks blocks plays the GPU's.
  int64_t offload_gpu_blocks = 0;  // 0: no offload
  int64_t offload_slots = 4;
  int64_t offload_slot_blocks = 4;
  int64_t offload_write_back_lag = 1;  // steps until a write-back lands (unless waited for)
  // A model with sliding-window layers: the full group is offloaded, the sliding groups' blocks
  // come from a resident window pool of this many blocks (0: as many as the host pool's; its
  // pages are touched only as blocks fill).
  int64_t offload_window_blocks = 0;
  SparseOptions sparse;  // the sparse attention policy (resident or through the simulated offload)
  // Models with linear-attention layers: sequences whose states are held at once (the engine's
  // max_num_seqs; a sequence waits for a free one). Each costs KvGroups::state_bytes_per_seq()
  // of f32, touched only when used.
  int64_t max_state_seqs = 256;
  // Snapshots of those states at block boundaries, for prefix hits of such models (each the
  // same bytes as one sequence's states, touched only when used); 0: they take no prefix hits.
  int64_t max_state_snapshots = kDefaultStateSnapshots;
};

// The CPU reference model over a CPU paged KV pool.
std::unique_ptr<Executor> make_cpu_executor(std::shared_ptr<Model> model,
                                            const CpuExecutorOptions& options = {});

// Logits from a function (tests, tools): fn(input) -> [vocab] f32 for each row an input wants
// (an input of num_logits rows is passed once per row, cut to end at that row's token). It holds no
// K/V, so `layout` only sizes the engine's block bookkeeping.
using LogitsFn = std::function<std::vector<float>(const StepInput& input)>;
std::unique_ptr<Executor> make_function_executor(int64_t vocab_size, LogitsFn fn,
                                                 KVBlockLayout layout = {1 << 16, 16});

}  // namespace longctx
