// The engine thread: one thread owns an EngineCore and drives it; any thread submits requests,
// aborts them and reads counters. Outputs stream back through per-request callbacks, called on
// the engine thread. The thread sleeps on a condition variable while nothing is queued or
// running, so an idle server burns no CPU.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine_core.h"
#include "longctx/core/error.h"

namespace longctx {

// One event of a request's life, in this order: kAccepted (the core queued it) or kRejected
// (check_request refused it: `error` says why; nothing follows), then kOutput updates, the last
// with finished set and `output` the complete result (finish_reason kAbort when aborted).
// Views point into engine state and are valid only during the callback.
struct LoopEvent {
  enum class Kind { kAccepted, kRejected, kOutput };
  Kind kind = Kind::kOutput;
  uint64_t id = 0;                              // EngineLoop's id of the request
  std::string_view text;                        // new output text (may be empty)
  std::span<const int32_t> new_token_ids;       // tokens generated since the last event
  std::span<const TokenLogprobs> new_logprobs;  // theirs, when the request asked for logprobs
  bool finished = false;
  const RequestOutput* output = nullptr;  // set when finished
  // kRejected, or kOutput finished by an engine failure (then output->finish_reason is kAbort).
  std::optional<Error> error;
};
// Called on the engine thread; keep it short (hand the data to another thread). It may call
// EngineLoop::abort and stats, not shutdown.
using LoopCallback = std::function<void(const LoopEvent&)>;

// A consistent snapshot, refreshed when requests were admitted or aborted, when a step's batch
// is scheduled (before the model runs it) and after every step (before its outputs reach the
// callbacks).
struct LoopStats {
  EngineStats engine;
  int64_t num_pending = 0;    // submitted, not yet handed to the core
  int64_t num_in_flight = 0;  // submitted and not yet finished (pending included)
  int64_t num_steps = 0;
  int64_t num_engine_errors = 0;  // steps that threw (their requests were failed)
  bool accepting = true;          // false once shutdown began
};

class EngineLoop {
 public:
  enum class ShutdownMode {
    kDrain,  // refuse new requests, finish the ones in flight, then stop
    kAbort,  // refuse new requests, abort the ones in flight (finish_reason abort), then stop
  };

  // Starts the engine thread, which owns `core` from now until shutdown() returns; `core` must
  // outlive the loop and nobody else may call into it meanwhile. With track_cached_blocks the
  // loop keeps a copy of the prefix cache's block hashes (cached_block_hashes()), refreshed with
  // the stats: O(cached blocks) a step, for debugging and tests of KV-event consumers.
  explicit EngineLoop(EngineCore& core, bool track_cached_blocks = false);
  // shutdown(kAbort) if it was not called.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request; its events go to `callback` (never called from inside submit). Invalid
  // sampling parameters throw Error here, on the caller's thread; the rest of the checks
  // (prompt length, vocabulary) run on the engine thread and come back as kRejected. Returns
  // nullopt, queuing nothing, once shutdown began.
  std::optional<uint64_t> submit(std::vector<int32_t> prompt, const SamplingParams& params,
                                 LoopCallback callback, double arrival_time = now_seconds());
  // Aborts a request at any point of its life (its final event has finish_reason abort).
  // Unknown or finished ids are ignored.
  void abort(uint64_t id);
  LoopStats stats() const;
  // The prefix cache's block hashes (EngineCore::cached_block_hashes) as of the last stats
  // refresh; throws Error(kInvalidArgument) unless the loop tracks them.
  std::vector<uint64_t> cached_block_hashes() const;

  // Stops the loop; with kDrain, requests still running after `drain_timeout_s` are aborted.
  // Blocks until the engine thread exited (every request got its final event). Idempotent.
  void shutdown(ShutdownMode mode, double drain_timeout_s = 1e300);

 private:
  struct Pending {
    uint64_t id;
    std::vector<int32_t> prompt;
    SamplingParams params;
    LoopCallback callback;
    double arrival;
  };
  struct Live {
    uint64_t id;  // the loop's id
    LoopCallback callback;
  };

  void run();
  // On the engine thread, without the lock held.
  void admit(std::vector<Pending>& batch);
  void apply_aborts(const std::vector<uint64_t>& ids);
  void step_once();
  void fail_all(const Error& error);
  void deliver_finished();
  // Hands `event` to `callback`; the request is done with when event.finished or kRejected.
  void emit(const LoopCallback& callback, const LoopEvent& event);
  void forget(uint64_t loop_id);
  void refresh_stats();

  EngineCore& core_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  std::vector<Pending> pending_;
  std::vector<uint64_t> abort_requests_;
  std::unordered_set<uint64_t> in_flight_;  // loop ids submitted and not yet finished
  bool accepting_ = true;
  bool stop_ = false;
  ShutdownMode mode_ = ShutdownMode::kDrain;
  double drain_deadline_ = 0;
  uint64_t next_id_ = 1;
  LoopStats stats_;
  const bool track_cached_blocks_;
  std::vector<uint64_t> cached_blocks_;  // with track_cached_blocks_
  // Engine thread only.
  std::unordered_map<uint64_t, Live> live_;         // core id -> request
  std::unordered_map<uint64_t, uint64_t> core_id_;  // loop id -> core id
  std::mutex shutdown_mu_;                          // serializes shutdown() callers
  std::thread thread_;
};

}  // namespace longctx
