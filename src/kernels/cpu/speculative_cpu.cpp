#include "kernels/cpu/speculative_cpu.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/sampling_cpu.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"

namespace longctx::kernels::cpu {

SpeculativeRowResult verify_draft_row(std::span<const float> raw, const SamplingRowParams& p,
                                      std::span<const SamplingPenaltyEntry> entries,
                                      const uint32_t* mask, int32_t draft) {
  SpeculativeRowResult out;
  SamplingRowResult& res = out.sample;
  std::vector<float> work;
  if (!sampling_logits(raw, p, entries, mask, work, res)) return out;
  const bool has_draft = draft >= 0 && draft < static_cast<int32_t>(work.size());
  if (p.greedy) {
    res.token = argmax_token(work);
    out.accepted = has_draft && draft == res.token;
  } else {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (has_draft && work[draft] != kNegInf) {
      // Accept with probability p(x) = mass(x) / total, in the draw's integer masses.
      uint64_t total = 0;
      const uint64_t mass = token_mass_of(work, draft, &total);
      out.accepted = draw_target(speculative_accept_uniform(p.seed, p.step), total) < mass;
      // The residual: p without x (x is not its only token, or it was accepted).
      if (!out.accepted) work[draft] = kNegInf;
    }
    res.token = out.accepted ? draft : draw_token(work, sampling_uniform(p.seed, p.step));
  }
  if (p.logprobs >= 0) fill_logprobs(raw, res.token, std::min(p.logprobs, kSamplingMaxTop), res);
  return out;
}

}  // namespace longctx::kernels::cpu
