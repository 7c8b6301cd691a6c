// Greedy continuations of two engines (GPU against CPU, graphs against eager, offloaded against
// resident, speculative against plain) compared up to near ties: after a step whose reference
// top-2 margin is below the tie margin the two may part, and are not compared past it.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "longctx/engine/request_output.h"
#include "longctx/engine/sampling_params.h"

namespace longctx::testing {

// Greedy, `max_tokens` long whatever the model says, with the top-2 logprobs the comparisons
// below read.
inline SamplingParams greedy_with_logprobs(int64_t max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  return sp;
}

struct GreedyTolerance {
  double tie_margin = 0;  // the reference's top-2 margin below which tokens may part
  double logprob = 0;     // > 0: the equal tokens' logprobs within this of the reference's
};

// Leading tokens equal, counted; fails where they part while the reference was not near a tie.
// `want` must carry logprobs (SamplingParams::logprobs >= 2).
inline size_t expect_same_tokens_up_to_ties(const RequestOutput& want, const RequestOutput& got,
                                            const GreedyTolerance& tol, const char* what) {
  const auto& a = want.token_ids;
  const auto& b = got.token_ids;
  EXPECT_EQ(a.size(), b.size()) << what;
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) {
    if (tol.logprob > 0)
      EXPECT_NEAR(want.logprobs.at(i).logprob, got.logprobs.at(i).logprob, tol.logprob)
          << what << ": token " << i;
    ++i;
  }
  if (i < a.size() && i < b.size()) {
    const auto& top = want.logprobs.at(i).top;
    EXPECT_GE(top.size(), 2u) << what;
    if (top.size() >= 2)
      EXPECT_LT(top[0].second - top[1].second, tol.tie_margin)
          << what << ": token " << i << " differs (" << b[i] << " vs " << a[i] << ")";
  }
  return i;
}

inline void expect_same_tokens_up_to_ties(const std::vector<RequestOutput>& want,
                                          const std::vector<RequestOutput>& got,
                                          const GreedyTolerance& tol, const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  size_t same = 0, total = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << what << ", prompt " << s);
    same += expect_same_tokens_up_to_ties(want[s], got[s], tol, what);
    total += want[s].token_ids.size();
  }
  std::printf("%s: %zu/%zu tokens equal\n", what, same, total);
}

inline void expect_same_tokens_up_to_ties(const std::vector<RequestOutput>& want,
                                          const std::vector<RequestOutput>& got, double tie_margin,
                                          const char* what) {
  expect_same_tokens_up_to_ties(want, got, GreedyTolerance{tie_margin, 0}, what);
}

}  // namespace longctx::testing
