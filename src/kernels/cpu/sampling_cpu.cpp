#include "kernels/cpu/sampling_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/philox.h"
#include "kernels/sampling_math.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

float max_finite(std::span<const float> logits) {
  float m = kNegInf;
  for (float x : logits) m = std::max(m, x);
  return m;
}

int32_t argmax(std::span<const float> logits) {
  // First index of the maximum, like torch.argmax.
  int64_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

bool allowed(const uint32_t* mask, size_t i) {
  return mask == nullptr || ((mask[i >> 5] >> (i & 31)) & 1) != 0;
}

// The argmax of the row with the tokens the mask leaves out at -inf (first index of the
// maximum); -1 when every allowed logit is -inf.
int32_t masked_argmax(std::span<const float> raw, const uint32_t* mask) {
  int32_t best = -1;
  float best_value = kNegInf;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] > best_value && allowed(mask, i)) {
      best = static_cast<int32_t>(i);
      best_value = raw[i];
    }
  }
  return best;
}

// The raw row: the first NaN or +inf, else whether any logit is finite.
bool check_raw(std::span<const float> raw, SamplingRowResult& res) {
  bool any_finite = false;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (std::isnan(raw[i]) || raw[i] == kPosInf) {
      res.status = std::isnan(raw[i]) ? kSamplingNaN : kSamplingPosInf;
      res.bad_index = static_cast<int32_t>(i);
      return false;
    }
    any_finite = any_finite || raw[i] != kNegInf;
  }
  if (!any_finite) res.status = kSamplingAllNegInf;
  return any_finite;
}

// After penalties and temperature: a finite logit may have overflowed, or all become -inf.
bool check_transformed(std::span<const float> logits, SamplingRowResult& res) {
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == kPosInf) {
      res.status = kSamplingOverflow;
      res.bad_index = static_cast<int32_t>(i);
      return false;
    }
    any_finite = any_finite || logits[i] != kNegInf;
  }
  if (!any_finite) res.status = kSamplingAllNegInfAfter;
  return any_finite;
}

// The first token (in id order) whose cumulative mass exceeds u * total.
int32_t draw(std::span<const float> logits, double u) {
  const float m = max_finite(logits);
  uint64_t total = 0;
  for (float x : logits) total += token_mass(sub_rn(x, m));
  const uint64_t target = draw_target(u, total);
  uint64_t cum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    cum += token_mass(sub_rn(logits[i], m));
    if (target < cum) return static_cast<int32_t>(i);
  }
  LONGCTX_ASSERT(false, "draw: target {} past the total mass {}", target, total);
  return -1;
}

double log_sum_exp(std::span<const float> logits) {
  const double m = max_finite(logits);
  double total = 0.0;
  for (float x : logits) total += x == kNegInf ? 0.0 : std::exp(x - m);
  return m + std::log(total);
}

// logprob_i = logit_i - logsumexp of the raw logits: ranks and the top N follow from them.
void row_logprobs(std::span<const float> raw, int32_t token, int n_top, SamplingRowResult& res) {
  const double log_z = log_sum_exp(raw);
  res.logprob = static_cast<float>(raw[token] - log_z);
  res.rank = 1;
  for (float v : raw) res.rank += v > raw[token] ? 1 : 0;
  std::vector<int32_t> idx(raw.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t n = std::min(static_cast<size_t>(std::max(n_top, 0)), idx.size());
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
  });
  res.num_top = static_cast<int32_t>(n);
  for (size_t i = 0; i < n; ++i) {
    res.top_ids[i] = idx[i];
    res.top_logprobs[i] = static_cast<float>(raw[idx[i]] - log_z);
  }
}

SamplingRowResult sample_row(std::span<const float> raw, const SamplingRowParams& p,
                             std::span<const SamplingPenaltyEntry> entries, const uint32_t* mask) {
  SamplingRowResult res;
  if (p.greedy && entries.empty()) {
    // Nothing to rewrite: the argmax reads the mask with the raw row (as the GPU kernel does)
    // instead of a masked copy. Raw +inf is refused, so nothing can overflow.
    if (!check_raw(raw, res)) return res;
    const int32_t token = masked_argmax(raw, mask);
    if (token < 0) {
      res.status = kSamplingAllNegInfAfter;
      return res;
    }
    res.token = token;
  } else {
    std::vector<float> work;
    if (!sampling_logits(raw, p, entries, mask, work, res)) return res;
    res.token = p.greedy ? argmax(work) : draw(work, sampling_uniform(p.seed, p.step));
  }
  if (p.logprobs >= 0) row_logprobs(raw, res.token, std::min(p.logprobs, kSamplingMaxTop), res);
  return res;
}

}  // namespace

bool sampling_logits(std::span<const float> raw, const SamplingRowParams& p,
                     std::span<const SamplingPenaltyEntry> entries, const uint32_t* mask,
                     std::vector<float>& work, SamplingRowResult& res) {
  if (!check_raw(raw, res)) return false;
  work.assign(raw.begin(), raw.end());
  apply_penalty_entries(work, raw, entries, p);
  if (mask != nullptr) {
    for (size_t i = 0; i < work.size(); ++i) {
      if (!allowed(mask, i)) work[i] = kNegInf;
    }
  }
  if (!p.greedy) {
    for (float& x : work) x *= p.inv_temperature;  // -inf stays -inf
  }
  if (!check_transformed(work, res)) return false;
  if (!p.greedy) {
    if (p.use_min_p) {
      // p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p)
      const double threshold = max_finite(work) + p.log_min_p;
      for (float& x : work) {
        if (x < threshold) x = kNegInf;
      }
    }
    apply_top_k(work, p.top_k);
    apply_top_p(work, p.top_p);
  }
  return true;
}

int32_t argmax_token(std::span<const float> logits) { return argmax(logits); }

int32_t draw_token(std::span<const float> logits, double u) { return draw(logits, u); }

uint64_t token_mass_of(std::span<const float> logits, int32_t token, uint64_t* total) {
  const float m = max_finite(logits);
  *total = 0;
  for (float x : logits) *total += token_mass(sub_rn(x, m));
  return token_mass(sub_rn(logits[token], m));
}

void fill_logprobs(std::span<const float> raw, int32_t token, int n_top, SamplingRowResult& res) {
  row_logprobs(raw, token, n_top, res);
}

void apply_penalty_entries(std::span<float> logits, std::span<const float> raw,
                           std::span<const SamplingPenaltyEntry> entries,
                           const SamplingRowParams& p) {
  const bool counted = p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
  for (const SamplingPenaltyEntry& e : entries) {
    float x = raw[e.token];
    if (e.repeated) x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    if (e.count > 0 && counted) {
      x -= static_cast<float>(p.frequency_penalty * e.count + p.presence_penalty);
    }
    logits[e.token] = x;
  }
}

void apply_temperature(std::span<float> logits, double temperature) {
  if (temperature == 1.0) return;
  const auto inv = static_cast<float>(1.0 / temperature);
  for (float& x : logits) x *= inv;  // -inf stays -inf
}

void apply_min_p(std::span<float> logits, double min_p) {
  if (min_p <= 0.0) return;
  const double threshold = max_finite(logits) + std::log(min_p);
  for (float& x : logits) {
    if (x < threshold) x = kNegInf;
  }
}

void apply_top_k(std::span<float> logits, int64_t top_k) {
  if (top_k <= 0 || top_k >= static_cast<int64_t>(logits.size())) return;
  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
  const float kth = sorted[top_k - 1];
  // Ties with the k-th value are kept, as vLLM's mask (logits < kth) does.
  for (float& x : logits) {
    if (x < kth) x = kNegInf;
  }
}

void apply_top_p(std::span<float> logits, double top_p) {
  if (top_p >= 1.0) return;
  std::vector<int32_t> idx;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] != kNegInf) idx.push_back(static_cast<int32_t>(i));
  }
  if (idx.empty()) return;
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const float m = max_finite(logits);
  auto mass = [&](int32_t i) { return token_mass(sub_rn(logits[i], m)); };
  uint64_t total = 0;
  for (int32_t i : idx) total += mass(i);
  // Keep a token while the mass ranked above it is below top_p: the smallest prefix whose mass
  // reaches top_p (the top token always stays). Sorting all of a 150k vocabulary costs tens of
  // ms, so sort only the best `head` tokens, growing it until the prefix ends inside it.
  size_t keep = 0;
  for (size_t head = std::min<size_t>(1024, idx.size());; head = std::min(head * 8, idx.size())) {
    std::partial_sort(idx.begin(), idx.begin() + head, idx.end(), before);
    uint64_t above = 0;
    keep = 0;
    while (keep < head && top_p_keeps(above, total, top_p)) {
      above += mass(idx[keep]);
      ++keep;
    }
    if (keep < head || !top_p_keeps(above, total, top_p) || head == idx.size()) break;
  }
  for (size_t j = keep; j < idx.size(); ++j) logits[idx[j]] = kNegInf;
}

void sample_rows(const SamplingBatch& b) {
  LONGCTX_CHECK(b.num_rows >= 0, ErrorCode::kInvalidArgument, "sample_rows: {} rows", b.num_rows);
  LONGCTX_CHECK(b.vocab >= 1 && b.vocab <= kMaxSamplingVocab, ErrorCode::kInvalidArgument,
                "sample_rows: vocabulary {} not in [1, {}]", b.vocab, kMaxSamplingVocab);
  LONGCTX_CHECK(b.logits_stride >= b.vocab, ErrorCode::kInvalidArgument,
                "sample_rows: row stride {} below the vocabulary {}", b.logits_stride, b.vocab);
  if (b.num_rows == 0) return;
  LONGCTX_CHECK(b.logits && b.rows && b.results && (b.num_penalized == 0 || b.penalties),
                ErrorCode::kInvalidArgument, "sample_rows: missing pointers");
  for (int32_t r = 0; r < b.num_rows; ++r) {
    const SamplingRowParams& p = b.rows[r];
    std::span<const float> raw(b.logits + int64_t{r} * b.logits_stride, b.vocab);
    std::span<const SamplingPenaltyEntry> entries;
    if (p.work_row >= 0) entries = {b.penalties + p.penalty_begin, size_t(p.penalty_count)};
    LONGCTX_CHECK(p.mask_row < 0 || b.masks != nullptr, ErrorCode::kInvalidArgument,
                  "sample_rows: row {} has a mask row but the batch no masks", r);
    const uint32_t* mask =
        p.mask_row >= 0 ? b.masks + int64_t{p.mask_row} * sampling_mask_words(b.vocab) : nullptr;
    b.results[r] = sample_row(raw, p, entries, mask);
  }
}

}  // namespace longctx::kernels::cpu
