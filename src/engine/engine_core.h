// The request loop: admits requests (validated up front), runs them through an Executor, samples,
// detokenizes and applies the stop rules. Scheduling is first-come first-served, one sequence per
// step (the CPU model runs one sequence per forward); step() is the seam where a batching
// scheduler takes over.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "longctx/engine/executor.h"

namespace longctx {

class Tokenizer;

struct EngineCoreOptions {
  int64_t max_model_len = 0;           // tokens per sequence (prompt + generated)
  std::vector<int64_t> eos_token_ids;  // the model's EOS tokens (generation_config.json)
  uint64_t seed = 0;                   // seeds requests that bring none
};

struct StepUpdate {
  Sequence* seq = nullptr;  // valid until take_finished() hands a finished one out
  std::string text;         // new output text, safe to show (stop strings held back/cut)
  int64_t num_new_tokens = 0;
  bool finished = false;
};

// Counters for metrics (the server's /metrics, `longctx bench`). Token counts are totals since
// the core was made; the block counts are a snapshot.
struct EngineStats {
  int64_t num_running = 0;            // sequences holding KV blocks
  int64_t num_waiting = 0;            // queued (new or preempted)
  int64_t kv_blocks_total = 0;        // 0 for executors without a block pool
  int64_t kv_blocks_used = 0;
  int64_t prefix_cache_queries = 0;   // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;      // of those, tokens found cached
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;          // prompt tokens computed (hits excluded)
  int64_t generation_tokens = 0;      // tokens sampled
};

struct StepStats {
  int64_t prefill_tokens = 0;  // prompt tokens run this step
  int64_t decode_tokens = 0;   // single-token decode steps run
  double seconds = 0;
};

class EngineCore {
 public:
  // `tokenizer` may be null (token-id prompts only, no output text); it must outlive the core.
  EngineCore(std::unique_ptr<Executor> executor, const Tokenizer* tokenizer,
             EngineCoreOptions options);
  ~EngineCore();

  // Throws Error naming the problem: empty prompt, prompt longer than max_model_len, token ids
  // outside the vocabulary, invalid sampling parameters.
  void check_request(std::span<const int32_t> prompt, const SamplingParams& params) const;
  // Queues a request (checked first); `index` is echoed in its output. Returns its id.
  uint64_t add_request(size_t index, std::vector<int32_t> prompt, const SamplingParams& params,
                       double arrival_time);

  bool has_unfinished() const { return !waiting_.empty() || running_ != nullptr; }
  std::vector<StepUpdate> step(StepStats* stats = nullptr);
  // Outputs of the sequences finished so far (their Sequence objects are freed).
  std::vector<RequestOutput> take_finished();
  // Aborts request `id` at any point of its life: its blocks are freed at once and it finishes
  // with FinishReason::kAbort (its output, tokens so far, comes out of take_finished()).
  // Unknown or already finished ids are ignored. Returns whether it was live.
  bool abort(uint64_t id);
  // Drops every request (after an error), freeing what the executor holds for them.
  void abort_all();
  EngineStats stats() const;

  const EngineCoreOptions& options() const { return options_; }
  int64_t vocab_size() const { return executor_->vocab_size(); }

 private:
  // Appends a sampled token and applies stops and detokenization.
  StepUpdate postprocess(Sequence& seq, const SampleResult& sample, double now);
  void finish(Sequence& seq, FinishReason reason, double now);

  std::unique_ptr<Executor> executor_;
  const Tokenizer* tokenizer_;
  EngineCoreOptions options_;
  std::mt19937_64 seed_rng_;
  uint64_t next_id_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::unique_ptr<Sequence> running_;
  std::vector<std::unique_ptr<Sequence>> finished_;
};

double now_seconds();  // steady clock

}  // namespace longctx
