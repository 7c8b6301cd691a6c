// The request loop: admits requests (validated up front), and each step() asks the Scheduler for
// the next batch (continuous batching: sequences join and leave between steps), runs it through
// the Executor, samples, detokenizes and applies the stop rules. KV blocks come from the
// BlockManager (prefix caching); the executor only reads the block tables it is given.
// Single-threaded: one thread owns a core (EngineLoop drives one from a thread of its own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculative.h"
#include "kv/block_manager.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/kv_events_config.h"
#include "structured/token_mask.h"

namespace longctx {

class KvEventPublisher;
class KvStore;
class KvStoreLoad;
class Tokenizer;

// The block manager of an executor's kv_layout() (its KV groups, window pool, state slots and
// snapshots): the one block allocator, of the engine and of ExecutorSession alike. Throws
// Error(kInvalidArgument) for a null executor or a layout without blocks.
BlockManager make_block_manager(const Executor* executor, bool prefix_caching);

struct EngineCoreOptions {
  int64_t max_model_len = 0;           // tokens per sequence (prompt + generated)
  std::vector<int64_t> eos_token_ids;  // the model's EOS tokens (generation_config.json)
  uint64_t seed = 0;                   // seeds requests that bring none
  SchedulerConfig scheduler;           // token and sequence budgets per step
  bool enable_prefix_caching = true;
  KvEventsConfig kv_events;  // the prefix cache's changes, published (kv_event_publisher.h)
  // The tier the executor's blocks (the block manager's ids) live in, the events' medium: kCpu
  // when the executor offloads its KV to a host pool (--kv-offload, or the CPU simulation).
  KvMedium kv_medium = KvMedium::kGpu;
  // A KV store shared by replicas (kv_store.h), redis://HOST:PORT; empty: none. Its keys start
  // with kv_store_namespace (the model's identity), then the executor's block format.
  std::string kv_store;
  std::string kv_store_namespace;
  // The store's hits read on the engine thread before the step, every running request waiting
  // (as before the asynchronous reads): for measurements against the asynchronous path only.
  bool kv_store_sync_reads = false;
  // Speculative decoding (speculative.h); method kNone: off.
  SpeculativeConfig speculative;
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
  int64_t num_running = 0;  // sequences holding KV blocks
  int64_t num_waiting = 0;  // queued (new or preempted)
  int64_t kv_blocks_total = 0;
  int64_t kv_block_size = 0;  // tokens per KV block
  int64_t kv_blocks_used = 0;
  std::vector<int64_t> kv_group_blocks_used;  // [KV groups] blocks (state slots) held per group
  int64_t prefix_cache_queries = 0;           // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;              // of those, tokens found cached
  // A state model's snapshots (BlockManager): slots, those tied to cached blocks, and the
  // prefix hits that started from one.
  int64_t state_snapshots_total = 0;
  int64_t state_snapshots_held = 0;
  int64_t state_snapshot_restores = 0;
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;      // prompt tokens computed (hits excluded)
  int64_t generation_tokens = 0;  // tokens sampled
  // The shared KV store (zeros without one): blocks read instead of computed, looked up and not
  // found, failed (down, timeout, malformed), bytes read and written, writes dropped (queue full).
  int64_t kv_store_hits = 0;
  int64_t kv_store_misses = 0;
  int64_t kv_store_errors = 0;
  int64_t kv_store_bytes_read = 0;
  int64_t kv_store_bytes_written = 0;
  int64_t kv_store_writes_dropped = 0;
  ExecutorCounters executor;    // KV offload bytes, sparse prefill density
  SpecDecodeStats spec_decode;  // zeros without speculative decoding
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
  // outside the vocabulary, invalid sampling parameters, a request whose KV (prompt + max_tokens,
  // capped by max_model_len) could never fit the executor's whole KV pool (kOutOfMemory).
  void check_request(std::span<const int32_t> prompt, const SamplingParams& params) const;
  // Queues a request (checked first); `index` is echoed in its output. Returns its id.
  uint64_t add_request(size_t index, std::vector<int32_t> prompt, const SamplingParams& params,
                       double arrival_time);

  // Requests queued or running, or a store load of an aborted one still to end (its blocks).
  bool has_unfinished() const { return !scheduler_.empty() || !loads_.empty(); }
  // `on_scheduled`, when given, runs once the step's batch is scheduled and before the model
  // runs it: a long prefill step's sequences already count as running in stats() there.
  std::vector<StepUpdate> step(StepStats* stats = nullptr,
                               const std::function<void()>& on_scheduled = {});
  // Outputs of the sequences finished so far (their Sequence objects are freed).
  std::vector<RequestOutput> take_finished();
  // Aborts request `id` at any point of its life: its blocks are freed at once and it finishes
  // with FinishReason::kAbort (its output, tokens so far, comes out of take_finished()).
  // Unknown or already finished ids are ignored. Returns whether it was live.
  bool abort(uint64_t id);
  // Drops every request (after an error), freeing what the executor holds for them.
  void abort_all();
  EngineStats stats() const;
  // For measurements: EngineCoreOptions::kv_store_sync_reads from now on.
  void set_kv_store_sync_reads(bool on) { options_.kv_store_sync_reads = on; }
  // Store loads in progress (their requests held out of the steps), aborted ones included.
  int64_t num_store_loads() const { return static_cast<int64_t>(loads_.size()); }
  // Waits until the blocks waiting for export to the KV store and its queued writes were sent
  // (or failed); nothing without a store.
  void flush_kv_store();

  const EngineCoreOptions& options() const { return options_; }
  int64_t vocab_size() const { return executor_->vocab_size(); }
  Executor& executor() { return *executor_; }
  // For tests: every block-manager invariant holds (throws Error(kInternal) otherwise).
  void check_consistency() const { blocks_.check_consistency(); }
  // For tests: the chain hashes of the blocks in the prefix cache (group 0), sorted.
  std::vector<uint64_t> cached_block_hashes() const { return blocks_.cached_hashes(); }

 private:
  int64_t max_total_tokens(int64_t prompt_len, const SamplingParams& params) const;
  // Appends a sampled token and applies stops and detokenization; a structured output's grammar
  // takes it (GrammarMatcher::take: its walk runs with the next step's mask fill).
  StepUpdate postprocess(Sequence& seq, const SampleResult& sample, double now);
  // A speculative sequence's verification over its 1 + k logits rows (host, [1 + k, vocab]):
  // appends the accepted draft tokens and the target's next token, one at a time through
  // postprocess (a stop drops what follows), then rolls its KV back to what was accepted.
  StepUpdate verify_draft(Sequence& seq, const float* rows, double now);
  // The grammar's mask for the next verified position; false when the grammar failed (the
  // request was aborted).
  bool fill_verify_mask(Sequence& seq, double now);
  // Ends a request whose grammar failed (its output so far kept).
  void abort_structured(Sequence& seq, double now);
  void finish(Sequence& seq, FinishReason reason, double now);
  // Moves a finished sequence out of the live set (its blocks already freed).
  void retire(uint64_t id);
  // Hands the block manager's events of this step to the publisher (none without one) and the
  // blocks computed in it to the KV store.
  void publish_kv_events();
  // Reads the missing full prompt blocks of sequences not yet scheduled from the KV store, on
  // this thread (kv_store_sync_reads).
  void import_from_store();
  // The asynchronous reads, between steps: starts the lookups of new waiting sequences (held
  // out of the steps while they load), imports the blocks that arrived into pinned blocks, and
  // ends the finished loads (their blocks cached, their sequences released). Never waits.
  void advance_store_loads();
  // Unpins the blocks of loads ended for sequences that were scheduled since (or are gone).
  void unpin_loaded_blocks();
  // Ends the loads of sequence `id` (aborted): stopped, their blocks freed once they end.
  void drop_store_loads(uint64_t id);
  // Starts the copies of the blocks waiting for export that find a staging buffer free.
  void start_kv_exports();
  // Before a step: drops the waiting exports of blocks the step writes (its new tokens' blocks
  // and its copies' destinations), which the executor would overwrite before their copy ran.
  void forget_overwritten_exports(std::span<const StepInput> inputs,
                                  std::span<const KVBlockCopy> copies);
  // The compiled grammar of a structured output, cached by schema text (compiling throws Error
  // naming an unsupported keyword); the vocabulary is built from the tokenizer on first use.
  std::shared_ptr<const structured::CompiledGrammar> grammar_for(
      const StructuredOutput& output) const;

  std::unique_ptr<Executor> executor_;
  const Tokenizer* tokenizer_;
  EngineCoreOptions options_;
  BlockManager blocks_;
  Scheduler scheduler_;
  std::unique_ptr<KvEventPublisher> kv_events_;
  std::unique_ptr<KvStore> kv_store_;
  // A request's asynchronous store load: the blocks it imported, pinned (in order, the load's
  // first blocks), until the load ends.
  struct StoreLoad {
    uint64_t seq_id = 0;
    Sequence* seq = nullptr;  // null once aborted
    std::shared_ptr<KvStoreLoad> load;
    std::vector<int32_t> blocks;
    // Sequences held until it ends, whose first missing block it reads (then looked up again).
    std::vector<uint64_t> followers;
  };
  std::vector<StoreLoad> loads_;  // started first first
  // The cached blocks of ended loads, pinned until their sequence is first scheduled (its prefix
  // hit then holds them), by sequence id.
  std::unordered_map<uint64_t, std::vector<int32_t>> loaded_;
  std::unique_ptr<SpeculativeDecoder> spec_;
  std::mt19937_64 seed_rng_;
  uint64_t next_id_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> live_;  // queued or running
  std::vector<std::unique_ptr<Sequence>> finished_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  mutable std::shared_ptr<const structured::TokenVocabulary> grammar_vocab_;
  mutable std::unordered_map<std::string, std::shared_ptr<const structured::CompiledGrammar>>
      grammars_;
};

double now_seconds();  // steady clock

}  // namespace longctx
