// A standalone driver of one Executor without the engine's scheduler (benchmarks, `longctx
// forward`, tests): it keeps each sequence's KV blocks in a BlockManager built from the
// executor's kv_layout() (every KV group, the window pool, the state slots), so the engine's
// block manager stays the only block allocator and multi-group models run standalone too. It
// cuts each call's tokens into steps of at most max_num_batched_tokens tokens and max_num_seqs
// sequences (the executor's limits) and hands back host f32 logits. No prefix caching, no
// preemption: a sequence holds its blocks (and, in a model with linear-attention layers, one of
// the executor's state slots: max_num_seqs on the GPU runner) until release().
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "longctx/core/tensor.h"
#include "longctx/engine/executor.h"

namespace longctx {

struct ExecutorSessionOptions {
  int64_t max_num_batched_tokens = 16384;  // tokens per execute() (the prefill chunk)
  int64_t max_num_seqs = 256;              // sequences per execute()
  int64_t max_model_len = 0;               // tokens per sequence; 0: only the blocks bound it
};

// One sequence's part of ExecutorSession::run: its tokens so far (those the session holds for
// seq_id first, then the new ones) and how many of the new ones to run (0: all of them).
struct SessionInput {
  uint64_t seq_id = 0;
  std::span<const int32_t> all_tokens;
  int64_t num_new = 0;
};

class ExecutorSession {
 public:
  // Throws Error(kInvalidArgument) for a null executor or non-positive limits.
  ExecutorSession(std::unique_ptr<Executor> executor, const ExecutorSessionOptions& options);
  ~ExecutorSession();
  ExecutorSession(ExecutorSession&&) noexcept;
  ExecutorSession& operator=(ExecutorSession&&) noexcept;

  Executor& executor();
  int64_t vocab_size() const;
  const ExecutorSessionOptions& options() const;

  // Runs each input's new tokens, a sequence it does not hold starting at token 0. Host f32
  // logits [inputs.size(), vocab] of each input's last token, in input order. Errors: a sequence
  // named twice, tokens past max_model_len (kOutOfRange), blocks or state slots exhausted
  // (kOutOfMemory: release sequences or give the executor more blocks). A step that throws drops
  // the sequences it ran (their K/V is partial).
  Tensor run(std::span<const SessionInput> inputs);
  // Logits of every position of `ids` as a fresh sequence (host f32 [n, vocab]), released
  // afterwards; each step asks the executor for all its rows (StepInput::num_logits).
  Tensor prompt_logits(std::span<const int32_t> ids);
  // Frees the sequence's blocks and state slot; unknown ids are ignored.
  void release(uint64_t seq_id);
  // Tokens whose K/V the session holds for `seq_id` (0 for an unknown one).
  int64_t num_tokens(uint64_t seq_id) const;
  int64_t num_free_blocks() const;  // blocks a new allocation can take (every pool)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx
