#include "engine/engine_loop.h"

#include <algorithm>
#include <exception>

#include "longctx/core/logging.h"

namespace longctx {

namespace {

// The final event of a request that never reached the core, or whose core state is gone.
RequestOutput aborted_output(size_t index, std::vector<int32_t> prompt, double arrival) {
  RequestOutput out;
  out.index = index;
  out.prompt_token_ids = std::move(prompt);
  out.finish_reason = FinishReason::kAbort;
  out.metrics.arrival = arrival;
  out.metrics.finished = now_seconds();
  out.metrics.num_prompt_tokens = static_cast<int64_t>(out.prompt_token_ids.size());
  return out;
}

}  // namespace

EngineLoop::EngineLoop(EngineCore& core, bool track_cached_blocks)
    : core_(core), track_cached_blocks_(track_cached_blocks) {
  // The KV pool's size is known now: stats read it before the first request.
  stats_.engine = core_.stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { shutdown(ShutdownMode::kAbort); }

std::optional<uint64_t> EngineLoop::submit(std::vector<int32_t> prompt,
                                           const SamplingParams& params, LoopCallback callback,
                                           double arrival_time) {
  LONGCTX_CHECK(callback != nullptr, ErrorCode::kInvalidArgument, "null callback");
  params.validate();
  std::lock_guard lk(mu_);
  if (!accepting_) return std::nullopt;
  const uint64_t id = next_id_++;
  pending_.push_back({id, std::move(prompt), params, std::move(callback), arrival_time});
  in_flight_.insert(id);
  stats_.num_pending = static_cast<int64_t>(pending_.size());
  stats_.num_in_flight = static_cast<int64_t>(in_flight_.size());
  cv_.notify_one();
  return id;
}

void EngineLoop::abort(uint64_t id) {
  std::lock_guard lk(mu_);
  if (!in_flight_.contains(id)) return;
  abort_requests_.push_back(id);
  cv_.notify_one();
}

LoopStats EngineLoop::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

std::vector<uint64_t> EngineLoop::cached_block_hashes() const {
  LONGCTX_CHECK(track_cached_blocks_, ErrorCode::kInvalidArgument,
                "the engine loop does not track the cached blocks (track_cached_blocks)");
  std::lock_guard lk(mu_);
  return cached_blocks_;
}

void EngineLoop::shutdown(ShutdownMode mode, double drain_timeout_s) {
  {
    std::lock_guard lk(mu_);
    if (!stop_) {
      accepting_ = false;
      stop_ = true;
      mode_ = mode;
      drain_deadline_ = mode == ShutdownMode::kDrain ? now_seconds() + drain_timeout_s : 0;
      stats_.accepting = false;
    } else if (mode == ShutdownMode::kAbort) {
      mode_ = mode;  // an abort overrides a drain still in progress (a second signal)
    }
    cv_.notify_one();
  }
  // A second caller (an abort during a drain) waits here for the same thread.
  std::lock_guard serial(shutdown_mu_);
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::emit(const LoopCallback& callback, const LoopEvent& event) {
  try {
    callback(event);
  } catch (const std::exception& e) {
    // A broken consumer must not stop the engine for every other request.
    LONGCTX_LOG_ERROR("engine loop: request {} callback threw: {}", event.id, e.what());
  }
}

void EngineLoop::forget(uint64_t loop_id) {
  std::lock_guard lk(mu_);
  in_flight_.erase(loop_id);
  stats_.num_in_flight = static_cast<int64_t>(in_flight_.size());
}

void EngineLoop::run() {
  while (true) {
    std::vector<Pending> batch;
    std::vector<uint64_t> aborts;
    bool stopping = false;
    bool abort_everything = false;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !pending_.empty() || !abort_requests_.empty() || core_.has_unfinished();
      });
      batch.swap(pending_);
      aborts.swap(abort_requests_);
      stopping = stop_;
      abort_everything =
          stop_ && (mode_ == ShutdownMode::kAbort || now_seconds() >= drain_deadline_);
      stats_.num_pending = 0;
    }
    // Aborts of requests still in `batch` finish them before they reach the core.
    for (uint64_t id : aborts) {
      auto it = std::find_if(batch.begin(), batch.end(), [&](auto& p) { return p.id == id; });
      if (it == batch.end()) continue;
      const RequestOutput out = aborted_output(id, std::move(it->prompt), it->arrival);
      LoopEvent ev;
      ev.id = id;
      ev.finished = true;
      ev.output = &out;
      forget(id);  // first, so a consumer woken by the final event sees it gone
      emit(it->callback, ev);
      batch.erase(it);
    }
    admit(batch);
    apply_aborts(aborts);
    if (abort_everything) {
      for (auto& [loop_id, core_id] : core_id_) core_.abort(core_id);
    }
    // New requests count as waiting, aborted ones are gone, before a step that may be long.
    refresh_stats();
    if (core_.has_unfinished()) step_once();
    deliver_finished();
    refresh_stats();
    if (stopping && !core_.has_unfinished()) {
      std::lock_guard lk(mu_);
      if (pending_.empty()) break;
    }
  }
}

void EngineLoop::admit(std::vector<Pending>& batch) {
  for (Pending& p : batch) {
    LoopEvent ev;
    ev.id = p.id;
    try {
      const uint64_t core_id = core_.add_request(p.id, std::move(p.prompt), p.params, p.arrival);
      core_id_[p.id] = core_id;
      live_[core_id] = {p.id, std::move(p.callback)};
      ev.kind = LoopEvent::Kind::kAccepted;
      emit(live_[core_id].callback, ev);
    } catch (const Error& e) {
      ev.kind = LoopEvent::Kind::kRejected;
      ev.error = e;
      forget(p.id);
      emit(p.callback, ev);
    }
  }
}

void EngineLoop::apply_aborts(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    auto it = core_id_.find(id);
    if (it != core_id_.end()) core_.abort(it->second);
  }
}

void EngineLoop::step_once() {
  std::vector<StepUpdate> updates;
  try {
    // Once scheduled, the step's sequences count as running for as long as the step runs.
    updates = core_.step(nullptr, [this] { refresh_stats(); });
  } catch (const Error& e) {
    fail_all(e);
    return;
  } catch (const std::exception& e) {
    fail_all(Error(ErrorCode::kInternal, e.what()));
    return;
  }
  {
    std::lock_guard lk(mu_);
    ++stats_.num_steps;
  }
  // Before the callbacks: a client that got its last bytes must not read older counters.
  refresh_stats();
  for (const StepUpdate& u : updates) {
    const RequestOutput& out = u.seq->output;
    auto it = core_id_.find(out.index);
    if (it == core_id_.end()) continue;
    auto live = live_.find(it->second);
    LoopEvent ev;
    ev.id = out.index;
    ev.text = u.text;
    const auto n = static_cast<size_t>(u.num_new_tokens);
    ev.new_token_ids =
        std::span<const int32_t>(out.token_ids).last(std::min(n, out.token_ids.size()));
    if (!out.logprobs.empty()) {
      ev.new_logprobs =
          std::span<const TokenLogprobs>(out.logprobs).last(std::min(n, out.logprobs.size()));
    }
    ev.finished = u.finished;
    ev.output = u.finished ? &out : nullptr;
    if (u.finished) forget(ev.id);  // before the final event, as everywhere
    emit(live->second.callback, ev);
    if (u.finished) {
      live_.erase(live);
      core_id_.erase(it);
    }
  }
}

void EngineLoop::deliver_finished() {
  // Sequences finished by abort() (their outputs come only from here); those finished by a
  // step were delivered from its updates and are no longer in core_id_.
  std::vector<RequestOutput> finished = core_.take_finished();
  if (!finished.empty()) refresh_stats();
  for (RequestOutput& out : finished) {
    auto it = core_id_.find(out.index);
    if (it == core_id_.end()) continue;
    auto live = live_.find(it->second);
    LoopEvent ev;
    ev.id = out.index;
    ev.finished = true;
    ev.output = &out;
    forget(ev.id);
    emit(live->second.callback, ev);
    live_.erase(live);
    core_id_.erase(it);
  }
}

void EngineLoop::fail_all(const Error& error) {
  LONGCTX_LOG_ERROR("engine loop: a step failed, failing {} requests: {}", live_.size(),
                    error.what());
  core_.abort_all();
  {
    std::lock_guard lk(mu_);
    ++stats_.num_engine_errors;  // before the callbacks, so their consumers see it counted
  }
  for (auto& [core_id, live] : live_) {
    const RequestOutput out = aborted_output(live.id, {}, 0);
    LoopEvent ev;
    ev.id = live.id;
    ev.finished = true;
    ev.output = &out;
    ev.error = error;
    forget(live.id);
    emit(live.callback, ev);
  }
  live_.clear();
  core_id_.clear();
}

void EngineLoop::refresh_stats() {
  const EngineStats engine = core_.stats();
  std::vector<uint64_t> cached;
  if (track_cached_blocks_) cached = core_.cached_block_hashes();
  std::lock_guard lk(mu_);
  stats_.engine = engine;
  if (track_cached_blocks_) cached_blocks_ = std::move(cached);
  stats_.num_pending = static_cast<int64_t>(pending_.size());
  stats_.num_in_flight = static_cast<int64_t>(in_flight_.size());
}

}  // namespace longctx
