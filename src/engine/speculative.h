// Speculative decoding in the engine (docs/engine.md, "Speculative decoding"): drafts for the
// running sequences before a step is scheduled (prompt lookup, engine/ngram_drafter.h), the
// verification of a sequence's 1 + k logits rows after it ran (kernels/cpu/speculative_cpu.h,
// on the host for every device), and vLLM's acceptance counters.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sequence.h"
#include "longctx/engine/speculative_config.h"

namespace longctx {

// vLLM's spec-decode counters (totals since the engine started).
struct SpecDecodeStats {
  int64_t num_drafts = 0;                            // sequence-steps that verified a draft
  int64_t num_draft_tokens = 0;                      // draft tokens verified
  int64_t num_accepted_tokens = 0;                   // of those, accepted
  std::vector<int64_t> num_accepted_tokens_per_pos;  // [num_speculative_tokens]
  // Tokens a verifying step yields on average: 1 + accepted / drafts (0 without drafts).
  double mean_acceptance_length() const {
    return num_drafts > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / num_drafts : 0.0;
  }
};

class SpeculativeDecoder {
 public:
  // `config` resolved (SpeculativeConfig::resolved) and enabled.
  explicit SpeculativeDecoder(const SpeculativeConfig& config);

  // A new sequence's drafter.
  NgramDrafter make_drafter() const;
  // Sets seq.draft for its next step: a running sequence with only its last token left to
  // compute gets up to num_speculative_tokens draft tokens, no more than it may still generate
  // after the step's own token. Structured outputs get none (the grammar advances token by token).
  void propose(Sequence& seq);
  // Counts one verified draft of `num_draft` tokens of which the first `num_accepted` stood.
  void record(int64_t num_draft, int64_t num_accepted);
  const SpecDecodeStats& stats() const { return stats_; }

 private:
  SpeculativeConfig config_;
  SpecDecodeStats stats_;
};

// One position of a verification: the token at `row` (the target's logits, [vocab] f32 on the
// host) for a request with `params` and sampler `state`, given the draft token there (-1: none,
// the bonus position). Sets *accepted; the state advances by one draw. Throws Error as
// sample_token does for rows that cannot be sampled.
SampleResult verify_position(std::span<const float> row, const SamplingParams& params,
                             SamplerState& state, int32_t draft, bool* accepted);

}  // namespace longctx
