#include "engine/speculative.h"

#include <algorithm>

#include "engine/sampling_pack.h"
#include "kernels/cpu/speculative_cpu.h"
#include "longctx/core/error.h"

namespace longctx {

SpeculativeDecoder::SpeculativeDecoder(const SpeculativeConfig& config) : config_(config) {
  LONGCTX_CHECK(config.enabled() && config.num_speculative_tokens >= 1 &&
                    config.prompt_lookup_min >= 1 &&
                    config.prompt_lookup_min <= config.prompt_lookup_max,
                ErrorCode::kInternal, "speculative decoder: unresolved config");
  stats_.num_accepted_tokens_per_pos.assign(static_cast<size_t>(config.num_speculative_tokens), 0);
}

NgramDrafter SpeculativeDecoder::make_drafter() const {
  return NgramDrafter(config_.prompt_lookup_min, config_.prompt_lookup_max);
}

void SpeculativeDecoder::propose(Sequence& seq) {
  seq.draft.clear();
  const auto len = static_cast<int64_t>(seq.tokens.size());
  if (seq.status != SequenceStatus::kRunning || seq.num_computed != len - 1) return;
  // The step yields at most k + 1 tokens; the sequence may hold max_total_tokens.
  const int64_t k = std::min(config_.num_speculative_tokens, seq.max_total_tokens - len - 1);
  if (k <= 0) return;
  seq.draft = seq.drafter.propose(seq.tokens, k);
}

void SpeculativeDecoder::record(int64_t num_draft, int64_t num_accepted) {
  ++stats_.num_drafts;
  stats_.num_draft_tokens += num_draft;
  stats_.num_accepted_tokens += num_accepted;
  for (int64_t i = 0; i < num_accepted; ++i) ++stats_.num_accepted_tokens_per_pos[i];
}

SampleResult verify_position(std::span<const float> row, const SamplingParams& params,
                             SamplerState& state, int32_t draft, bool* accepted) {
  const auto vocab = static_cast<int64_t>(row.size());
  LONGCTX_CHECK(vocab > 0 && vocab <= kernels::kMaxSamplingVocab, ErrorCode::kInvalidArgument,
                "speculative verification: vocabulary of {} tokens, at most {}", vocab,
                kernels::kMaxSamplingVocab);
  kernels::SamplingRowParams p = sampling_row_params(params, state, vocab);
  std::vector<kernels::SamplingPenaltyEntry> entries;
  append_penalty_entries(params, state, vocab, entries);
  const uint32_t* mask = nullptr;
  if (!state.token_mask().empty()) {
    LONGCTX_CHECK(
        static_cast<int64_t>(state.token_mask().size()) == kernels::sampling_mask_words(vocab),
        ErrorCode::kInvalidArgument,
        "speculative verification: a token mask of {} words for {} "
        "logits",
        state.token_mask().size(), vocab);
    mask = state.token_mask().data();
  }
  const kernels::cpu::SpeculativeRowResult r =
      kernels::cpu::verify_draft_row(row, p, entries, mask, draft);
  check_sampling_result(r.sample, std::nullopt);
  state.advance();
  *accepted = r.accepted;
  return to_sample_result(r.sample, params);
}

}  // namespace longctx
