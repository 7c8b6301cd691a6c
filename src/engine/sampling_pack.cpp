#include "engine/sampling_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "longctx/core/error.h"
#include "longctx/core/parallel.h"

namespace longctx {

kernels::SamplingRowParams sampling_row_params(const SamplingParams& p, const SamplerState& s,
                                               int64_t vocab) {
  kernels::SamplingRowParams r;
  r.seed = s.seed();
  r.step = s.step();
  r.greedy = p.greedy() ? 1 : 0;
  r.inv_temperature = p.greedy() ? 1.0f : static_cast<float>(1.0 / p.temperature);
  r.top_k = p.top_k > 0 && p.top_k < vocab ? static_cast<int32_t>(p.top_k) : 0;
  r.top_p = p.top_p;
  r.use_min_p = p.min_p > 0.0 ? 1 : 0;
  r.log_min_p = p.min_p > 0.0 ? std::log(p.min_p) : 0.0;
  r.repetition_penalty = static_cast<float>(p.repetition_penalty);
  r.frequency_penalty = p.frequency_penalty;
  r.presence_penalty = p.presence_penalty;
  r.logprobs = p.logprobs ? *p.logprobs : -1;
  return r;
}

void append_penalty_entries(const SamplingParams& p, const SamplerState& s, int64_t vocab,
                            std::vector<kernels::SamplingPenaltyEntry>& out) {
  const bool repetition = p.repetition_penalty != 1.0;
  const bool counted = p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (repetition) {
    for (int32_t t : s.seen()) {
      if (!in_vocab(t)) continue;
      int32_t count = 0;
      if (counted) {
        const auto it = s.output_counts().find(t);
        if (it != s.output_counts().end()) count = it->second;
      }
      out.push_back({t, count, 1, 0});
    }
  }
  if (counted) {
    for (const auto& [t, count] : s.output_counts()) {
      if (!in_vocab(t) || (repetition && s.seen().count(t) != 0)) continue;
      out.push_back({t, count, 0, 0});
    }
  }
}

void check_sampling_result(const kernels::SamplingRowResult& r, std::optional<size_t> row) {
  if (r.status == kernels::kSamplingOk) return;
  constexpr auto kBad = ErrorCode::kInvalidArgument;
  const std::string in_row = row ? fmt::format(", batch row {}", *row) : std::string();
  const std::string of_row = row ? fmt::format(" (batch row {})", *row) : std::string();
  switch (r.status) {
    case kernels::kSamplingNaN:
      LONGCTX_THROW(kBad, "the model produced a NaN logit (token {}{})", r.bad_index, in_row);
    case kernels::kSamplingPosInf:
      LONGCTX_THROW(kBad, "the model produced a +inf logit (token {}{})", r.bad_index, in_row);
    case kernels::kSamplingAllNegInf:
      LONGCTX_THROW(kBad, "every logit is -inf: no token can be sampled{}", of_row);
    case kernels::kSamplingOverflow:
      LONGCTX_THROW(kBad,
                    "the logit of token {} overflows to +inf after penalties and temperature{}",
                    r.bad_index, of_row);
    case kernels::kSamplingAllNegInfAfter:
      LONGCTX_THROW(kBad,
                    "every logit is -inf after penalties and temperature: no token can be "
                    "sampled{}",
                    of_row);
    default:
      LONGCTX_THROW(ErrorCode::kInternal, "sampler: unknown status {}{}", r.status, of_row);
  }
}

SampleResult to_sample_result(const kernels::SamplingRowResult& r, const SamplingParams& p) {
  SampleResult out;
  out.token = r.token;
  if (p.logprobs) {
    TokenLogprobs& lp = out.logprobs;
    lp.token = r.token;
    lp.logprob = r.logprob;
    lp.rank = r.rank;
    for (int j = 0; j < r.num_top; ++j) lp.top.emplace_back(r.top_ids[j], r.top_logprobs[j]);
  }
  return out;
}

void pack_token_masks(std::span<const uint32_t* const> masks, int64_t words, uint32_t* dst) {
  // Bytes per pool task: waking a worker costs microseconds, about what copying this much takes,
  // so small masks (a small vocabulary, or few rows) are copied inline.
  constexpr int64_t kBytesPerTask = 128 << 10;
  const auto bytes = static_cast<size_t>(words) * sizeof(uint32_t);
  const int64_t masks_per_task =
      std::max<int64_t>(1, kBytesPerTask / std::max<int64_t>(words * 4, 1));
  parallel_for(
      static_cast<int64_t>(masks.size()),
      [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m) std::memcpy(dst + m * words, masks[m], bytes);
      },
      masks_per_task);
}

}  // namespace longctx
