#include "engine/ngram_drafter.h"

#include <algorithm>
#include <cstring>

#include "longctx/core/error.h"

namespace longctx {

NgramDrafter::NgramDrafter(int64_t min_n, int64_t max_n)
    : min_n_(min_n), max_n_(max_n), index_(static_cast<size_t>(max_n - min_n + 1)) {
  LONGCTX_CHECK(min_n >= 1 && min_n <= max_n, ErrorCode::kInvalidArgument,
                "n-gram drafter: prompt_lookup_min {} and prompt_lookup_max {} must satisfy 1 <= "
                "min <= max",
                min_n, max_n);
}

uint64_t NgramDrafter::key_of(std::span<const int32_t> tokens, int64_t e, int64_t n) {
  // FNV-1a over the tokens' bytes, then a final mix so nearby n-grams spread over the buckets.
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = e - n; i < e; ++i) {
    uint32_t t = 0;
    std::memcpy(&t, &tokens[i], sizeof t);
    h = (h ^ t) * 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

std::vector<int32_t> NgramDrafter::propose(std::span<const int32_t> tokens, int64_t k) {
  std::vector<int32_t> draft;
  if (index_.empty() || k <= 0) return draft;
  const auto len = static_cast<int64_t>(tokens.size());
  if (len < indexed_) {  // not an extension of what was indexed: start over
    for (auto& m : index_) m.clear();
    indexed_ = 0;
  }
  // An occurrence ending at e is useful when a token follows it: e <= len - 1. The suffix itself
  // (e = len) is never indexed before it is looked up.
  for (int64_t e = std::max<int64_t>(indexed_, min_n_); e <= len - 1; ++e) {
    for (int64_t n = min_n_; n <= std::min(max_n_, e); ++n)
      index_[n - min_n_][key_of(tokens, e, n)] = static_cast<int32_t>(e);
  }
  indexed_ = std::max(indexed_, len);
  for (int64_t n = std::min(max_n_, len - 1); n >= min_n_; --n) {
    const auto& m = index_[n - min_n_];
    const auto it = m.find(key_of(tokens, len, n));
    if (it == m.end()) continue;
    const int64_t e = it->second;
    if (!std::equal(tokens.begin() + (e - n), tokens.begin() + e, tokens.end() - n)) continue;
    const int64_t end = std::min(len, e + k);
    draft.assign(tokens.begin() + e, tokens.begin() + end);
    break;
  }
  return draft;
}

}  // namespace longctx
