// The token documents and greedy sampling the KV store's engine tests share: a document is a
// pure function of its salt (so two engines, or two runs, prefill the same blocks), and greedy
// requests carry two logprobs so outputs compare beyond their tokens; unlike greedy_compare.h's
// greedy_with_logprobs they end at EOS.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/engine/sampling_params.h"

namespace longctx::testing {

inline std::vector<int32_t> store_document(int32_t salt, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>(3 + (i * 37 + salt * 101) % 2000));
  return t;
}

inline SamplingParams store_greedy(int64_t tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = tokens;
  sp.logprobs = 2;
  return sp;
}

}  // namespace longctx::testing
