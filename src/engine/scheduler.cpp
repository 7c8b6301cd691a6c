#include "engine/scheduler.h"

#include <algorithm>

#include "longctx/core/error.h"

namespace longctx {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks)
    : config_(config), blocks_(blocks) {
  LONGCTX_CHECK(config.max_num_batched_tokens > 0 && config.max_num_seqs > 0,
                ErrorCode::kInvalidArgument,
                "scheduler: max_num_batched_tokens ({}) and max_num_seqs ({}) must be positive",
                config.max_num_batched_tokens, config.max_num_seqs);
}

void Scheduler::add(Sequence* seq) {
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::preempt(Sequence* seq) {
  blocks_.free(seq->id);
  seq->draft.clear();
  seq->num_computed = 0;
  seq->status = SequenceStatus::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  ++num_preemptions_;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  auto add_to_step = [&](Sequence* seq, int64_t n, int32_t restore, int64_t num_draft) {
    const int64_t end = seq->num_computed + n - num_draft;
    const bool last = end == static_cast<int64_t>(seq->tokens.size());
    // A step that ends on a block boundary saves the state there; a decode step's snapshot is a
    // rolling one (block_manager.h). A speculative step's end is known only after verification.
    const bool prefill = n - num_draft > 1 || end <= seq->num_prompt_tokens;
    const int32_t save = num_draft > 0 ? -1 : blocks_.reserve_snapshot(seq->id, end, !prefill);
    out.seqs.push_back({seq, n, last, restore, save, num_draft});
    out.num_tokens += n;
    budget -= n;
  };
  // Running sequences: decodes (one token left) in the first pass, prefill chunks in the second.
  for (const bool decodes : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i];
      const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->num_computed;
      if ((remaining == 1) != decodes) continue;
      // A decode's draft rides along as far as the budget goes.
      const int64_t draft = decodes ? static_cast<int64_t>(seq->draft.size()) : 0;
      const int64_t n = decodes
                            ? std::min(remaining + draft, budget)
                            : blocks_.snapshot_chunk(seq->num_computed, std::min(remaining, budget),
                                                     static_cast<int64_t>(seq->tokens.size()));
      if (decodes) seq->draft.resize(static_cast<size_t>(n - remaining));
      bool preempted_self = false;
      while (!blocks_.append(seq->id, seq->num_computed, n, &out.copies)) {
        Sequence* victim = running_.back();
        auto it = std::find_if(out.seqs.begin(), out.seqs.end(),
                               [&](const ScheduledSeq& s) { return s.seq == victim; });
        if (it != out.seqs.end()) {  // scheduled earlier in this step: take it back out
          budget += it->num_new;
          out.num_tokens -= it->num_new;
          out.seqs.erase(it);
        }
        preempt(victim);
        ++out.num_preempted;
        if (victim == seq) {
          preempted_self = true;
          break;
        }
      }
      if (preempted_self) break;  // it was the newest: nothing runs after it
      add_to_step(seq, n, -1, decodes ? n - remaining : 0);
    }
  }
  // Waiting sequences, first come first served (held ones skipped), while blocks, tokens and
  // sequence slots last.
  for (size_t i = 0; out.num_preempted == 0 && i < waiting_.size() && budget > 0 &&
                     static_cast<int64_t>(running_.size()) < config_.max_num_seqs;) {
    Sequence* seq = waiting_[i];
    if (held(seq)) {
      ++i;
      continue;
    }
    const BlockManager::Start r = blocks_.start(seq->id, seq->tokens, budget, &out.copies);
    if (r.num_cached < 0) break;
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    seq->num_computed = r.num_cached;
    if (seq->output.metrics.scheduled == 0) seq->output.metrics.num_cached_tokens = r.num_cached;
    seq->status = SequenceStatus::kRunning;
    running_.push_back(seq);
    add_to_step(seq, r.num_new, r.restore_snapshot, 0);
  }
  return out;
}

void Scheduler::complete(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.seqs) {
    if (s.num_draft > 0) continue;  // finish_speculative() once its draft is verified
    s.seq->num_computed += s.num_new;
    blocks_.commit(s.seq->id, s.seq->tokens, s.seq->num_computed);
  }
  blocks_.end_step();
}

void Scheduler::fail(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.seqs) s.seq->draft.clear();
  blocks_.end_step();
}

void Scheduler::finish_speculative(Sequence* seq, int64_t num_computed) {
  seq->draft.clear();
  seq->num_computed = num_computed;
  blocks_.truncate(seq->id, num_computed);
  blocks_.commit(seq->id, seq->tokens, num_computed);
}

void Scheduler::hold(Sequence* seq) {
  LONGCTX_CHECK(std::find(waiting_.begin(), waiting_.end(), seq) != waiting_.end(),
                ErrorCode::kInternal, "scheduler: holding sequence {}, which is not waiting",
                seq->id);
  held_.insert(seq);
}

void Scheduler::release(Sequence* seq) { held_.erase(seq); }

void Scheduler::remove(Sequence* seq) {
  held_.erase(seq);
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) {
    running_.erase(r);
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), seq);
    if (w != waiting_.end()) waiting_.erase(w);
  }
  blocks_.free(seq->id);
}

std::vector<Sequence*> Scheduler::all() const {
  std::vector<Sequence*> v(running_.begin(), running_.end());
  v.insert(v.end(), waiting_.begin(), waiting_.end());
  return v;
}

}  // namespace longctx
