// Helpers shared by the engine suites: greedy sampling, core options, the tiny CPU model and the
// token-hash "model" of the token-KV executors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/engine_properties.h"
#include "common/test_data.h"
#include "engine/engine_core.h"
#include "longctx/engine/executor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::testing {

inline constexpr int64_t kTokenVocab = 61;

// The next token of a token-KV executor: a hash of everything its blocks read back.
inline int32_t next_token_of(std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % kTokenVocab);
}

inline SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

inline EngineCoreOptions core_options(int64_t batched_tokens, int64_t max_seqs,
                                      bool caching = true) {
  EngineCoreOptions o;
  o.max_model_len = 512;
  o.scheduler.max_num_batched_tokens = batched_tokens;
  o.scheduler.max_num_seqs = max_seqs;
  o.enable_prefix_caching = caching;
  return o;
}

// tests/data/fixtures/tiny-llama3 on the CPU (rope as the fixture's reference).
inline std::shared_ptr<Model> tiny_model() {
  static auto ck = std::make_shared<const Checkpoint>(
      load_checkpoint(test_data_dir() + "/fixtures/tiny-llama3"));
  ModelBuildOptions o;
  o.rope_inv_freq_dtype = DType::kBF16;
  return create_model(ck, o);
}

// The CPU executor of an engine property (common/engine_properties.h): the reference model over
// the CPU paged pool, offloaded through the simulated device when the spec says so.
inline CpuExecutorOptions cpu_executor_options(const EngineSpec& s) {
  CpuExecutorOptions x;
  x.block_size = s.block_size;
  x.num_blocks = s.num_blocks;
  x.max_state_seqs = s.max_num_seqs;
  x.offload_gpu_blocks = s.offload_gpu_blocks;
  x.offload_slots = s.offload_slots;
  x.offload_slot_blocks = s.offload_slot_blocks;
  x.offload_write_back_lag = s.offload_write_back_lag;
  x.offload_window_blocks = s.offload_window_blocks;
  x.sparse = s.sparse;
  return x;
}

inline std::unique_ptr<Executor> cpu_executor(const EngineSpec& s) {
  return make_cpu_executor(create_model(s.checkpoint, s.model_options), cpu_executor_options(s));
}

// Passes steps to another executor and keeps every logits row it returns: (sequence, position)
// -> the rows computed there, in step order (a position recomputed after a preemption adds one).
class RecordingExecutor final : public Executor {
 public:
  explicit RecordingExecutor(std::unique_ptr<Executor> inner) : inner_(std::move(inner)) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  KVBlockLayout kv_layout() const override { return inner_->kv_layout(); }
  ExecutorCounters counters() const override { return inner_->counters(); }
  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    Tensor logits = inner_->execute(inputs, copies);
    const int64_t vocab = vocab_size();
    int64_t r = 0;
    for (const StepInput& in : inputs) {
      if (!in.want_logits) continue;
      const float* row = logits.data<float>() + r++ * vocab;
      rows[{in.seq_id, in.num_computed + in.num_new - 1}].emplace_back(row, row + vocab);
    }
    return logits;
  }
  std::map<std::pair<uint64_t, int64_t>, std::vector<std::vector<float>>> rows;

 private:
  std::unique_ptr<Executor> inner_;
};

}  // namespace longctx::testing
