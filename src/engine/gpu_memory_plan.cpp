#include "engine/gpu_memory_plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>

#include "attention/backends/offload_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/cuda_graphs.h"
#include "kernels/fp8_stage_params.h"
#include "kv/block_manager.h"
#include "loader/quantize_checkpoint.h"
#include "loader/quantized_weights.h"
#include "loader/weight_spec.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/engine/gpu_runner.h"
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

// The weights a GPU holds, experts spelled as the model loads them: per expert for FP8 blocks (the
// CUDA MoE op runs them packed, ops::moe_runs_fp8_experts), fused (bf16) otherwise.
std::map<std::string, Shape> device_weights(const ModelConfig& config) {
  return expected_weights(config, quantized_expert_layout(config.quantization));
}

// The routed experts' bytes as weight_bytes counts them: FP8 block experts packed (codes and
// scales), others bf16.
int64_t expert_weight_bytes(const ModelConfig& config) {
  const QuantConfig& q = config.quantization;
  int64_t n = 0;
  for (const auto& [name, shape] : device_weights(config)) {
    if (name.find(".mlp.experts.") == std::string::npos) continue;
    n += q.quantized() && quantizes_tensor(name, shape, q) ? quantized_bytes(shape[0], shape[1], q)
                                                           : shape_numel(shape) * kBf16;
  }
  return n;
}

// The MoE op's buffers that do not grow with the tokens: each expert's run of rows is padded to
// whole row tiles (ops/moe_schedule.h: 128 rows on the tensor-core path, 64 on the SIMT one), up
// to a tile of activation (at most fp32) and fp32 output rows per expert; with FP8 block experts
// the cuBLASLt path's scratch of one dequantized expert (16-bit).
int64_t moe_fixed_bytes(const ModelConfig& c) {
  if (c.moe.num_experts == 0) return 0;
  const int64_t rows = std::max(ops::kMoeTcRows, ops::kMoeSimtRows);
  const int64_t fp8_scratch =
      c.quantization.method == QuantMethod::kFp8Block
          ? ops::moe_fp8_scratch_elems(c.hidden_size, c.moe.moe_intermediate_size) * kBf16
          : 0;
  return c.moe.num_experts * rows * 4 * (c.moe.moe_intermediate_size + c.hidden_size + 1) +
         fp8_scratch;
}

}  // namespace

bool decode_graphs(const GpuRunnerOptions& o) {
  const sparse::PolicyDef& policy = sparse::policy_def(o.sparse.policy);
  // Offloaded: only a decode policy's steps, which skip the ring (docs/offload.md, "CUDA graphs").
  return !o.enforce_eager && policy.decode_graphs && (!o.kv_offload || policy.decode);
}

bool decode_graphs(const GpuRunnerOptions& o, const KvGroups& groups) {
  // Offloaded: a one-group model's (sliding groups' and states' resident backends run eagerly).
  return decode_graphs(o) && (!o.kv_offload || groups.single_full());
}

int64_t decode_graph_max_seqs(const GpuRunnerOptions& o) {
  return std::min(o.max_num_seqs, o.max_num_batched_tokens);
}

int64_t scratch_state_slots(const GpuRunnerOptions& o, const KvGroups& groups) {
  return decode_graphs(o, groups) && groups.has_kind(KvGroupKind::kState) ? 1 : 0;
}

int64_t weight_bytes(const ModelConfig& config) {
  const QuantConfig& q = config.quantization;
  int64_t n = 0, scratch = 0;
  for (const auto& [name, shape] : device_weights(config)) {
    if (!q.quantized() || !quantizes_tensor(name, shape, q)) {
      n += shape_numel(shape) * kBf16;
      continue;
    }
    n += quantized_bytes(shape[0], shape[1], q);
    if (name.find(".mlp.experts.") != std::string::npos) continue;  // the MoE op's, not a Linear
    // The packed Linears' workspace (DecoderModel's quant_workspace_): the dequantized scratch
    // of the largest, counting q/k/v and gate/up as the stacked projections they load as.
    const int64_t stacked = name.ends_with("gate_proj.weight") ? 2 * shape[0]
                            : name.ends_with("q_proj.weight")
                                ? config.q_size() + 2 * config.kv_size()
                                : shape[0];
    scratch = std::max(scratch, stacked * shape[1] * kBf16);
  }
  return n + scratch;
}

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
  const std::string states =
      kv_state_bytes > 0
          ? fmt::format(
                ", linear-attention states {} (fp32), state snapshots {} "
                "({} for prefix hits)",
                format_bytes(kv_state_bytes), format_bytes(kv_snapshot_bytes), num_state_snapshots)
          : "";
  if (offload())
    return fmt::format(
        "budget {}: weights {}{}, activations {}, workspaces {}, KV offload: GPU cache {} ({} "
        "blocks of {} tokens, {} per block), ring {} ({} blocks of one layer per slot), merge "
        "buffers {}, sparse {}{}{}; host KV pool {} (pinned, {} blocks = {} tokens = {} "
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
        kv_state_bytes > 0 ? "; the full group offloaded, resident" + states.substr(1)
                           : std::string(),
        format_bytes(host_kv_bytes()), num_host_blocks, num_host_blocks * block_size,
        max_model_len > 0 ? num_host_blocks * block_size / max_model_len : 0);
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
  // The resident groups (sliding windows, linear-attention states and their snapshots) come off
  // the budget before the GPU cache.
  const int64_t left = p.budget - p.weights - p.activations - p.workspaces - p.graphs -
                       p.ring_bytes - p.offload_buffers - p.sparse - p.window_bytes() -
                       p.kv_state_bytes - p.kv_snapshot_bytes;
  LONGCTX_CHECK(options.num_gpu_blocks > 0 || left >= 0, ErrorCode::kOutOfMemory,
                "KV offload: the budget is {} short of what the GPU keeps before its KV cache "
                "(weights, activations, workspaces, graphs, ring, merge buffers, sparse, resident "
                "groups: "
                "{}); raise --gpu-memory-limit{}",
                format_bytes(-left), p.str(),
                p.kv_state_bytes > 0 ? ", or lower --max-num-seqs (a state each) and "
                                       "--max-state-snapshots"
                                     : "");
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
  // FP8 KV: the staged prefill's pool (paged_fp8_stage_bytes: the largest call's pages, here
  // every running sequence at max_model_len, up to the tuning's cap; 16-bit K and V).
  const int64_t stage_pool =
      options.kv_dtype != DType::kFP8E4M3
          ? 0
          : static_cast<int64_t>(kernels::fp8_stage_pool_bytes(
                options.max_num_seqs * ((p.max_model_len + p.block_size - 1) / p.block_size),
                options.tuning.prefill.fp8_stage_mib, static_cast<int>(p.block_size),
                static_cast<int>(config.num_key_value_heads), static_cast<int>(config.head_dim),
                DType::kBF16));
  p.workspaces += stage_pool;
  // Per KV group: a pool block holds the largest paged group's layers (one full group: every
  // layer, as before); state groups take max_num_seqs states up front; a sequence of
  // max_model_len holds blocks in each paged group (a sliding group only its window's).
  const KvGroups groups = KvGroups::from_config(config, options.kv_dtype);
  p.graphs = decode_graphs(options, groups)
                 ? decode_graph_memory_bytes(config, decode_graph_max_seqs(options))
                 : 0;
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
  // KV offload of a model of several groups offloads the full group and keeps the windows
  // (the BlockManager's window pool) and the linear-attention states on the GPU
  // (offload_backend.h).
  const bool grouped = options.kv_offload && !groups.single_full() && groups.offloadable();
  const bool windows = grouped && groups.has_kind(KvGroupKind::kSlidingWindow);
  const BlockManager shape(1, p.block_size, false, groups.allocs(), options.max_num_seqs, 0,
                           windows ? 1 : 0);
  const int64_t per_seq = shape.max_blocks_held(p.max_model_len, options.max_num_batched_tokens);
  if (grouped) {
    const int64_t layers = static_cast<int64_t>(groups[0].layers.size());
    p.kv_block_bytes = p.kv_block_bytes / groups.pool_layers() * layers;
    if (!windows) return plan_offload(config, options, p, per_seq, layers);
    p.workspaces += stage_pool;  // the window pool's backend stages its FP8 prefills too
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

}  // namespace longctx
