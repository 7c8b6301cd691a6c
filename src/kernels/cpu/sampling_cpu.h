// The CPU reference of the batched sampler (kernels/cuda/sampling.h): the same SamplingBatch
// contract on host memory, vLLM's order (penalties -> temperature -> min_p -> top_k -> top_p ->
// draw), the arithmetic of kernels/sampling_math.h, so both twins pick the same token from the
// same logits, parameters and (seed, step). Readable loops over one row at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/sampling_kernel_params.h"

namespace longctx::kernels::cpu {

// Every pointer of `batch` is host memory; batch.work is not used (each row gets its own copy).
// Results, statuses included, as the CUDA kernel writes them.
void sample_rows(const SamplingBatch& batch);

// The steps, one row at a time; `logits` is modified in place and masked entries become -inf.
void apply_penalty_entries(std::span<float> logits, std::span<const float> raw,
                           std::span<const SamplingPenaltyEntry> entries,
                           const SamplingRowParams& p);
void apply_temperature(std::span<float> logits, double temperature);
void apply_min_p(std::span<float> logits, double min_p);
void apply_top_k(std::span<float> logits, int64_t top_k);
// top_p over integer token masses (kernels::token_mass): keeps the smallest prefix of the tokens
// ranked by logit (ties: lower id first) whose mass reaches top_p of the total.
void apply_top_p(std::span<float> logits, double top_p);

// The distribution a row is drawn from: `work` = raw -> penalties -> mask -> temperature ->
// min_p -> top_k -> top_p (greedy rows: penalties and mask only), the logits whose integer masses
// (kernels/sampling_math.h) draw_token() draws from. False (res.status set) when the row cannot
// be sampled.
bool sampling_logits(std::span<const float> raw, const SamplingRowParams& p,
                     std::span<const SamplingPenaltyEntry> entries, const uint32_t* mask,
                     std::vector<float>& work, SamplingRowResult& res);
int32_t argmax_token(std::span<const float> logits);  // the first index of the maximum
// The first token whose cumulative mass exceeds u * total (u in [0, 1)).
int32_t draw_token(std::span<const float> logits, double u);
// The integer mass of `token` and (in *total) of the whole row: p(token) = mass / total.
uint64_t token_mass_of(std::span<const float> logits, int32_t token, uint64_t* total);
// The raw row's logprob and rank of `token` and its top n_top tokens into `res`.
void fill_logprobs(std::span<const float> raw, int32_t token, int n_top, SamplingRowResult& res);

}  // namespace longctx::kernels::cpu
