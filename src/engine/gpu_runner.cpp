#include "longctx/engine/gpu_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "attention/backends/paged_backend.h"
#include "engine/cuda_graphs.h"
#include "engine/gpu_sampler.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "loader/weight_spec.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/models/model.h"

namespace longctx {

namespace {

constexpr int64_t kBf16 = 2;
// cuBLASLt workspace, attention plans and partials, logits rows: generous fixed headroom.
constexpr int64_t kWorkspaceBytes = 256ll << 20;

int64_t resolve_block_size(const GpuRunnerOptions& o) {
  return o.block_size > 0 ? o.block_size : kDefaultBlockSize;
}

int64_t resolve_max_model_len(const ModelConfig& c, const GpuRunnerOptions& o) {
  return o.max_model_len > 0 ? o.max_model_len : c.max_position_embeddings;
}

int64_t weight_bytes(const ModelConfig& config) {
  int64_t n = 0;
  for (const auto& [name, shape] : expected_weights(config)) n += shape_numel(shape);
  return n * kBf16;
}

}  // namespace

int64_t activation_bytes_per_token(const ModelConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads, inter = c.intermediate_size;
  // Live at the peak of a layer: the f32 residual, normed input, qkv, contiguous q, attention
  // output, o_proj output, gate_up, the SiLU product and down_proj output.
  const int64_t live = 4 * h + kBf16 * (3 * h + (hq + 2 * hkv) * d + 2 * hq * d + 3 * inter);
  return live * 3 / 2;  // the caching pool's size classes and freed-but-cached blocks
}

std::string GpuMemoryPlan::str() const {
  return fmt::format(
      "budget {}: weights {}, activations {}, workspaces {}, CUDA graphs {}, KV pool {} ({} "
      "blocks of {} tokens, {} per block, {} tokens = {} max_model_len sequences)",
      format_bytes(budget), format_bytes(weights), format_bytes(activations),
      format_bytes(workspaces), format_bytes(graphs), format_bytes(kv_bytes()), num_kv_blocks,
      block_size, format_bytes(kv_block_bytes), kv_tokens(),
      max_model_len > 0 ? kv_tokens() / max_model_len : 0);
}

GpuMemoryPlan plan_gpu_memory(const ModelConfig& config, const GpuRunnerOptions& options,
                              int64_t budget) {
  GpuMemoryPlan p;
  p.budget = budget;
  p.weights = weight_bytes(config);
  p.block_size = resolve_block_size(options);
  p.max_model_len = resolve_max_model_len(config, options);
  p.activations = options.max_num_batched_tokens * activation_bytes_per_token(config);
  // Logits rows, and the sampler's copies of penalized rows.
  p.workspaces = kWorkspaceBytes + 2 * options.max_num_seqs * config.vocab_size * 4;
  p.graphs = options.enforce_eager ? 0 : decode_graph_memory_bytes(config, options.max_num_seqs);
  PagedKVPoolConfig kv{config.num_hidden_layers,
                       config.num_key_value_heads,
                       config.head_dim,
                       p.block_size,
                       1,
                       DType::kBF16,
                       Device::cuda()};
  p.kv_block_bytes = kv.bytes_per_block();
  const int64_t left = budget - p.weights - p.activations - p.workspaces - p.graphs;
  const int64_t per_seq = (p.max_model_len + p.block_size - 1) / p.block_size;
  p.num_kv_blocks = options.num_gpu_blocks > 0 ? options.num_gpu_blocks
                                               : std::max<int64_t>(0, left / p.kv_block_bytes);
  // As vLLM: refuse a configuration that cannot hold even one sequence of max_model_len.
  LONGCTX_CHECK(p.num_kv_blocks >= per_seq, ErrorCode::kOutOfMemory,
                "GPU memory plan: the KV cache holds {} tokens, less than one sequence of "
                "max_model_len {} ({}); lower --max-model-len or --max-num-batched-tokens, or "
                "raise --gpu-memory-limit / --gpu-memory-utilization",
                p.kv_tokens(), p.max_model_len, p.str());
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
  GpuMemoryPlan plan;
  std::unique_ptr<PagedKVPool> pool;
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
  }

  void copy_blocks(std::span<const KVBlockCopy> copies) {
    for (const KVBlockCopy& c : copies) {
      LONGCTX_CHECK(
          c.src >= 0 && c.src < pool->num_blocks() && c.dst >= 0 && c.dst < pool->num_blocks(),
          ErrorCode::kInternal, "GPU runner: KV block copy {} -> {} outside {} blocks", c.src,
          c.dst, pool->num_blocks());
      for (int64_t l = 0; l < pool->config().num_layers; ++l) {
        pool->k(l).select(0, c.dst).copy_from(pool->k(l).select(0, c.src));
        pool->v(l).select(0, c.dst).copy_from(pool->v(l).select(0, c.src));
      }
    }
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
        batches.back().push_back({i, p});
        begin += n;
        room -= n;
        if (begin < end) flush();
      }
    }
    if (batches.back().empty()) batches.pop_back();
    std::vector<std::pair<std::vector<size_t>, Tensor>> results;
    const int64_t bs = pool->block_size();
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
          std::vector<int32_t> more = pool->allocate(need - static_cast<int64_t>(s.blocks.size()));
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
    pool->free(it->second.blocks);
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
  Impl& m = *impl_;
  m.model = std::move(model);
  m.options = options;
  const ModelConfig& c = m.model->config();
  const int device = m.model->device().index;
  const DeviceMemoryStats st = device_memory_stats(device);
  // The weights are already in the pool: plan the rest of the budget around what they took.
  m.plan = plan_gpu_memory(c, options, st.budget - st.in_use + weight_bytes(c));
  m.plan.weights = st.in_use;
  PagedKVPoolConfig kv{c.num_hidden_layers, c.num_key_value_heads, c.head_dim,
                       m.plan.block_size,   m.plan.num_kv_blocks,  m.model->activation_dtype(),
                       m.model->device()};
  m.pool = std::make_unique<PagedKVPool>(kv);
  PagedBackendLimits limits;
  limits.max_tokens = options.max_num_batched_tokens;
  limits.max_seqs = options.max_num_seqs;
  // Entries, not distinct blocks: shared prefix blocks and the graphs' padding block repeat.
  limits.max_blocks =
      options.max_num_seqs * ((m.plan.max_model_len + m.plan.block_size - 1) / m.plan.block_size);
  m.max_blocks = limits.max_blocks;
  m.attention = make_paged_attention_backend(*m.pool, c.num_attention_heads,
                                             m.model->attention_scale(), limits);
}

GpuRunner::~GpuRunner() = default;

const GpuMemoryPlan& GpuRunner::memory_plan() const { return impl_->plan; }

int64_t GpuRunner::vocab_size() const { return impl_->model->config().vocab_size; }

KVBlockLayout GpuRunner::kv_layout() const {
  // With graphs the last block is the padding sequences' scratch block, never handed out.
  const int64_t reserved = impl_->options.enforce_eager ? 0 : 1;
  return {impl_->pool->num_blocks() - reserved, impl_->pool->block_size()};
}

Tensor GpuRunner::execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) {
  Impl& m = *impl_;
  m.copy_blocks(copies);
  ForwardBatch batch = make_forward_batch(inputs, m.pool->block_size());
  if (m.graphs != nullptr && m.graphs->can_run(batch)) return m.graphs->run(batch);
  return m.forward(batch);
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
  if (!m.options.enforce_eager) {
    DecodeGraphOptions g;
    g.max_num_seqs = m.options.max_num_seqs;
    g.scratch_block = static_cast<int32_t>(m.pool->num_blocks() - 1);  // kept from the engine
    g.max_blocks = m.max_blocks;
    m.graphs = std::make_unique<DecodeGraphs>(*m.model, *m.attention, *m.pool, g);
    m.graphs->capture();
  }
}

namespace {

class GpuExecutor final : public Executor {
 public:
  explicit GpuExecutor(std::shared_ptr<GpuRunner> runner) : runner_(std::move(runner)) {
    runner_->attach_engine();
  }
  int64_t vocab_size() const override { return runner_->vocab_size(); }
  KVBlockLayout kv_layout() const override { return runner_->kv_layout(); }
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    return runner_->execute(inputs, copies);
  }
  std::vector<SampleResult> sample(const Tensor& logits,
                                   std::span<const SamplingParams* const> params,
                                   std::span<SamplerState* const> states) override {
    return runner_->sample(logits, params, states);
  }

 private:
  std::shared_ptr<GpuRunner> runner_;
};

}  // namespace

std::unique_ptr<Executor> make_gpu_executor(std::shared_ptr<GpuRunner> runner) {
  LONGCTX_CHECK(runner != nullptr, ErrorCode::kInvalidArgument, "null GPU runner");
  return std::make_unique<GpuExecutor>(std::move(runner));
}

}  // namespace longctx
