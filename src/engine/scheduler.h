// The scheduler (as nano-vllm's and vLLM's): which sequences run in the next step and how many
// of their tokens, under a token budget (max_num_batched_tokens) and a sequence budget
// (max_num_seqs), with KV blocks from the BlockManager.
//
// Order within a step: running sequences that decode (one token) first, then running sequences
// in the middle of a prefill (the next chunk), then waiting sequences, oldest first (a prompt
// longer than the budget left is cut into chunks: chunked prefill). When a running sequence
// needs a block and none is free, the newest running sequence is preempted: its blocks are
// freed and it goes back to the front of the queue with its tokens (prompt + generated so
// far), to be recomputed later (its prefix may still hit the cache). No waiting sequence is
// admitted in a step that preempted. The oldest running sequence always progresses, and every
// sequence fits the pool alone (checked when it is added), so everything finishes.
//
// A state model with prefix caching (BlockManager::snapshots_enabled()) has its prefill chunks
// end on block boundaries where it can (BlockManager::snapshot_chunk) and a snapshot of its
// state saved at each such end; a prefix hit's sequence starts from the hit's snapshot.
//
// Speculative decoding: a decoding sequence with a draft (Sequence::draft) runs its last token
// and the draft in one step (1 + k tokens of the budget and of its blocks; the draft is trimmed
// to the budget left). complete() leaves such a sequence to finish_speculative(), which the
// engine calls once it knows how many draft tokens were accepted.
//
// Held sequences (hold()): a waiting sequence whose prompt's KV blocks are being read from the
// KV store (as vLLM's WAITING_FOR_REMOTE_KVS) stays in the queue but is skipped: the sequences
// behind it are scheduled meanwhile. Once released it is scheduled in its place in the queue.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_set>
#include <vector>

#include "engine/sequence.h"
#include "kv/block_manager.h"

namespace longctx {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 8192;  // tokens per step
  int64_t max_num_seqs = 256;             // sequences per step
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t num_new = 0;  // tokens seq->tokens[num_computed, num_computed + num_new) run now
  bool sample = false;  // the last of its tokens runs now: sample its next token
  // State snapshots (the block manager's slots): copied into the sequence's state slot before
  // the step (a prefix hit), and from it after the step (its chunk ends on a block boundary).
  int32_t state_restore = -1;
  int32_t state_save = -1;
  int64_t num_draft = 0;  // of the num_new tokens, the last num_draft are seq->draft
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  std::vector<KVBlockCopy> copies;  // run before the step writes anything
  int64_t num_tokens = 0;
  int64_t num_preempted = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // `blocks` must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  const SchedulerConfig& config() const { return config_; }
  // Queues a new sequence (its blocks are taken when it is first scheduled).
  void add(Sequence* seq);
  SchedulerOutput schedule();
  // The step ran: advances each scheduled sequence's num_computed and caches its full blocks.
  // (Sampling and stops come after, in the engine.)
  void complete(const SchedulerOutput& out);
  // The step failed: releases what schedule() set aside for it (num_computed is unchanged).
  void fail(const SchedulerOutput& out);
  // After a speculative step: the sequence's K/V holds its first `num_computed` tokens (the last
  // sampled token and the accepted draft tokens); the blocks taken for rejected draft tokens are
  // released and the blocks full of accepted tokens cached.
  void finish_speculative(Sequence* seq, int64_t num_computed);
  // Removes a sequence (finished or aborted) from the queues and frees its blocks.
  void remove(Sequence* seq);
  // Keeps a waiting sequence out of the steps until release(); Error(kInternal) for one that is
  // not waiting. Releasing one not held does nothing.
  void hold(Sequence* seq);
  void release(Sequence* seq);
  bool held(const Sequence* seq) const { return held_.count(seq) != 0; }
  int64_t num_held() const { return static_cast<int64_t>(held_.size()); }

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  bool empty() const { return running_.empty() && waiting_.empty(); }
  // Sequences in queue order (running oldest first, then waiting).
  std::vector<Sequence*> all() const;

 private:
  void preempt(Sequence* seq);

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;
  std::unordered_set<const Sequence*> held_;  // of waiting_, skipped by schedule()
  int64_t num_preemptions_ = 0;
};

}  // namespace longctx
