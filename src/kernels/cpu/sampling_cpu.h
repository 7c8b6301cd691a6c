// The CPU reference of the batched sampler (kernels/cuda/sampling.h): the same SamplingBatch
// contract on host memory, vLLM's order (penalties -> temperature -> min_p -> top_k -> top_p ->
// draw), the arithmetic of kernels/sampling_math.h, so both twins pick the same token from the
// same logits, parameters and (seed, step). Readable loops over one row at a time.
#pragma once

#include <cstdint>
#include <span>

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

}  // namespace longctx::kernels::cpu
