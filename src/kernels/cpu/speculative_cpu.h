// The CPU reference of speculative decoding's verification of one position (fp32 logits, the
// sampler's arithmetic): given the target model's logits row at a draft position and the draft
// token there, either accept the draft or replace it, so that the token the position yields is
// distributed exactly as the sampler's draw from the same row (Leviathan et al. / Chen et al.,
// with a deterministic, one-hot draft distribution q = onehot(x)):
//   - greedy rows: accept x when it is the argmax (after penalties and mask), else take the
//     argmax: exactly the non-speculative greedy token;
//   - sampled rows: p = the row's distribution after penalties, mask, temperature, min_p, top_k
//     and top_p (kernels/cpu/sampling_cpu.h); accept x with probability p(x) (uniform
//     speculative_accept_uniform(seed, step) < p(x)); on rejection draw from the residual
//     max(p - onehot(x), 0) renormalized, i.e. p with x removed (uniform sampling_uniform(seed,
//     step)). P(token = t) = p(x) [t = x] + (1 - p(x)) p(t) [t != x] / (1 - p(x)) = p(t).
// A position without a draft (draft < 0: the bonus token after a fully accepted draft) is a
// plain draw, as sample_rows would make it.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/sampling_kernel_params.h"

namespace longctx::kernels::cpu {

struct SpeculativeRowResult {
  bool accepted = false;     // the draft token stands
  SamplingRowResult sample;  // the position's token (the draft when accepted), logprobs, status
};

// `p`, `entries` and `mask` as one row of sample_rows (p.seed / p.step: the request's seed and
// the index of the token this position generates). A draft outside [0, vocab) is rejected.
SpeculativeRowResult verify_draft_row(std::span<const float> raw, const SamplingRowParams& p,
                                      std::span<const SamplingPenaltyEntry> entries,
                                      const uint32_t* mask, int32_t draft);

}  // namespace longctx::kernels::cpu
