#include "longctx/engine/gpu_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "attention/backends/paged_backend.h"
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
      "budget {}: weights {}, activations {}, workspaces {}, KV pool {} ({} blocks of {} "
      "tokens, {} per block, {} tokens = {} max_model_len sequences)",
      format_bytes(budget), format_bytes(weights), format_bytes(activations),
      format_bytes(workspaces), format_bytes(kv_bytes()), num_kv_blocks, block_size,
      format_bytes(kv_block_bytes), kv_tokens(),
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
  p.workspaces = kWorkspaceBytes + options.max_num_seqs * config.vocab_size * 4;
  PagedKVPoolConfig kv{config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                       p.block_size, 1, DType::kBF16, Device::cuda()};
  p.kv_block_bytes = kv.bytes_per_block();
  const int64_t left = budget - p.weights - p.activations - p.workspaces;
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
  struct Seq {
    std::vector<int32_t> blocks;
    int64_t num_tokens = 0;  // tokens whose K/V are in the pool
  };
  // A piece of one input's new tokens run in one forward.
  struct Piece {
    size_t input = 0;
    uint64_t seq_id = 0;
    std::span<const int32_t> tokens;  // the whole sequence so far
    int64_t begin = 0, n = 0;         // run tokens [begin, begin + n)
    bool want_logits = false;         // the input's last token is in this piece
  };

  std::shared_ptr<Model> model;
  GpuRunnerOptions options;
  GpuMemoryPlan plan;
  std::unique_ptr<PagedKVPool> pool;
  std::unique_ptr<AttentionBackend> attention;
  std::unordered_map<uint64_t, Seq> seqs;
  uint64_t next_scratch_id = ~uint64_t(0);

  void ensure_blocks(Seq& s, int64_t tokens) {
    const int64_t need = (tokens + pool->block_size() - 1) / pool->block_size();
    if (need <= static_cast<int64_t>(s.blocks.size())) return;
    std::vector<int32_t> more = pool->allocate(need - static_cast<int64_t>(s.blocks.size()));
    s.blocks.insert(s.blocks.end(), more.begin(), more.end());
  }

  // One forward over `pieces` (distinct sequences); returns device f32 logits of the rows asked
  // for (`all_rows`: every token of every piece, else the pieces with want_logits).
  Tensor run(const std::vector<Piece>& pieces, bool all_rows) {
    ForwardBatch batch;
    batch.block_table_indptr.push_back(0);
    const int64_t bs = pool->block_size();
    for (const Piece& p : pieces) {
      Seq& s = seqs[p.seq_id];
      LONGCTX_CHECK(s.num_tokens == p.begin, ErrorCode::kInternal,
                    "GPU runner: sequence {} holds {} tokens, the step starts at {}", p.seq_id,
                    s.num_tokens, p.begin);
      ensure_blocks(s, p.begin + p.n);
      const int64_t row0 = batch.num_tokens();
      batch.add_sequence(p.seq_id, p.tokens.data() + p.begin, p.n, p.begin,
                         p.want_logits && !all_rows);
      if (all_rows)
        for (int64_t i = 0; i < p.n; ++i) batch.logits_indices.push_back(int32_t(row0 + i));
      const int64_t blocks = (p.begin + p.n + bs - 1) / bs;
      batch.block_tables.insert(batch.block_tables.end(), s.blocks.begin(),
                                s.blocks.begin() + blocks);
      batch.block_table_indptr.push_back(static_cast<int32_t>(batch.block_tables.size()));
      for (int64_t j = p.begin; j < p.begin + p.n; ++j)
        batch.slot_mapping.push_back(int64_t(s.blocks[j / bs]) * bs + j % bs);
    }
    Tensor logits = model->forward(batch, *attention);
    for (const Piece& p : pieces) seqs[p.seq_id].num_tokens = p.begin + p.n;
    return logits;
  }

  // Cuts the inputs' new tokens into forwards of at most max_num_batched_tokens tokens and
  // max_num_seqs sequences; a piece cut short continues in the next forward.
  std::vector<std::vector<Piece>> schedule(std::span<const StepInput> inputs) const {
    std::vector<std::vector<Piece>> batches(1);
    int64_t room = options.max_num_batched_tokens;
    auto flush = [&] {
      if (!batches.back().empty()) batches.emplace_back();
      room = options.max_num_batched_tokens;
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      const StepInput& in = inputs[i];
      const int64_t end = static_cast<int64_t>(in.all_tokens.size());
      LONGCTX_CHECK(in.num_computed < end, ErrorCode::kInvalidArgument,
                    "GPU runner: nothing to run for sequence {}", in.seq_id);
      LONGCTX_CHECK(end <= plan.max_model_len, ErrorCode::kOutOfRange,
                    "GPU runner: sequence {} reaches {} tokens, past max_model_len {}",
                    in.seq_id, end, plan.max_model_len);
      for (int64_t begin = in.num_computed; begin < end;) {
        if (room == 0 || static_cast<int64_t>(batches.back().size()) == options.max_num_seqs)
          flush();
        const int64_t n = std::min(end - begin, room);
        batches.back().push_back({i, in.seq_id, in.all_tokens, begin, n, begin + n == end});
        begin += n;
        room -= n;
        if (begin < end) flush();
      }
    }
    if (batches.back().empty()) batches.pop_back();
    return batches;
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
                       m.plan.block_size, m.plan.num_kv_blocks, m.model->activation_dtype(),
                       m.model->device()};
  m.pool = std::make_unique<PagedKVPool>(kv);
  PagedBackendLimits limits;
  limits.max_tokens = options.max_num_batched_tokens;
  limits.max_seqs = options.max_num_seqs;
  limits.max_blocks = std::min<int64_t>(
      m.plan.num_kv_blocks,
      options.max_num_seqs * ((m.plan.max_model_len + m.plan.block_size - 1) / m.plan.block_size));
  m.attention = make_paged_attention_backend(*m.pool, c.num_attention_heads,
                                             m.model->attention_scale(), limits);
}

GpuRunner::~GpuRunner() = default;

const GpuMemoryPlan& GpuRunner::memory_plan() const { return impl_->plan; }

int64_t GpuRunner::vocab_size() const { return impl_->model->config().vocab_size; }

Tensor GpuRunner::execute(std::span<const StepInput> inputs) {
  Impl& m = *impl_;
  const int64_t vocab = vocab_size();
  Tensor out = Tensor::empty({static_cast<int64_t>(inputs.size()), vocab}, DType::kF32);
  for (const auto& pieces : m.schedule(inputs)) {
    Tensor logits = m.run(pieces, /*all_rows=*/false);
    Tensor host = logits.to(Device::cpu());
    int64_t row = 0;
    for (const Impl::Piece& p : pieces) {
      if (!p.want_logits) continue;
      std::memcpy(out.data<float>() + p.input * vocab, host.data<float>() + row * vocab,
                  vocab * sizeof(float));
      ++row;
    }
  }
  return out;
}

Tensor GpuRunner::prompt_logits(std::span<const int32_t> ids) {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = vocab_size();
  LONGCTX_CHECK(n > 0, ErrorCode::kInvalidArgument, "forward: no input tokens");
  const uint64_t id = m.next_scratch_id--;
  Tensor out = Tensor::empty({n, vocab}, DType::kF32);
  try {
    for (int64_t begin = 0; begin < n; begin += m.options.max_num_batched_tokens) {
      const int64_t len = std::min(n - begin, m.options.max_num_batched_tokens);
      Tensor logits = m.run({{0, id, ids, begin, len, true}}, /*all_rows=*/true);
      out.slice(0, begin, begin + len).copy_from(logits.to(Device::cpu()));
    }
  } catch (...) {
    release(id);
    throw;
  }
  release(id);
  return out;
}

void GpuRunner::release(uint64_t seq_id) {
  auto it = impl_->seqs.find(seq_id);
  if (it == impl_->seqs.end()) return;
  impl_->pool->free(it->second.blocks);
  impl_->seqs.erase(it);
}

namespace {

class GpuExecutor final : public Executor {
 public:
  explicit GpuExecutor(std::shared_ptr<GpuRunner> runner) : runner_(std::move(runner)) {}
  int64_t vocab_size() const override { return runner_->vocab_size(); }
  Tensor execute(std::span<const StepInput> inputs) override { return runner_->execute(inputs); }
  void release(uint64_t seq_id) override { runner_->release(seq_id); }

 private:
  std::shared_ptr<GpuRunner> runner_;
};

}  // namespace

std::unique_ptr<Executor> make_gpu_executor(std::shared_ptr<GpuRunner> runner) {
  LONGCTX_CHECK(runner != nullptr, ErrorCode::kInvalidArgument, "null GPU runner");
  return std::make_unique<GpuExecutor>(std::move(runner));
}

}  // namespace longctx
