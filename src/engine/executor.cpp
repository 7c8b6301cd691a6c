#include "longctx/engine/executor.h"

#include <cstring>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "attention/sparse/kv_export.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "kv/state_pool.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/error.h"
#include "longctx/models/model.h"

namespace longctx {

void Executor::read_kv_block(int32_t, std::span<std::byte>) const {
  LONGCTX_THROW(ErrorCode::kUnsupported, "this executor does not export KV blocks");
}

void Executor::write_kv_block(int32_t, std::span<const std::byte>) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "this executor does not import KV blocks");
}

std::function<void()> Executor::read_kv_block_async(int32_t block, std::span<std::byte> out) {
  read_kv_block(block, out);
  return {};
}

std::function<void()> Executor::write_kv_block_async(int32_t block, std::span<const std::byte> in) {
  write_kv_block(block, in);
  return {};
}

std::vector<SampleResult> Executor::sample(const Tensor& logits,
                                           std::span<const SamplingParams* const> params,
                                           std::span<SamplerState* const> states) {
  LONGCTX_CHECK(params.size() == states.size(), ErrorCode::kInternal,
                "sample: {} parameter sets for {} states", params.size(), states.size());
  std::vector<SampleResult> out;
  if (params.empty()) return out;
  const Tensor host = logits.device().is_cpu() ? logits : logits.to(Device::cpu());
  const int64_t vocab = vocab_size();
  LONGCTX_CHECK(host.dtype() == DType::kF32 && host.numel() == vocab * int64_t(params.size()),
                ErrorCode::kInternal, "sample: logits {} for {} rows of vocab {}", host.str(),
                params.size(), vocab);
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    out.push_back(sample_token(std::span<const float>(host.data<float>() + i * vocab, vocab),
                               *params[i], *states[i]));
  }
  return out;
}

int64_t resolve_state_snapshots(bool prefix_caching, int64_t asked) {
  LONGCTX_CHECK(asked >= -1, ErrorCode::kInvalidArgument,
                "max_state_snapshots must be >= 0 (or -1: the default), got {}", asked);
  if (!prefix_caching) return 0;
  return asked < 0 ? kDefaultStateSnapshots : asked;
}

namespace {

constexpr int64_t kDefaultCpuKvBytes = 4ll << 30;

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(std::shared_ptr<Model> model, const CpuExecutorOptions& o)
      : model_(std::move(model)), groups_(KvGroups::from_config(model_->config(), o.kv_dtype)) {
    const ModelConfig& c = model_->config();
    LONGCTX_CHECK(o.kv_dtype == DType::kF32 || o.kv_dtype == DType::kFP8E4M3,
                  ErrorCode::kInvalidArgument,
                  "CPU executor: KV cache dtype {} (the CPU reference keeps f32 or FP8 E4M3)",
                  dtype_name(o.kv_dtype));
    // The pool holds the largest paged group's layers; a block serves one group at a time.
    PagedKVPoolConfig kv{
        groups_.pool_layers(), c.num_key_value_heads, c.head_dim, o.block_size, 1, o.kv_dtype,
        Device::cpu()};
    // KV offload offloads the full group and keeps sliding groups and linear-attention states
    // resident (offload_backend.h).
    LONGCTX_CHECK(o.offload_gpu_blocks == 0 || groups_.has_kind(KvGroupKind::kFull),
                  ErrorCode::kUnsupported,
                  "CPU executor: KV offload has nothing to offload: no layer has full attention "
                  "({}; a sliding window's KV and a linear-attention state stay resident); run "
                  "without offload",
                  groups_.summary());
    LONGCTX_CHECK(groups_.offloadable() || o.offload_gpu_blocks == 0, ErrorCode::kUnsupported,
                  "CPU executor: KV offload runs models of one full-attention KV group and either "
                  "sliding-window groups or linear-attention state groups; this one has {}",
                  groups_.summary());
    LONGCTX_CHECK(o.offload_window_blocks >= 0, ErrorCode::kInvalidArgument,
                  "CPU executor: offload_window_blocks must be >= 0, got {}",
                  o.offload_window_blocks);
    // With offload the host pool holds only the full group's layers.
    if (o.offload_gpu_blocks > 0) kv.num_layers = static_cast<int64_t>(groups_[0].layers.size());
    LONGCTX_CHECK(o.block_size > 0, ErrorCode::kInvalidArgument,
                  "CPU executor: block size must be positive, got {}", o.block_size);
    const int64_t bytes = o.kv_cache_bytes > 0 ? o.kv_cache_bytes : kDefaultCpuKvBytes;
    kv.num_blocks = o.num_blocks > 0 ? o.num_blocks : bytes / kv.bytes_per_block();
    LONGCTX_CHECK(kv.num_blocks > 0, ErrorCode::kOutOfMemory,
                  "CPU KV cache of {} bytes holds no block of {} tokens ({} bytes each)", bytes,
                  o.block_size, kv.bytes_per_block());
    if (o.offload_gpu_blocks > 0) {
      OffloadDeviceConfig d;
      d.geometry = {kv.num_layers,        o.block_size,    kv.num_blocks,
                    o.offload_gpu_blocks, o.offload_slots, o.offload_slot_blocks};
      d.num_qo_heads = c.num_attention_heads;
      d.num_kv_heads = c.num_key_value_heads;
      d.head_dim = c.head_dim;
      d.dtype = DType::kF32;
      if (kv.fp8()) d.kv_format = kernels::KvCacheFormat::kFp8E4M3;
      d.sm_scale = model_->attention_scale();
      d.cpu_write_back_lag = o.offload_write_back_lag;
      d.sparse = o.sparse;
      offload_ = std::make_unique<OffloadAttentionBackend>(d.geometry, make_cpu_offload_device(d));
      offload_->set_layer_block_bytes(d.layer_block_bytes());
      sparse_ = o.sparse;
      num_blocks_ = kv.num_blocks;
      if (groups_.has_kind(KvGroupKind::kSlidingWindow)) {
        // The sliding groups: resident, from the window pool (ids num_blocks_ + i).
        window_groups_ = std::make_unique<KvGroups>(groups_.without_first());
        PagedKVPoolConfig w = kv;
        w.num_layers = window_groups_->pool_layers();
        w.num_blocks = o.offload_window_blocks > 0 ? o.offload_window_blocks : kv.num_blocks;
        window_pool_ = std::make_unique<PagedKVPool>(w);
        window_attention_ = std::make_unique<CpuPagedBackend>(
            *window_pool_, model_->attention_scale(), nullptr, window_groups_.get());
        offload_->set_window_groups(groups_, *window_attention_, num_blocks_,
                                    [this](std::span<const KVBlockCopy> copies) {
                                      for (const KVBlockCopy& cp : copies)
                                        copy_kv_block_cpu(*window_pool_, cp.src, cp.dst);
                                    });
      }
    } else {
      pool_ = std::make_unique<PagedKVPool>(kv);
      num_blocks_ = pool_->num_blocks();
      sparse::KvShape shape{c.num_hidden_layers,      kv.num_blocks,         o.block_size,
                            c.num_attention_heads,    c.num_key_value_heads, c.head_dim,
                            model_->attention_scale()};
      policy_ = sparse::make_sparse_policy(o.sparse, shape);
      sparse_ = o.sparse;
      // A policy selects blocks of one table; sliding windows select by themselves (#44 decides
      // what a policy does on a window layer).
      LONGCTX_CHECK(groups_.single_full() || (!policy_->selects(sparse::Phase::kDecode) &&
                                              !policy_->selects(sparse::Phase::kPrefill)),
                    ErrorCode::kUnsupported,
                    "CPU executor: --sparse-policy {} over a resident KV cache runs models of "
                    "one full-attention KV group; this one has {} ({}); with KV offload the "
                    "policy selects over its full group",
                    sparse_policy_name(o.sparse.policy), groups_.size(), groups_.summary());
      if (!groups_.single_full()) policy_.reset();
      // Over FP8: dense, or a policy that reads it (quest); the others are refused by name.
      LONGCTX_CHECK(!kv.fp8() || policy_ == nullptr ||
                        sparse::policy_def(o.sparse.policy).reads_fp8 ||
                        (!policy_->selects(sparse::Phase::kDecode) &&
                         !policy_->selects(sparse::Phase::kPrefill)),
                    ErrorCode::kUnsupported,
                    "CPU executor: --sparse-policy {} over an FP8 KV cache is not run (FP8 runs "
                    "dense and with quest; use --kv-cache-dtype bf16 with it)",
                    sparse_policy_name(o.sparse.policy));
    }
    block_size_ = o.block_size;
    kv_fp8_ = kv.fp8();
    for (int64_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].kind != KvGroupKind::kState) continue;
      // Linear attention (Qwen3-Next): the Gated DeltaNet state and the conv's last inputs.
      const LinearAttentionConfig& l = c.linear;
      LONGCTX_CHECK(o.max_state_seqs > 0 && o.max_state_snapshots >= 0 && states_ == nullptr,
                    ErrorCode::kInvalidArgument,
                    "CPU executor: a state KV group needs max_state_seqs > 0 (got {}), "
                    "max_state_snapshots >= 0 (got {}), and one state group only",
                    o.max_state_seqs, o.max_state_snapshots);
      const int64_t conv_dim =
          2 * l.num_key_heads * l.key_head_dim + l.num_value_heads * l.value_head_dim;
      // Slots [0, max_state_seqs) are the sequences', the rest the prefix cache's snapshots.
      state_group_ = g;
      num_state_seqs_ = o.max_state_seqs;
      num_snapshots_ = o.max_state_snapshots;
      states_ = std::make_unique<StatePool>(
          o.max_state_seqs + o.max_state_snapshots, static_cast<int64_t>(groups_[g].layers.size()),
          Shape{l.num_value_heads, l.key_head_dim, l.value_head_dim},
          Shape{l.conv_kernel_dim - 1, conv_dim});
    }
    // Offloaded, the states stay resident beside the full group's host pool.
    if (offload_ != nullptr && states_ != nullptr) offload_->set_state_groups(groups_, *states_);
  }

  int64_t vocab_size() const override { return model_->config().vocab_size; }
  KVBlockLayout kv_layout() const override {
    KVBlockLayout l{num_blocks_, block_size_};
    if (!groups_.single_full()) l.groups = groups_.allocs();
    if (window_pool_ != nullptr) l.num_window_blocks = window_pool_->num_blocks();
    if (states_ != nullptr) {
      l.num_state_slots = num_state_seqs_;
      l.num_state_snapshots = num_snapshots_;
    }
    return l;
  }

  // Offloaded, a block's bytes are its host copy's (or the GPU cache's), in the resident pool's
  // order and format: replicas with and without offload share the store's blocks.
  int64_t kv_block_bytes() const override {
    if (!sparse::exports_kv_blocks(pool_ != nullptr || offload_ != nullptr, groups_, sparse_))
      return 0;
    return offload_ != nullptr
               ? offload_->layer_block_bytes() * offload_->planner().geometry().num_layers
               : pool_->config().bytes_per_block();
  }
  std::string kv_block_format() const override { return kv_fp8_ ? "cpu-fp8e4m3" : "cpu-f32"; }
  ExecutorCounters counters() const override {
    ExecutorCounters c = snapshot_counters_;
    if (offload_ != nullptr) {
      c.offload_host_bytes_loaded = offload_->stats().host_bytes_loaded;
      c.offload_host_bytes_written = offload_->stats().host_bytes_written;
    }
    return c;
  }
  void read_kv_block(int32_t block, std::span<std::byte> out) const override {
    check_block_io();
    if (offload_ != nullptr) {
      if (auto wait = offload_->export_block(block, out)) wait();
      return;
    }
    pool_->read_block(block, out);
  }
  void write_kv_block(int32_t block, std::span<const std::byte> in) override {
    check_block_io();
    if (offload_ != nullptr) {
      if (auto wait = offload_->import_block(block, in)) wait();
      return;
    }
    pool_->write_block(block, in);
  }
  // Offloaded: the import's copy into the host pool runs in the wait (the store's loader thread).
  std::function<void()> read_kv_block_async(int32_t block, std::span<std::byte> out) override {
    if (offload_ == nullptr) return Executor::read_kv_block_async(block, out);
    check_block_io();
    return offload_->export_block(block, out);
  }
  std::function<void()> write_kv_block_async(int32_t block,
                                             std::span<const std::byte> in) override {
    if (offload_ == nullptr) return Executor::write_kv_block_async(block, in);
    check_block_io();
    return offload_->import_block(block, in);
  }

  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    const std::vector<KvGroupAlloc> allocs = groups_.allocs();
    ForwardBatch batch = make_forward_batch(inputs, block_size_, allocs);
    const StateSlots slots{states_.get(), state_group_, num_state_seqs_, num_snapshots_};
    if (offload_ != nullptr) {
      offload_->set_copies(copies);
      return run_model_step(slots, inputs, snapshot_counters_, "CPU executor",
                            [&] { return model_->forward(batch, *offload_); });
    }
    for (const KVBlockCopy& c : copies) {
      copy_kv_block_cpu(*pool_, c.src, c.dst);
      if (policy_ != nullptr) policy_->on_block_copied(c.src, c.dst);
    }
    CpuPagedBackend attention(*pool_, model_->attention_scale(), policy_.get(), &groups_,
                              states_.get());
    return run_model_step(slots, inputs, snapshot_counters_, "CPU executor",
                          [&] { return model_->forward(batch, attention); });
  }

 private:
  std::shared_ptr<Model> model_;
  KvGroups groups_;  // the model's KV groups
  // KV offload of a model with sliding groups: their groups, resident pool and backend.
  std::unique_ptr<KvGroups> window_groups_;
  std::unique_ptr<PagedKVPool> window_pool_;
  std::unique_ptr<CpuPagedBackend> window_attention_;
  void check_block_io() const {
    LONGCTX_CHECK(kv_block_bytes() > 0, ErrorCode::kInternal,
                  "CPU executor: KV block I/O without an exportable cache (KV groups or a "
                  "sparse policy)");
  }

  std::unique_ptr<PagedKVPool> pool_;                 // resident
  std::unique_ptr<OffloadAttentionBackend> offload_;  // or offloaded (simulated)
  std::unique_ptr<sparse::SparsePolicy> policy_;      // with the resident pool (Full: dense)
  SparseOptions sparse_;                              // the policy's options
  bool kv_fp8_ = false;                               // FP8 E4M3 codes and scales, else f32
  std::unique_ptr<StatePool> states_;                 // a state group's slots (linear attention)
  ExecutorCounters snapshot_counters_;                // its snapshots' copies (the state_* fields)
  int64_t state_group_ = 0;  // its group (> 0: group 0 is paged whenever a model has attention)
  int64_t num_state_seqs_ = 0, num_snapshots_ = 0;
  int64_t num_blocks_ = 0, block_size_ = 0;
};

class FunctionExecutor final : public Executor {
 public:
  FunctionExecutor(int64_t vocab, LogitsFn fn, KVBlockLayout layout)
      : vocab_(vocab), fn_(std::move(fn)), layout_(layout) {}
  int64_t vocab_size() const override { return vocab_; }
  KVBlockLayout kv_layout() const override { return layout_; }
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy>) override {
    int64_t rows = 0;
    for (const StepInput& in : inputs) rows += in.want_logits ? in.num_logits : 0;
    Tensor out = Tensor::empty({rows, vocab_}, DType::kF32);
    int64_t r = 0;
    for (const StepInput& in : inputs) {
      if (!in.want_logits) continue;
      for (int64_t j = in.num_logits - 1; j >= 0; --j) {
        // The row of the token j before the last: the input as if it ended there.
        StepInput cut = in;
        cut.num_new = in.num_new - j;
        cut.all_tokens = in.all_tokens.first(static_cast<size_t>(in.num_computed + cut.num_new));
        cut.num_logits = 1;
        std::vector<float> row = fn_(cut);
        LONGCTX_CHECK(static_cast<int64_t>(row.size()) == vocab_, ErrorCode::kInvalidArgument,
                      "logits function returned {} values, vocab is {}", row.size(), vocab_);
        std::memcpy(out.data<float>() + r++ * vocab_, row.data(), vocab_ * sizeof(float));
      }
    }
    return out;
  }

 private:
  int64_t vocab_;
  LogitsFn fn_;
  KVBlockLayout layout_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(std::shared_ptr<Model> model,
                                            const CpuExecutorOptions& options) {
  LONGCTX_CHECK(model != nullptr, ErrorCode::kInvalidArgument, "null model");
  return std::make_unique<CpuExecutor>(std::move(model), options);
}

std::unique_ptr<Executor> make_function_executor(int64_t vocab_size, LogitsFn fn,
                                                 KVBlockLayout layout) {
  LONGCTX_CHECK(vocab_size > 0, ErrorCode::kInvalidArgument, "vocab_size must be > 0");
  LONGCTX_CHECK(layout.num_blocks > 0 && layout.block_size > 0, ErrorCode::kInvalidArgument,
                "function executor: {} blocks of {} tokens", layout.num_blocks, layout.block_size);
  return std::make_unique<FunctionExecutor>(vocab_size, std::move(fn), layout);
}

}  // namespace longctx
