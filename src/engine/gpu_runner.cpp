#include "longctx/engine/gpu_runner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "attention/backends/offload_backend.h"
#include "attention/backends/paged_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/cuda_graphs.h"
#include "engine/gpu_sampler.h"
#include "engine/step_batch.h"
#include "kv/block_manager.h"
#include "kv/paged_kv_pool.h"
#include "kv/state_pool.h"
#include "loader/weight_spec.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/models/model.h"
#include "ops/moe_schedule.h"

namespace longctx {

namespace {

constexpr int64_t kBf16 = 2;
// cuBLASLt workspace, attention plans and partials, logits rows: generous fixed headroom.
constexpr int64_t kWorkspaceBytes = 256ll << 20;

int64_t resolve_block_size(const GpuRunnerOptions& o) {
  return o.block_size > 0 ? o.block_size : kDefaultBlockSize;
}

int64_t resolve_max_model_len(const ModelConfig& c, const GpuRunnerOptions& o) {
  return o.max_model_len > 0 ? o.max_model_len : c.max_positions();
}

// Decode steps replay CUDA graphs unless eager, or the policy selects decode pages per step
// (quest, streaming: their decode steps run eagerly). Linear-attention layers read their states
// through the backend's per-step device arrays, which a replay sees refreshed.
bool decode_graphs(const GpuRunnerOptions& o) {
  return !o.enforce_eager && sparse::policy_def(o.sparse.policy).decode_graphs;
}

// State slots beyond the sequences' and the snapshots': the graphs' padding sequences' one.
int64_t scratch_state_slots(const GpuRunnerOptions& o, const KvGroups& groups) {
  return decode_graphs(o) && groups.has_kind(KvGroupKind::kState) ? 1 : 0;
}

// A sparse policy's device bytes per engine block and fixed (the registry's: quest's page
// metadata and selection buffers, xattention's estimate and masks; zeros for full).
// `num_layers`: the layers the policy selects over (0: every layer; with KV offload of a model
// with sliding groups, the full group's).
sparse::SparseGpuBytes sparse_bytes(const ModelConfig& c, const GpuRunnerOptions& o,
                                    int64_t block_size, int64_t max_model_len,
                                    int64_t num_layers = 0) {
  sparse::SparseGpuShape s;
  s.num_layers = num_layers > 0 ? num_layers : c.num_hidden_layers;
  s.block_size = block_size;
  s.num_qo_heads = c.num_attention_heads;
  s.num_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.elem_size = kBf16;
  s.max_tokens = o.max_num_batched_tokens;
  s.max_seqs = o.max_num_seqs;
  s.max_model_len = max_model_len;
  return sparse::sparse_gpu_bytes(o.sparse, s);
}

int64_t weight_bytes(const ModelConfig& config) {
  int64_t n = 0;
  for (const auto& [name, shape] : expected_weights(config)) n += shape_numel(shape);
  return n * kBf16;
}

int64_t expert_weight_bytes(const ModelConfig& config) {
  int64_t n = 0;
  for (const auto& [name, shape] : expected_weights(config))
    if (name.find(".mlp.experts.") != std::string::npos) n += shape_numel(shape);
  return n * kBf16;
}

// The MoE op's buffers that do not grow with the tokens: each expert's run of rows is padded to
// whole row tiles (ops/moe_schedule.h: 128 rows on the tensor-core path, 64 on the SIMT one), up
// to a tile of activation (at most fp32) and fp32 output rows per expert.
int64_t moe_fixed_bytes(const ModelConfig& c) {
  if (c.moe.num_experts == 0) return 0;
  const int64_t rows = std::max(ops::kMoeTcRows, ops::kMoeSimtRows);
  return c.moe.num_experts * rows * 4 * (c.moe.moe_intermediate_size + c.hidden_size + 1);
}

}  // namespace

int64_t activation_bytes_per_token(const ModelConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads, inter = c.intermediate_size;
  // Live at the peak of a layer: the f32 residual, normed input, qkv, contiguous q, attention
  // output, o_proj output, gate_up, the SiLU product and down_proj output.
  int64_t live = 4 * h + kBf16 * (3 * h + (hq + 2 * hkv) * d + 2 * hq * d + 3 * inter);
  if (const MoeConfig& m = c.moe; m.num_experts > 0) {
    // A MoE layer instead of the MLP: router logits and top-k (f32), per routed slot the fp32
    // SiLU product and expert output (ops/moe_cuda.cu) and its row indices, the combined output,
    // and the shared expert's MLP.
    const int64_t k = m.num_experts_per_tok, si = m.shared_expert_intermediate_size;
    const int64_t moe = 4 * m.num_experts + 8 * k + k * (4 * (m.moe_intermediate_size + h) + 8) +
                        kBf16 * (h + 3 * si + h) + 4;
    live = std::max(live, 4 * h + kBf16 * (3 * h + (hq + 2 * hkv) * d + 2 * hq * d) + moe);
  }
  return live * 3 / 2;  // the caching pool's size classes and freed-but-cached blocks
}

std::string GpuMemoryPlan::experts_note() const {
  return expert_weights > 0 ? fmt::format(" (routed experts {})", format_bytes(expert_weights))
                            : std::string();
}

std::string GpuMemoryPlan::str() const {
  if (offload())
    return fmt::format(
        "budget {}: weights {}{}, activations {}, workspaces {}, KV offload: GPU cache {} ({} "
        "blocks of {} tokens, {} per block), ring {} ({} blocks of one layer per slot), merge "
        "buffers {}, sparse {}{}; host KV pool {} (pinned, {} blocks = {} tokens = {} "
        "max_model_len sequences)",
        format_bytes(budget), format_bytes(weights), experts_note(), format_bytes(activations),
        format_bytes(workspaces), format_bytes(kv_bytes()), num_kv_blocks, block_size,
        format_bytes(kv_block_bytes), format_bytes(ring_bytes), slot_blocks,
        format_bytes(offload_buffers), format_bytes(sparse),
        num_window_blocks > 0
            ? fmt::format("; the full group offloaded, sliding windows resident {} ({} blocks, "
                          "{} per block)",
                          format_bytes(window_bytes()), num_window_blocks,
                          format_bytes(window_block_bytes))
            : std::string(),
        format_bytes(host_kv_bytes()), num_host_blocks, num_host_blocks * block_size,
        max_model_len > 0 ? num_host_blocks * block_size / max_model_len : 0);
  const std::string states =
      kv_state_bytes > 0
          ? fmt::format(
                ", linear-attention states {} (fp32), state snapshots {} "
                "({} for prefix hits)",
                format_bytes(kv_state_bytes), format_bytes(kv_snapshot_bytes), num_state_snapshots)
          : "";
  return fmt::format(
      "budget {}: weights {}{}, activations {}, workspaces {}, CUDA graphs {}, sparse {}{}, KV "
      "pool {} ({} blocks of {} tokens, {} per block, {} tokens = {} max_model_len sequences)",
      format_bytes(budget), format_bytes(weights), experts_note(), format_bytes(activations),
      format_bytes(workspaces), format_bytes(graphs), format_bytes(sparse), states,
      format_bytes(kv_bytes()), num_kv_blocks, block_size, format_bytes(kv_block_bytes),
      kv_tokens(), max_model_len > 0 ? kv_tokens() / max_model_len : 0);
}

namespace {

int64_t default_host_kv_bytes() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? pages * page / 2 : (8ll << 30);
}

// With offload the engine's blocks are host blocks; the GPU holds a cache of them, the ring and
// the buffers the partial attentions merge in. The cache must hold every block one step writes:
// the chunk's blocks plus, per sequence, a straddled block and a copy-on-write target.
// `layers`: the offloaded layers (every layer, or a model's full group).
GpuMemoryPlan plan_offload(const ModelConfig& config, const GpuRunnerOptions& options,
                           GpuMemoryPlan p, int64_t per_seq, int64_t layers) {
  LONGCTX_CHECK(options.offload_slots > 0 && options.offload_slot_tokens > 0,
                ErrorCode::kInvalidArgument,
                "KV offload: --offload-slots ({}) and the slot size ({} tokens) must be positive",
                options.offload_slots, options.offload_slot_tokens);
  p.graphs = 0;
  const int64_t layer_block = p.kv_block_bytes / layers;
  p.slot_blocks = std::max<int64_t>(1, options.offload_slot_tokens / p.block_size);
  p.ring_bytes = options.offload_slots * p.slot_blocks * layer_block;
  const int64_t rows = options.max_num_batched_tokens * config.num_attention_heads;
  p.offload_buffers = rows * config.head_dim * 8 + rows * 8;  // fp32 partial and merged states
  const int64_t host = options.host_kv_bytes > 0 ? options.host_kv_bytes : default_host_kv_bytes();
  p.num_host_blocks = host / p.kv_block_bytes;
  const sparse::SparseGpuBytes q =
      sparse_bytes(config, options, p.block_size, p.max_model_len, layers);
  p.sparse = q.per_block * p.num_host_blocks + q.fixed;
  if (sparse::policy_def(options.sparse.policy).offload_staging) {  // host keys staged per step
    OffloadGeometry g;
    g.num_layers = layers;
    g.block_size = p.block_size;
    g.num_host_blocks = p.num_host_blocks;
    p.sparse += xattn_offload_staging(g, p.max_model_len).bytes(layer_block);
  }
  const int64_t left = p.budget - p.weights - p.activations - p.workspaces - p.ring_bytes -
                       p.offload_buffers - p.sparse - p.window_bytes();
  p.num_kv_blocks =
      options.num_gpu_blocks > 0
          ? options.num_gpu_blocks
          : std::max<int64_t>(
                0, (options.gpu_kv_bytes > 0 ? std::min(options.gpu_kv_bytes, left) : left) /
                       p.kv_block_bytes);
  const int64_t need =
      (options.max_num_batched_tokens + p.block_size - 1) / p.block_size + 2 * options.max_num_seqs;
  LONGCTX_CHECK(p.num_kv_blocks >= need, ErrorCode::kOutOfMemory,
                "KV offload: the GPU cache holds {} blocks, a step may write {} ({} tokens per "
                "step, {} sequences); lower --max-num-batched-tokens or --max-num-seqs, or raise "
                "--gpu-kv-budget / --gpu-memory-limit ({})",
                p.num_kv_blocks, need, options.max_num_batched_tokens, options.max_num_seqs,
                p.str());
  LONGCTX_CHECK(p.num_host_blocks >= per_seq && p.num_host_blocks < (1ll << 30),
                ErrorCode::kOutOfMemory,
                "KV offload: the host KV pool holds {} tokens, less than one sequence of "
                "max_model_len {} (or too many blocks); raise --host-kv-budget ({})",
                p.num_host_blocks * p.block_size, p.max_model_len, p.str());
  return p;
}

}  // namespace

GpuMemoryPlan plan_gpu_memory(const ModelConfig& config, const GpuRunnerOptions& options,
                              int64_t budget) {
  GpuMemoryPlan p;
  p.budget = budget;
  p.weights = weight_bytes(config);
  p.expert_weights = expert_weight_bytes(config);
  p.block_size = resolve_block_size(options);
  p.max_model_len = resolve_max_model_len(config, options);
  p.activations = options.max_num_batched_tokens * activation_bytes_per_token(config);
  // Logits rows, and the sampler's copies of penalized rows.
  // A verifying sequence (speculative decoding) has 1 + K logits rows.
  const int64_t logits_rows = options.max_num_seqs * (1 + options.num_speculative_tokens);
  p.workspaces = kWorkspaceBytes + (logits_rows + options.max_num_seqs) * config.vocab_size * 4 +
                 moe_fixed_bytes(config);
  // Per KV group: a pool block holds the largest paged group's layers (one full group: every
  // layer, as before); state groups take max_num_seqs states up front; a sequence of
  // max_model_len holds blocks in each paged group (a sliding group only its window's).
  const KvGroups groups = KvGroups::from_config(config, options.kv_dtype);
  p.graphs = decode_graphs(options) ? decode_graph_memory_bytes(config, options.max_num_seqs) : 0;
  p.kv_block_bytes = groups.block_bytes(p.block_size);
  // States (fp32, as the kernels keep them) of every sequence a step may run, and the prefix
  // cache's snapshots of them; with graphs, the padding sequences' scratch slot.
  p.kv_state_bytes =
      (options.max_num_seqs + scratch_state_slots(options, groups)) * groups.state_bytes_per_seq();
  LONGCTX_CHECK(options.max_state_snapshots >= 0, ErrorCode::kInvalidArgument,
                "GPU memory plan: {} state snapshots", options.max_state_snapshots);
  if (groups.has_kind(KvGroupKind::kState)) p.num_state_snapshots = options.max_state_snapshots;
  p.kv_snapshot_bytes = p.num_state_snapshots * groups.state_bytes_per_seq();
  p.kv_groups = groups.describe();
  // KV offload of a model with sliding groups offloads the full group and keeps the windows on
  // the GPU (offload_backend.h): the BlockManager's window pool.
  const bool windows = options.kv_offload && !groups.single_full() && groups.offloadable();
  const BlockManager shape(1, p.block_size, false, groups.allocs(), options.max_num_seqs, 0,
                           windows ? 1 : 0);
  const int64_t per_seq = shape.max_blocks_held(p.max_model_len, options.max_num_batched_tokens);
  if (windows) {
    const int64_t layers = static_cast<int64_t>(groups[0].layers.size());
    p.kv_block_bytes = p.kv_block_bytes / groups.pool_layers() * layers;
    p.window_block_bytes = groups.without_first().block_bytes(p.block_size);
    // Each running sequence holds its window (the blocks from the one holding its first new
    // token's window start) and a partial block; the step's new tokens, shared by the step's
    // sequences, add at most a block each beyond. Never less than one max_model_len sequence's.
    const int64_t step_blocks = (options.max_num_batched_tokens + p.block_size - 1) / p.block_size;
    for (int64_t g = 1; g < groups.size(); ++g)
      p.num_window_blocks +=
          options.max_num_seqs * ((groups[g].window - 1 + p.block_size - 1) / p.block_size + 2) +
          step_blocks;
    p.num_window_blocks = std::max(
        p.num_window_blocks,
        shape.max_blocks_held(p.max_model_len, options.max_num_batched_tokens, BlockPool::kWindow));
    return plan_offload(config, options, p, per_seq, layers);
  }
  if (options.kv_offload)
    return plan_offload(config, options, p, per_seq, config.num_hidden_layers);
  const sparse::SparseGpuBytes q = sparse_bytes(config, options, p.block_size, p.max_model_len);
  const int64_t left = budget - p.weights - p.activations - p.workspaces - p.graphs - q.fixed -
                       p.kv_state_bytes - p.kv_snapshot_bytes;
  p.num_kv_blocks = options.num_gpu_blocks > 0
                        ? options.num_gpu_blocks
                        : std::max<int64_t>(0, left / (p.kv_block_bytes + q.per_block));
  p.sparse = q.per_block * p.num_kv_blocks + q.fixed;
  // As vLLM: refuse a configuration that cannot hold even one sequence of max_model_len.
  // (Blocks, not tokens: with several KV groups one sequence holds blocks in each.)
  LONGCTX_CHECK(p.num_kv_blocks >= per_seq, ErrorCode::kOutOfMemory,
                "GPU memory plan: the KV cache holds {} blocks, fewer than the {} one sequence of "
                "max_model_len {} needs across its {} KV group(s) ({}); lower --max-model-len or "
                "--max-num-batched-tokens, or raise --gpu-memory-limit / "
                "--gpu-memory-utilization",
                p.num_kv_blocks, per_seq, p.max_model_len, p.kv_groups.size(), p.str());
  return p;
}

struct GpuRunner::Impl {
  // Standalone use (no engine): the runner keeps each sequence's blocks itself.
  struct OwnedSeq {
    std::vector<int32_t> blocks;
    int64_t num_tokens = 0;  // tokens whose K/V are in the pool
  };

  std::shared_ptr<Model> model;
  GpuRunnerOptions options;
  KvGroups groups;  // the model's (attention/kv_groups.h)
  GpuMemoryPlan plan;
  std::unique_ptr<PagedKVPool> pool;  // resident KV
  // A state group's slots (linear attention): [0, max_num_seqs) the sequences', then the prefix
  // cache's snapshots.
  std::unique_ptr<StatePool> states;
  int64_t state_group = -1;
  ExecutorCounters snapshot_counters;          // the snapshots' copies (its state_* fields)
  OffloadAttentionBackend* offload = nullptr;  // or offloaded KV (owned by `attention`)
  // Offload of a model with sliding groups: their resident pool and backend (offload_backend.h).
  std::unique_ptr<KvGroups> window_groups;
  std::unique_ptr<PagedKVPool> window_pool;
  std::unique_ptr<AttentionBackend> window_attention;
  std::vector<int32_t> free_ids;  // offload, standalone: free host blocks
  std::unique_ptr<AttentionBackend> attention;
  std::unordered_map<uint64_t, OwnedSeq> owned;
  uint64_t next_scratch_id = ~uint64_t(0);
  bool engine_attached = false;
  std::unique_ptr<GpuSampler> sampler;   // engine mode
  std::unique_ptr<DecodeGraphs> graphs;  // engine mode, unless enforce_eager
  int64_t max_blocks = 0;                // block-table entries per step (backend limit)

  void check_standalone() const {
    LONGCTX_CHECK(!engine_attached, ErrorCode::kInvalidArgument,
                  "GPU runner: an engine owns this runner's KV blocks; standalone calls "
                  "(execute_standalone, prompt_logits) need a runner of their own");
    LONGCTX_CHECK(groups.single_full(), ErrorCode::kUnsupported,
                  "GPU runner: standalone calls keep one block table per sequence; this model "
                  "has {} KV groups ({}): run it through an engine (LLM, the server)",
                  groups.size(), groups.summary());
  }

  int64_t num_blocks() const { return pool ? pool->num_blocks() : plan.num_host_blocks; }

  // A prefix hit's state comes from its snapshot before the step (restore); a chunk ending on a
  // block boundary leaves one after it (save). Device copies on the current stream, ordered
  // with the step's kernels.
  void copy_snapshots(std::span<const StepInput> inputs, bool save) {
    copy_state_snapshots(
        {states.get(), state_group, options.max_num_seqs, plan.num_state_snapshots}, inputs, save,
        snapshot_counters, "GPU runner");
  }
  int64_t block_size() const { return plan.block_size; }

  std::vector<int32_t> allocate(int64_t n) {
    if (pool) return pool->allocate(n);
    LONGCTX_CHECK(n <= static_cast<int64_t>(free_ids.size()), ErrorCode::kOutOfMemory,
                  "KV offload: {} host blocks needed, {} free", n, free_ids.size());
    std::vector<int32_t> out(free_ids.end() - n, free_ids.end());
    std::reverse(out.begin(), out.end());  // ascending ids: long runs for the ring's copies
    free_ids.resize(free_ids.size() - n);
    return out;
  }
  void free(const std::vector<int32_t>& blocks) {
    if (pool) return pool->free(blocks);
    free_ids.insert(free_ids.end(), blocks.rbegin(), blocks.rend());
  }

  static void copy_pool_blocks(PagedKVPool& kv, std::span<const KVBlockCopy> copies) {
    for (const KVBlockCopy& c : copies) {
      LONGCTX_CHECK(c.src >= 0 && c.src < kv.num_blocks() && c.dst >= 0 && c.dst < kv.num_blocks(),
                    ErrorCode::kInternal, "GPU runner: KV block copy {} -> {} outside {} blocks",
                    c.src, c.dst, kv.num_blocks());
      for (int64_t l = 0; l < kv.config().num_layers; ++l) {
        kv.k(l).select(0, c.dst).copy_from(kv.k(l).select(0, c.src));
        kv.v(l).select(0, c.dst).copy_from(kv.v(l).select(0, c.src));
        if (kv.config().fp8()) {  // the block's scales travel with its codes
          kv.k_scale(l).select(0, c.dst).copy_from(kv.k_scale(l).select(0, c.src));
          kv.v_scale(l).select(0, c.dst).copy_from(kv.v_scale(l).select(0, c.src));
        }
      }
    }
  }

  void copy_blocks(std::span<const KVBlockCopy> copies) {
    // Offload: host blocks through the planner, window blocks into the window pool.
    if (offload != nullptr) return attention->copy_blocks(copies);
    copy_pool_blocks(*pool, copies);
    attention->copy_blocks(copies);  // a sparse policy's block metadata follows
  }

  // KV offload of a model with sliding groups: the window pool on the GPU (ids after the host
  // pool's in the engine's numbering) and a paged backend over it for the sliding layers.
  void make_window_pool(OffloadAttentionBackend& backend) {
    const ModelConfig& c = model->config();
    window_groups = std::make_unique<KvGroups>(groups.without_first());
    PagedKVPoolConfig kv{
        window_groups->pool_layers(), c.num_key_value_heads,     c.head_dim,     plan.block_size,
        plan.num_window_blocks,       model->activation_dtype(), model->device()};
    if (options.kv_dtype == DType::kFP8E4M3) {  // as the plan counted the windows' blocks
      kv.dtype = DType::kFP8E4M3;
      kv.fp8_source_dtype = model->activation_dtype();
    }
    window_pool = std::make_unique<PagedKVPool>(kv);
    PagedBackendLimits limits;
    limits.max_tokens = options.max_num_batched_tokens;
    limits.max_seqs = options.max_num_seqs;
    // Entries, not blocks: a sliding table names every block of the sequence (-1 before the
    // window).
    limits.max_blocks =
        options.max_num_seqs * ((plan.max_model_len + plan.block_size - 1) / plan.block_size);
    limits.max_seq_len = plan.max_model_len;
    window_attention =
        make_paged_attention_backend(*window_pool, c.num_attention_heads, model->attention_scale(),
                                     limits, SparseOptions{}, options.tuning, window_groups.get());
    backend.set_window_groups(
        groups, *window_attention, plan.num_host_blocks,
        [this](std::span<const KVBlockCopy> copies) { copy_pool_blocks(*window_pool, copies); });
  }

  // One forward; device f32 logits of the rows the batch asks for.
  Tensor forward(const ForwardBatch& batch) {
    LONGCTX_CHECK(batch.num_tokens() <= options.max_num_batched_tokens &&
                      batch.num_seqs() <= options.max_num_seqs,
                  ErrorCode::kInvalidArgument,
                  "GPU runner: a step of {} tokens in {} sequences exceeds the runner's limits "
                  "({} tokens, {} sequences)",
                  batch.num_tokens(), batch.num_seqs(), options.max_num_batched_tokens,
                  options.max_num_seqs);
    for (int32_t len : batch.kv_lens) {
      LONGCTX_CHECK(len <= plan.max_model_len, ErrorCode::kOutOfRange,
                    "GPU runner: a sequence reaches {} tokens, past max_model_len {}", len,
                    plan.max_model_len);
    }
    return model->forward(batch, *attention);
  }

  // Standalone: the inputs' new tokens (num_new 0 = all the rest) cut into forwards of at most
  // max_num_batched_tokens tokens and max_num_seqs sequences, over the runner's own blocks.
  // `all_rows`: logits of every new token, else of each input's last.
  std::vector<std::pair<std::vector<size_t>, Tensor>> run_owned(std::span<const StepInput> inputs,
                                                                bool all_rows) {
    struct Piece {
      size_t input;
      StepInput step;
    };
    std::vector<std::vector<Piece>> batches(1);
    int64_t room = options.max_num_batched_tokens;
    auto flush = [&] {
      if (!batches.back().empty()) batches.emplace_back();
      room = options.max_num_batched_tokens;
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      const StepInput& in = inputs[i];
      const int64_t end = in.num_new > 0 ? in.num_computed + in.num_new
                                         : static_cast<int64_t>(in.all_tokens.size());
      LONGCTX_CHECK(in.num_computed < end && end <= static_cast<int64_t>(in.all_tokens.size()),
                    ErrorCode::kInvalidArgument,
                    "GPU runner: sequence {} runs tokens [{}, {}) of {}", in.seq_id,
                    in.num_computed, end, in.all_tokens.size());
      for (int64_t begin = in.num_computed; begin < end;) {
        if (room == 0 || static_cast<int64_t>(batches.back().size()) == options.max_num_seqs)
          flush();
        const int64_t n = std::min(end - begin, room);
        StepInput p = in;
        p.num_computed = begin;
        p.num_new = n;
        p.want_logits = all_rows || begin + n == end;
        p.num_logits = 1;
        batches.back().push_back({i, p});
        begin += n;
        room -= n;
        if (begin < end) flush();
      }
    }
    if (batches.back().empty()) batches.pop_back();
    std::vector<std::pair<std::vector<size_t>, Tensor>> results;
    const int64_t bs = block_size();
    for (auto& pieces : batches) {
      std::vector<StepInput> steps;
      std::vector<size_t> rows;
      for (Piece& p : pieces) {
        OwnedSeq& s = owned[p.step.seq_id];
        LONGCTX_CHECK(s.num_tokens == p.step.num_computed, ErrorCode::kInvalidArgument,
                      "GPU runner: sequence {} holds {} tokens, the step starts at {}",
                      p.step.seq_id, s.num_tokens, p.step.num_computed);
        const int64_t need = (p.step.num_computed + p.step.num_new + bs - 1) / bs;
        if (need > static_cast<int64_t>(s.blocks.size())) {
          std::vector<int32_t> more = allocate(need - static_cast<int64_t>(s.blocks.size()));
          s.blocks.insert(s.blocks.end(), more.begin(), more.end());
        }
        p.step.block_table = s.blocks;
        steps.push_back(p.step);
        if (p.step.want_logits) rows.push_back(p.input);
      }
      ForwardBatch batch = make_forward_batch(steps, bs);
      if (all_rows) {
        batch.logits_indices.clear();
        for (int64_t t = 0; t < batch.num_tokens(); ++t)
          batch.logits_indices.push_back(static_cast<int32_t>(t));
      }
      Tensor logits = forward(batch);
      for (const StepInput& st : steps) owned[st.seq_id].num_tokens = st.num_computed + st.num_new;
      results.emplace_back(std::move(rows), std::move(logits));
    }
    return results;
  }

  void release_owned(uint64_t seq_id) {
    auto it = owned.find(seq_id);
    if (it == owned.end()) return;
    free(it->second.blocks);
    owned.erase(it);
  }
};

GpuRunner::GpuRunner(std::shared_ptr<Model> model, const GpuRunnerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  LONGCTX_CHECK(model != nullptr && model->device().is_cuda(), ErrorCode::kInvalidArgument,
                "GPU runner: the model must be on a CUDA device");
  LONGCTX_CHECK(options.max_num_batched_tokens > 0 && options.max_num_seqs > 0,
                ErrorCode::kInvalidArgument,
                "GPU runner: max_num_batched_tokens and max_num_seqs must be positive");
  const bool fp8 = options.kv_dtype == DType::kFP8E4M3;
  Impl& m = *impl_;
  m.model = std::move(model);
  m.options = options;
  const ModelConfig& c = m.model->config();
  // Full and sliding-window groups share the paged pool (each layer reads its group's tables and
  // window); a per-sequence state group (linear attention) keeps fp32 states in a device
  // StatePool, and the offload ring moves the blocks of one full group.
  m.groups = KvGroups::from_config(c, fp8 ? DType::kFP8E4M3 : DType::kBF16);
  const KvGroups& groups = m.groups;
  // Offload takes the full group and keeps sliding groups resident (offload_backend.h).
  LONGCTX_CHECK(groups.offloadable() || !options.kv_offload, ErrorCode::kUnsupported,
                "GPU runner: KV offload runs models of one full-attention KV group and sliding "
                "groups; this one has {} ({}{}): run it without --kv-offload",
                groups.size(), groups.summary(),
                groups.has_kind(KvGroupKind::kState)
                    ? "; the offload path does not run linear-attention state groups"
                : groups.has_kind(KvGroupKind::kFull)
                    ? ""
                    : "; every layer has a sliding window, whose KV stays resident: nothing to "
                      "offload");
  const int device = m.model->device().index;
  const DeviceMemoryStats st = device_memory_stats(device);
  // The weights are already in the pool: plan the rest of the budget around what they took.
  m.plan = plan_gpu_memory(c, options, st.budget - st.in_use + weight_bytes(c));
  m.plan.weights = st.in_use;
  if (m.plan.offload()) {
    OffloadDeviceConfig d;
    const int64_t layers =
        groups.single_full() ? c.num_hidden_layers : static_cast<int64_t>(groups[0].layers.size());
    d.geometry = {layers,
                  m.plan.block_size,
                  m.plan.num_host_blocks,
                  m.plan.num_kv_blocks,
                  options.offload_slots,
                  m.plan.slot_blocks};
    d.num_qo_heads = c.num_attention_heads;
    d.num_kv_heads = c.num_key_value_heads;
    d.head_dim = c.head_dim;
    d.dtype = m.model->activation_dtype();
    if (fp8) d.kv_format = kernels::KvCacheFormat::kFp8E4M3;  // codes and scales move together
    d.sm_scale = m.model->attention_scale();
    d.device = m.model->device();
    d.max_tokens = options.max_num_batched_tokens;
    d.max_seqs = options.max_num_seqs;
    d.sparse = options.sparse;
    d.max_model_len = m.plan.max_model_len;
    d.tuning = options.tuning;
    auto backend =
        std::make_unique<OffloadAttentionBackend>(d.geometry, make_cuda_offload_device(d));
    backend->set_layer_block_bytes(d.layer_block_bytes());
    m.offload = backend.get();
    if (m.plan.num_window_blocks > 0) m.make_window_pool(*backend);
    m.attention = std::move(backend);
    for (int64_t b = m.plan.num_host_blocks; b-- > 0;)
      m.free_ids.push_back(static_cast<int32_t>(b));
    return;
  }
  for (int64_t g = 0; g < groups.size(); ++g) {
    if (groups[g].kind != KvGroupKind::kState) continue;
    LONGCTX_CHECK(m.states == nullptr, ErrorCode::kUnsupported,
                  "GPU runner: more than one per-sequence state KV group ({})", groups.summary());
    // Linear attention (Qwen3-Next): the Gated DeltaNet state and the conv's last inputs, the
    // shapes the CPU executor keeps (the memory plan counted them: kv_state_bytes and
    // kv_snapshot_bytes).
    const LinearAttentionConfig& l = c.linear;
    const int64_t conv_dim =
        2 * l.num_key_heads * l.key_head_dim + l.num_value_heads * l.value_head_dim;
    m.state_group = g;
    m.states = std::make_unique<StatePool>(
        options.max_num_seqs + m.plan.num_state_snapshots + scratch_state_slots(options, groups),
        static_cast<int64_t>(groups[g].layers.size()),
        Shape{l.num_value_heads, l.key_head_dim, l.value_head_dim},
        Shape{l.conv_kernel_dim - 1, conv_dim}, m.model->device());
  }
  // The pool holds the largest paged group's layers (one full group: every layer).
  PagedKVPoolConfig kv{groups.pool_layers(), c.num_key_value_heads, c.head_dim,
                       m.plan.block_size,    m.plan.num_kv_blocks,  m.model->activation_dtype(),
                       m.model->device()};
  if (fp8) {
    kv.dtype = DType::kFP8E4M3;
    kv.fp8_source_dtype = m.model->activation_dtype();
  }
  m.pool = std::make_unique<PagedKVPool>(kv);
  PagedBackendLimits limits;
  limits.max_tokens = options.max_num_batched_tokens;
  limits.max_seqs = options.max_num_seqs;
  // Entries, not distinct blocks: shared prefix blocks and the graphs' padding block repeat.
  limits.max_blocks =
      options.max_num_seqs * ((m.plan.max_model_len + m.plan.block_size - 1) / m.plan.block_size);
  limits.max_seq_len = m.plan.max_model_len;
  m.max_blocks = limits.max_blocks;
  m.attention = make_paged_attention_backend(*m.pool, c.num_attention_heads,
                                             m.model->attention_scale(), limits, options.sparse,
                                             options.tuning, &m.groups, m.states.get());
}

GpuRunner::~GpuRunner() = default;

const GpuMemoryPlan& GpuRunner::memory_plan() const { return impl_->plan; }

int64_t GpuRunner::vocab_size() const { return impl_->model->config().vocab_size; }

KVBlockLayout GpuRunner::kv_layout() const {
  if (impl_->offload != nullptr) {
    KVBlockLayout l{impl_->plan.num_host_blocks, impl_->plan.block_size};
    if (impl_->window_pool) {
      l.groups = impl_->groups.allocs();
      l.num_window_blocks = impl_->window_pool->num_blocks();
    }
    return l;
  }
  // With graphs the last block is the padding sequences' scratch block, never handed out.
  const int64_t reserved = decode_graphs(impl_->options) ? 1 : 0;
  KVBlockLayout l{impl_->pool->num_blocks() - reserved, impl_->pool->block_size()};
  if (!impl_->groups.single_full()) l.groups = impl_->groups.allocs();
  if (impl_->states != nullptr) {
    l.num_state_slots = impl_->options.max_num_seqs;
    l.num_state_snapshots = impl_->plan.num_state_snapshots;
  }
  return l;
}

GpuRunner::OffloadCounters GpuRunner::offload_counters() const {
  OffloadCounters c;
  if (impl_->offload == nullptr) return c;
  const OffloadStats& s = impl_->offload->stats();
  c.steps = s.steps;
  c.ring_blocks_loaded = s.ring_blocks_loaded;
  c.blocks_written_back = s.blocks_written_back;
  c.blocks_reloaded = s.blocks_reloaded;
  c.host_bytes_loaded = s.host_bytes_loaded;
  c.host_bytes_written = s.host_bytes_written;
  c.sparse_host_bytes_read = impl_->offload->sparse_host_bytes_read();
  return c;
}

GpuRunner::SparseCounters GpuRunner::sparse_counters() const {
  if (impl_->attention == nullptr) return {};
  const SparsePrefillCounters c = impl_->attention->sparse_prefill_counters();
  return {c.kept, c.causal};
}

Tensor GpuRunner::execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) {
  Impl& m = *impl_;
  m.copy_blocks(copies);
  // (A state group's tables are one slot per sequence: the allocs say which group is one.)
  const std::vector<KvGroupAlloc> allocs = m.groups.allocs();
  ForwardBatch batch = make_forward_batch(inputs, m.block_size(), allocs);
  const bool graph = m.graphs != nullptr && m.graphs->can_run(batch);
  if (m.states == nullptr) return graph ? m.graphs->run(batch) : m.forward(batch);
  m.copy_snapshots(inputs, /*save=*/false);
  Tensor logits = graph ? m.graphs->run(batch) : m.forward(batch);
  m.copy_snapshots(inputs, /*save=*/true);
  return logits;
}

std::vector<SampleResult> GpuRunner::sample(const Tensor& logits,
                                            std::span<const SamplingParams* const> params,
                                            std::span<SamplerState* const> states) {
  Impl& m = *impl_;
  LONGCTX_CHECK(m.sampler != nullptr, ErrorCode::kInvalidArgument,
                "GPU runner: sampling on the device needs an engine-attached runner");
  if (params.empty()) return {};
  return m.sampler->sample(logits, states, params);
}

int64_t GpuRunner::graph_memory_bytes() const {
  return impl_->graphs != nullptr ? impl_->graphs->memory_bytes() : 0;
}

Tensor GpuRunner::execute_standalone(std::span<const StepInput> inputs) {
  Impl& m = *impl_;
  m.check_standalone();
  const int64_t vocab = vocab_size();
  Tensor out = Tensor::empty({static_cast<int64_t>(inputs.size()), vocab}, DType::kF32);
  for (auto& [rows, logits] : m.run_owned(inputs, /*all_rows=*/false)) {
    Tensor host = logits.to(Device::cpu());
    for (size_t r = 0; r < rows.size(); ++r)
      std::memcpy(out.data<float>() + rows[r] * vocab, host.data<float>() + r * vocab,
                  vocab * sizeof(float));
  }
  return out;
}

Tensor GpuRunner::prompt_logits(std::span<const int32_t> ids) {
  Impl& m = *impl_;
  m.check_standalone();
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = vocab_size();
  LONGCTX_CHECK(n > 0, ErrorCode::kInvalidArgument, "forward: no input tokens");
  LONGCTX_CHECK(n <= m.plan.max_model_len, ErrorCode::kOutOfRange,
                "forward: {} tokens, past max_model_len {}", n, m.plan.max_model_len);
  const uint64_t id = m.next_scratch_id--;
  Tensor out = Tensor::empty({n, vocab}, DType::kF32);
  try {
    StepInput in{id, ids, 0, n, {}, true};
    int64_t row = 0;
    for (auto& [rows, logits] : m.run_owned({&in, 1}, /*all_rows=*/true)) {
      const int64_t r = logits.size(0);
      out.slice(0, row, row + r).copy_from(logits.to(Device::cpu()));
      row += r;
    }
  } catch (...) {
    m.release_owned(id);
    throw;
  }
  m.release_owned(id);
  return out;
}

void GpuRunner::release(uint64_t seq_id) { impl_->release_owned(seq_id); }

void GpuRunner::attach_engine() {
  Impl& m = *impl_;
  LONGCTX_CHECK(!m.engine_attached, ErrorCode::kInvalidArgument,
                "GPU runner: already driven by an engine");
  LONGCTX_CHECK(m.owned.empty(), ErrorCode::kInvalidArgument,
                "GPU runner: {} standalone sequences still hold blocks", m.owned.size());
  m.engine_attached = true;
  m.sampler = std::make_unique<GpuSampler>(m.options.max_num_seqs, vocab_size(), m.model->device());
  if (decode_graphs(m.options) && m.pool != nullptr) {  // offload steps are not graph-shaped
    DecodeGraphOptions g;
    g.max_num_seqs = m.options.max_num_seqs;
    g.scratch_block = static_cast<int32_t>(m.pool->num_blocks() - 1);  // kept from the engine
    // The state pool's last slot, after the sequences' and the snapshots' (never handed out).
    if (m.states != nullptr) g.scratch_state_slot = static_cast<int32_t>(m.states->num_slots() - 1);
    g.max_blocks = m.max_blocks;
    m.graphs = std::make_unique<DecodeGraphs>(*m.model, *m.attention, *m.pool, g);
    m.graphs->capture();
  }
}

ExecutorCounters GpuRunner::state_counters() const { return impl_->snapshot_counters; }

int64_t GpuRunner::kv_block_bytes() const {
  const Impl& m = *impl_;
  // Not with offload, several KV groups or a policy that selects (its page summaries would not
  // see an imported block).
  if (m.pool == nullptr || m.offload != nullptr || !m.groups.single_full() ||
      sparse::selects(m.options.sparse, sparse::Phase::kDecode) ||
      sparse::selects(m.options.sparse, sparse::Phase::kPrefill))
    return 0;
  return m.pool->config().bytes_per_block();
}

std::string GpuRunner::kv_block_format() const {
  return fmt::format("gpu-{}", dtype_name(impl_->pool->config().dtype));
}

void GpuRunner::read_kv_block(int32_t block, std::span<std::byte> out) const {
  LONGCTX_CHECK(kv_block_bytes() > 0, ErrorCode::kInternal,
                "GPU runner: KV block export without a resident one-group pool");
  impl_->pool->read_block(block, out);
}

void GpuRunner::write_kv_block(int32_t block, std::span<const std::byte> in) {
  LONGCTX_CHECK(kv_block_bytes() > 0, ErrorCode::kInternal,
                "GPU runner: KV block import without a resident one-group pool");
  impl_->pool->write_block(block, in);
}

}  // namespace longctx
