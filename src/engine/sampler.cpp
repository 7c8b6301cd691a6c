// The CPU path of sampling: one row through the sampling op's CPU twin (ops/sampling.h, whose
// reference is kernels/cpu/sampling_cpu.cpp), packed exactly as the GPU sampler packs its rows.
#include "longctx/engine/sampler.h"

#include <vector>

#include "engine/sampling_pack.h"
#include "longctx/core/error.h"
#include "ops/sampling.h"

namespace longctx {

SamplerState::SamplerState(const SamplingParams& params, uint64_t seed,
                           std::span<const int32_t> prompt)
    : seed_(seed), track_seen_(params.repetition_penalty != 1.0) {
  if (track_seen_) seen_.insert(prompt.begin(), prompt.end());
}

void SamplerState::append_output(int32_t token) {
  ++output_counts_[token];
  if (track_seen_) seen_.insert(token);
}

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          SamplerState& state) {
  LONGCTX_CHECK(!logits.empty(), ErrorCode::kInvalidArgument, "sampling from empty logits");
  const auto vocab = static_cast<int64_t>(logits.size());
  LONGCTX_CHECK(vocab <= kernels::kMaxSamplingVocab, ErrorCode::kInvalidArgument,
                "sampling: vocabulary of {} tokens, at most {}", vocab, kernels::kMaxSamplingVocab);
  kernels::SamplingRowParams row = sampling_row_params(params, state, vocab);
  std::vector<kernels::SamplingPenaltyEntry> entries;
  append_penalty_entries(params, state, vocab, entries);
  const int32_t work_row = 0;
  if (!entries.empty()) {
    row.work_row = work_row;
    row.penalty_count = static_cast<int32_t>(entries.size());
  }
  kernels::SamplingRowResult result;
  kernels::SamplingBatch batch;
  batch.logits = logits.data();
  batch.logits_stride = vocab;
  batch.num_rows = 1;
  batch.vocab = static_cast<int32_t>(vocab);
  batch.rows = &row;
  batch.penalized_rows = &work_row;
  batch.num_penalized = entries.empty() ? 0 : 1;
  batch.penalties = entries.data();
  batch.results = &result;
  if (!state.token_mask().empty()) {
    LONGCTX_CHECK(
        static_cast<int64_t>(state.token_mask().size()) == kernels::sampling_mask_words(vocab),
        ErrorCode::kInvalidArgument, "sampling: a token mask of {} words for {} logits",
        state.token_mask().size(), vocab);
    row.mask_row = 0;
    batch.masks = state.token_mask().data();
  }
  ops::sample_rows(batch, Device::cpu());
  check_sampling_result(result, std::nullopt);
  state.advance();
  return to_sample_result(result, params);
}

}  // namespace longctx
