// Greedy continuations of two engines (GPU against CPU, graphs against eager) compared up to
// near ties: after a step whose reference top-2 margin is below `tie_margin` the two may part.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "longctx/engine/request_output.h"

namespace longctx::testing {

// `want` must carry logprobs (SamplingParams::logprobs >= 2).
inline void expect_same_tokens_up_to_ties(const std::vector<RequestOutput>& want,
                                          const std::vector<RequestOutput>& got, double tie_margin,
                                          const char* what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t s = 0; s < want.size(); ++s) {
    const auto& a = want[s].token_ids;
    const auto& b = got[s].token_ids;
    ASSERT_EQ(a.size(), b.size());
    size_t i = 0;
    while (i < a.size() && a[i] == b[i]) ++i;
    if (i < a.size()) {
      const auto& top = want[s].logprobs.at(i).top;
      EXPECT_LT(top.at(0).second - top.at(1).second, tie_margin)
          << what << ", prompt " << s << ": token " << i << " differs (" << b[i] << " vs " << a[i]
          << ")";
    }
    std::printf("%s, prompt %zu: %zu/%zu tokens equal\n", what, s, i, a.size());
  }
}

}  // namespace longctx::testing
