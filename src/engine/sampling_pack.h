// The engine's side of the sampling op (ops/sampling.h): a request's SamplingParams and
// SamplerState packed into the op's row parameters and penalty entries, and the op's per-row
// result back as a SampleResult or an Error. One packing for every device, so the CPU tests
// check what the GPU sampler is given.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "longctx/engine/sampler.h"
#include "longctx/engine/sampling_params.h"
#include "ops/sampling.h"

namespace longctx {

// The row's parameters for a vocabulary of `vocab` (top_k off when <= 0 or >= vocab). The
// penalty fields (work_row, penalty_begin, penalty_count) are left for the caller.
kernels::SamplingRowParams sampling_row_params(const SamplingParams& p, const SamplerState& s,
                                               int64_t vocab);

// Appends the row's penalty entries, one per token, exactly the tokens the penalties touch: the
// tokens seen (repetition_penalty, with their output count) and the generated ones (frequency and
// presence penalties); tokens outside [0, vocab) are skipped.
void append_penalty_entries(const SamplingParams& p, const SamplerState& s, int64_t vocab,
                            std::vector<kernels::SamplingPenaltyEntry>& out);

// Copies the masks one after another into `dst` (masks.size() x `words` u32 words), over the
// thread pool: a batch of structured-output rows carries megabytes of them (64 x 19 KB for a
// 151K vocabulary), too much to copy serially on the engine thread every step.
void pack_token_masks(std::span<const uint32_t* const> masks, int64_t words, uint32_t* dst);

// Throws Error(kInvalidArgument) for a result whose status is not kSamplingOk, naming the token
// and (when given) the batch row, as the CPU sampler has always worded it.
void check_sampling_result(const kernels::SamplingRowResult& r, std::optional<size_t> row);

// The result as the engine reports it (logprobs only when the request asked for them).
SampleResult to_sample_result(const kernels::SamplingRowResult& r, const SamplingParams& p);

}  // namespace longctx
