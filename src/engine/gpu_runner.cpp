#include "longctx/engine/gpu_runner.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "attention/backends/offload_backend.h"
#include "attention/backends/paged_backend.h"
#include "attention/backends/phase_profile.h"
#include "attention/sparse/kv_export.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/cuda_graphs.h"
#include "engine/gpu_memory_plan.h"
#include "engine/gpu_sampler.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "kv/state_pool.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/models/model.h"

namespace longctx {

struct GpuRunner::Impl {
  std::shared_ptr<Model> model;
  GpuRunnerOptions options;
  KvGroups groups;  // the model's (attention/kv_groups.h)
  GpuMemoryPlan plan;
  std::unique_ptr<PagedKVPool> pool;  // resident KV
  DType kv_dtype = DType::kBF16;      // the KV cache's (FP8: kFP8E4M3), resident or offloaded
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
  std::unique_ptr<AttentionBackend> attention;
  bool engine_attached = false;
  std::unique_ptr<GpuSampler> sampler;    // from attach_engine() on
  std::unique_ptr<DecodeGraphs> graphs;   // from attach_engine() on, unless enforce_eager
  std::shared_ptr<PhaseRecorder> phases;  // profile_phases() (a measurement mode), else null
  PagedPhaseHook paged_phases;            // the resident paged backend's (empty under offload)
  int64_t max_blocks = 0;                 // block-table entries per step (backend limit)

  // The state group's slots (the snapshots' copies are device copies on the current stream,
  // ordered with the step's kernels).
  StateSlots state_slots() const {
    return {states.get(), state_group, options.max_num_seqs, plan.num_state_snapshots};
  }
  int64_t block_size() const { return plan.block_size; }

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
  // Offload takes the full group and keeps sliding groups or linear-attention states resident
  // (offload_backend.h).
  LONGCTX_CHECK(groups.offloadable() || !options.kv_offload, ErrorCode::kUnsupported,
                "GPU runner: KV offload runs models of one full-attention KV group and either "
                "sliding groups or linear-attention state groups; this one has {} ({}{}): run it "
                "without --kv-offload",
                groups.size(), groups.summary(),
                groups.has_kind(KvGroupKind::kFull)
                    ? ""
                    : "; every layer has a sliding window, whose KV stays resident: nothing to "
                      "offload");
  const int device = m.model->device().index;
  const DeviceMemoryStats st = device_memory_stats(device);
  // The weights are already in the pool: plan the rest of the budget around what they took.
  m.plan = plan_gpu_memory(c, options, st.budget - st.in_use + weight_bytes(c));
  m.plan.weights = st.in_use;
  for (int64_t g = 0; g < groups.size(); ++g) {
    if (groups[g].kind != KvGroupKind::kState) continue;
    LONGCTX_CHECK(m.states == nullptr, ErrorCode::kUnsupported,
                  "GPU runner: more than one per-sequence state KV group ({})", groups.summary());
    // Linear attention (Qwen3-Next): the Gated DeltaNet state and the conv's last inputs, the
    // shapes the CPU executor keeps (the memory plan counted them: kv_state_bytes and
    // kv_snapshot_bytes). Resident also when the full group is offloaded.
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
  m.kv_dtype = fp8 ? DType::kFP8E4M3 : m.model->activation_dtype();
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
    if (m.states != nullptr) backend->set_state_groups(groups, *m.states);
    m.attention = std::move(backend);
    return;
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
  m.attention = make_paged_attention_backend(
      *m.pool, c.num_attention_heads, m.model->attention_scale(), limits, options.sparse,
      options.tuning, &m.groups, m.states.get(), &m.paged_phases);
}

GpuRunner::~GpuRunner() = default;

const GpuMemoryPlan& GpuRunner::memory_plan() const { return impl_->plan; }

const GpuRunnerOptions& GpuRunner::options() const { return impl_->options; }

int64_t GpuRunner::vocab_size() const { return impl_->model->config().vocab_size; }

KVBlockLayout GpuRunner::kv_layout() const {
  // With graphs the last block (a host block with offload) is the padding sequences' scratch
  // block, never handed out.
  const int64_t reserved = decode_graphs(impl_->options, impl_->groups) ? 1 : 0;
  if (impl_->offload != nullptr) {
    KVBlockLayout l{impl_->plan.num_host_blocks - reserved, impl_->plan.block_size};
    if (!impl_->groups.single_full()) l.groups = impl_->groups.allocs();
    if (impl_->window_pool) l.num_window_blocks = impl_->window_pool->num_blocks();
    if (impl_->states != nullptr) {
      l.num_state_slots = impl_->options.max_num_seqs;
      l.num_state_snapshots = impl_->plan.num_state_snapshots;
    }
    return l;
  }
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
  c.sparse_pages_reused = impl_->offload->sparse_pages_reused();
  return c;
}

GpuRunner::SparseCounters GpuRunner::sparse_counters() const {
  if (impl_->attention == nullptr) return {};
  const SparsePrefillCounters c = impl_->attention->sparse_prefill_counters();
  return {c.kept, c.causal};
}

Tensor GpuRunner::execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) {
  Impl& m = *impl_;
  LONGCTX_CHECK(m.engine_attached, ErrorCode::kInvalidArgument,
                "GPU runner: steps come through make_gpu_executor (an engine or an "
                "ExecutorSession), whose block manager owns the KV blocks");
  m.copy_blocks(copies);
  // (A state group's tables are one slot per sequence: the allocs say which group is one.)
  const std::vector<KvGroupAlloc> allocs = m.groups.allocs();
  ForwardBatch batch = make_forward_batch(inputs, m.block_size(), allocs);
  const bool graph = m.graphs != nullptr && m.graphs->can_run(batch);
  return run_model_step(m.state_slots(), inputs, m.snapshot_counters, "GPU runner",
                        [&] { return graph ? m.graphs->run(batch) : m.forward(batch); });
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

void GpuRunner::attach_engine() {
  Impl& m = *impl_;
  LONGCTX_CHECK(!m.engine_attached, ErrorCode::kInvalidArgument,
                "GPU runner: already driven by an engine");
  m.engine_attached = true;
  m.sampler = std::make_unique<GpuSampler>(m.options.max_num_seqs, vocab_size(), m.model->device());
  if (decode_graphs(m.options, m.groups)) {
    DecodeGraphOptions g;
    g.max_num_seqs = decode_graph_max_seqs(m.options);
    if (m.pool != nullptr) {
      g.scratch_block = static_cast<int32_t>(m.pool->num_blocks() - 1);  // kept from the engine
      // The state pool's last slot, after the sequences' and the snapshots' (never handed out).
      if (m.states != nullptr)
        g.scratch_state_slot = static_cast<int32_t>(m.states->num_slots() - 1);
      g.max_blocks = m.max_blocks;
      m.graphs = std::make_unique<DecodeGraphs>(*m.model, *m.attention, *m.pool, g);
    } else {
      // Offloaded (a decode policy's steps, which skip the ring): the last host block, kept from
      // the engine, is the padding sequences'; the planner keeps it resident while used.
      g.scratch_block = static_cast<int32_t>(m.plan.num_host_blocks - 1);
      m.graphs = std::make_unique<DecodeGraphs>(
          *m.model, *m.attention, DecodeGraphKv{m.plan.block_size, m.plan.num_host_blocks}, g);
    }
    m.graphs->capture();
  }
}

void GpuRunner::profile_phases() {
  Impl& m = *impl_;
  LONGCTX_CHECK(m.graphs == nullptr, ErrorCode::kInvalidArgument,
                "GPU runner: the phase profile times eager steps (run with enforce_eager)");
  if (m.phases != nullptr) return;
  m.phases = std::make_shared<PhaseRecorder>(m.model->device());
  if (m.offload != nullptr)
    m.offload->set_phase_recorder(m.phases.get());
  else if (m.paged_phases)
    m.paged_phases(m.phases.get());
  // The offload backend (m.offload) and its window backend stay where they are, inside.
  m.attention = std::make_unique<PhaseProfilingBackend>(std::move(m.attention), m.phases);
}

std::string GpuRunner::phase_profile() {
  Impl& m = *impl_;
  if (m.phases == nullptr) return "";
  const PhaseTotals t = m.phases->totals();
  m.phases->reset();
  return t.table();
}

ExecutorCounters GpuRunner::state_counters() const { return impl_->snapshot_counters; }

int64_t GpuRunner::kv_block_bytes() const {
  const Impl& m = *impl_;
  if (!sparse::exports_kv_blocks(m.pool != nullptr || m.offload != nullptr, m.groups,
                                 m.options.sparse))
    return 0;
  return m.offload != nullptr
             ? m.offload->layer_block_bytes() * m.offload->planner().geometry().num_layers
             : m.pool->config().bytes_per_block();
}

std::string GpuRunner::kv_block_format() const {
  return fmt::format("gpu-{}", dtype_name(impl_->kv_dtype));
}

bool GpuRunner::kv_offloaded() const { return impl_->offload != nullptr; }

std::function<void()> GpuRunner::import_offloaded_kv_block(int32_t block,
                                                           std::span<const std::byte> in) {
  LONGCTX_CHECK(kv_block_bytes() > 0 && kv_offloaded(), ErrorCode::kInternal,
                "GPU runner: offloaded KV block import without an offloaded one-group cache");
  return impl_->offload->import_block(block, in);
}

std::function<void()> GpuRunner::export_offloaded_kv_block(int32_t block,
                                                           std::span<std::byte> out) {
  LONGCTX_CHECK(kv_block_bytes() > 0 && kv_offloaded(), ErrorCode::kInternal,
                "GPU runner: offloaded KV block export without an offloaded one-group cache");
  return impl_->offload->export_block(block, out);
}

void GpuRunner::read_kv_block(int32_t block, std::span<std::byte> out) const {
  LONGCTX_CHECK(kv_block_bytes() > 0, ErrorCode::kInternal,
                "GPU runner: KV block export without a one-group cache");
  if (impl_->offload != nullptr) {
    if (auto wait = impl_->offload->export_block(block, out)) wait();
    return;
  }
  impl_->pool->read_block(block, out);
}

void GpuRunner::write_kv_block(int32_t block, std::span<const std::byte> in) {
  LONGCTX_CHECK(kv_block_bytes() > 0, ErrorCode::kInternal,
                "GPU runner: KV block import without a one-group cache");
  if (impl_->offload != nullptr) {
    if (auto wait = impl_->offload->import_block(block, in)) wait();
    return;
  }
  impl_->pool->write_block(block, in);
}

void GpuRunner::read_kv_block_async(int32_t block, std::span<std::byte> out, void* stream) const {
  LONGCTX_CHECK(kv_block_bytes() > 0 && !kv_offloaded(), ErrorCode::kInternal,
                "GPU runner: KV block export without a resident one-group pool");
  impl_->pool->read_block_async(block, out, stream);
}

void GpuRunner::write_kv_block_async(int32_t block, std::span<const std::byte> in, void* stream) {
  LONGCTX_CHECK(kv_block_bytes() > 0 && !kv_offloaded(), ErrorCode::kInternal,
                "GPU runner: KV block import without a resident one-group pool");
  impl_->pool->write_block_async(block, in, stream);
}

Device GpuRunner::device() const { return impl_->model->device(); }

ExecutorSession make_gpu_session(std::shared_ptr<GpuRunner> runner) {
  LONGCTX_CHECK(runner != nullptr, ErrorCode::kInvalidArgument, "null GPU runner");
  ExecutorSessionOptions o;
  o.max_num_batched_tokens = runner->options().max_num_batched_tokens;
  o.max_num_seqs = runner->options().max_num_seqs;
  o.max_model_len = runner->memory_plan().max_model_len;
  return ExecutorSession(make_gpu_executor(std::move(runner)), o);
}

}  // namespace longctx
