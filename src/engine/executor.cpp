#include "longctx/engine/executor.h"

#include <cstring>
#include <numeric>
#include <unordered_map>

#include "attention/backends/cpu_backend.h"
#include "longctx/core/error.h"
#include "longctx/models/model.h"

namespace longctx {

namespace {

class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(std::shared_ptr<Model> model) : model_(std::move(model)) {}

  int64_t vocab_size() const override { return model_->config().vocab_size; }

  // Every input in one batched forward (each sequence over its own cache).
  Tensor execute(std::span<const StepInput> inputs) override {
    const int64_t vocab = vocab_size();
    ForwardBatch batch;
    std::vector<KVCache*> caches;
    for (const StepInput& in : inputs) {
      auto it = caches_.find(in.seq_id);
      if (it == caches_.end()) {
        LONGCTX_ASSERT(in.num_computed == 0, "sequence {} has no cache but {} computed tokens",
                       in.seq_id, in.num_computed);
        it = caches_.emplace(in.seq_id, model_->make_cache(in.max_tokens)).first;
      }
      KVCache& cache = *it->second;
      LONGCTX_ASSERT(cache.length() == in.num_computed, "cache holds {} tokens, expected {}",
                     cache.length(), in.num_computed);
      auto ids = in.all_tokens.subspan(in.num_computed);
      LONGCTX_ASSERT(!ids.empty(), "nothing to run for sequence {}", in.seq_id);
      batch.add_sequence(in.seq_id, ids.data(), static_cast<int64_t>(ids.size()),
                         in.num_computed, /*want_logits=*/true);
      caches.push_back(&cache);
    }
    CpuAttentionBackend attention(std::move(caches), model_->attention_scale());
    Tensor logits = model_->forward(batch, attention);
    attention.commit();
    LONGCTX_ASSERT(logits.numel() == vocab * static_cast<int64_t>(inputs.size()),
                   "model returned {} logits for {} rows of vocab {}", logits.shape_str(),
                   inputs.size(), vocab);
    return logits;
  }

  void release(uint64_t seq_id) override { caches_.erase(seq_id); }

 private:
  std::shared_ptr<Model> model_;
  std::unordered_map<uint64_t, std::unique_ptr<KVCache>> caches_;
};

class FunctionExecutor final : public Executor {
 public:
  FunctionExecutor(int64_t vocab, LogitsFn fn) : vocab_(vocab), fn_(std::move(fn)) {}
  int64_t vocab_size() const override { return vocab_; }
  Tensor execute(std::span<const StepInput> inputs) override {
    Tensor out = Tensor::empty({static_cast<int64_t>(inputs.size()), vocab_}, DType::kF32);
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<float> row = fn_(inputs[i]);
      LONGCTX_CHECK(static_cast<int64_t>(row.size()) == vocab_, ErrorCode::kInvalidArgument,
                    "logits function returned {} values, vocab is {}", row.size(), vocab_);
      std::memcpy(out.data<float>() + i * vocab_, row.data(), vocab_ * sizeof(float));
    }
    return out;
  }
  void release(uint64_t) override {}

 private:
  int64_t vocab_;
  LogitsFn fn_;
};

}  // namespace

std::unique_ptr<Executor> make_cpu_executor(std::shared_ptr<Model> model) {
  LONGCTX_CHECK(model != nullptr, ErrorCode::kInvalidArgument, "null model");
  return std::make_unique<CpuExecutor>(std::move(model));
}

std::unique_ptr<Executor> make_function_executor(int64_t vocab_size, LogitsFn fn) {
  LONGCTX_CHECK(vocab_size > 0, ErrorCode::kInvalidArgument, "vocab_size must be > 0");
  return std::make_unique<FunctionExecutor>(vocab_size, std::move(fn));
}

}  // namespace longctx
