// block_causal_layout, max_blocks and max_prefix_tokens: a hand case, the key set of every query
// token against the written definition over all small layouts, and the two bounds proven both
// never exceeded AND attained (tight) by exhausting every layout of small limits.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "longctx/attention/block_causal.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

TEST(BlockCausalLayout, HandCase) {
  // Spans of 5 and 3 tokens, blocks of 2.
  BlockCausalLayout l = block_causal_layout({5, 3}, 2);
  EXPECT_EQ(l.qo_indptr, (std::vector<int64_t>{0, 2, 4, 5, 7, 8}));
  EXPECT_EQ(l.kv_indptr, (std::vector<int64_t>{0, 2, 6, 11, 13, 16}));
  EXPECT_EQ(l.kv_indices, (std::vector<int64_t>{0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 5, 6, 7}));
}

TEST(BlockCausalLayout, BlockLargerThanSpans) {
  BlockCausalLayout l = block_causal_layout({3, 1}, 64);
  EXPECT_EQ(l.qo_indptr, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(l.kv_indptr, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(l.kv_indices, (std::vector<int64_t>{0, 1, 2, 3}));
}

// Every composition (ordered spans, each >= 1 token) with at most max_spans spans and at most
// max_tokens tokens.
void for_each_layout(int max_spans, int max_tokens,
                     const std::function<void(const std::vector<int64_t>&)>& fn) {
  std::vector<int64_t> cur;
  std::function<void(int)> rec = [&](int left) {
    if (!cur.empty()) fn(cur);
    if (int(cur.size()) == max_spans) return;
    for (int len = 1; len <= left; ++len) {
      cur.push_back(len);
      rec(left - len);
      cur.pop_back();
    }
  };
  rec(max_tokens);
}

TEST(BlockCausalLayout, EveryQueryTokenSeesExactlyItsDefinedKeys) {
  int layouts = 0;
  for (int B = 1; B <= 4; ++B) {
    for_each_layout(4, 9, [&](const std::vector<int64_t>& seg) {
      ++layouts;
      BlockCausalLayout l = block_causal_layout(seg, B);
      const int64_t nb = int64_t(l.qo_indptr.size()) - 1;
      ASSERT_EQ(l.kv_indptr.size(), l.qo_indptr.size());
      ASSERT_EQ(int64_t(l.kv_indices.size()), l.kv_indptr.back());
      // The span and position of every token, from seg_lens directly.
      std::vector<int64_t> span_of, pos_of;
      for (size_t s = 0; s < seg.size(); ++s)
        for (int64_t p = 0; p < seg[s]; ++p) {
          span_of.push_back(int64_t(s));
          pos_of.push_back(p);
        }
      const int64_t total = int64_t(span_of.size());
      ASSERT_EQ(l.qo_indptr.front(), 0);
      ASSERT_EQ(l.qo_indptr.back(), total);
      std::vector<int> covered(total, 0);
      for (int64_t b = 0; b < nb; ++b) {
        ASSERT_LT(l.qo_indptr[b], l.qo_indptr[b + 1]) << "empty block";
        std::vector<int64_t> keys(l.kv_indices.begin() + l.kv_indptr[b],
                                  l.kv_indices.begin() + l.kv_indptr[b + 1]);
        for (int64_t i = l.qo_indptr[b]; i < l.qo_indptr[b + 1]; ++i) {
          ++covered[i];
          std::vector<int64_t> want;
          for (int64_t j = 0; j < total; ++j)
            if (span_of[j] == span_of[i] && pos_of[j] / B <= pos_of[i] / B) want.push_back(j);
          ASSERT_EQ(keys, want) << "token " << i << " B " << B;
        }
      }
      for (int64_t i = 0; i < total; ++i) ASSERT_EQ(covered[i], 1) << "token " << i;
    });
  }
  EXPECT_EQ(layouts, 1020);  // 255 compositions x 4 block sizes
}

TEST(BlockCausalLayout, BoundsAreNeverExceededAndAreAttained) {
  for (int B = 1; B <= 5; ++B) {
    for (int S = 1; S <= 5; ++S) {
      for (int T = 0; T <= 12; ++T) {
        int64_t most_blocks = 0, most_indices = 0;
        for_each_layout(S, T, [&](const std::vector<int64_t>& seg) {
          BlockCausalLayout l = block_causal_layout(seg, B);
          most_blocks = std::max<int64_t>(most_blocks, int64_t(l.qo_indptr.size()) - 1);
          most_indices = std::max<int64_t>(most_indices, int64_t(l.kv_indices.size()));
        });
        // Equality proves both: no layout exceeds the bound, and one attains it.
        ASSERT_EQ(max_blocks(S, T, B), most_blocks) << "S " << S << " T " << T << " B " << B;
        ASSERT_EQ(max_prefix_tokens(T, B), most_indices) << "T " << T << " B " << B;
      }
    }
  }
}

TEST(BlockCausalLayout, BoundsAtScale) {
  // 32K tokens in spans of 1,500 (the benchmark's shape) stay within the bounds.
  std::vector<int64_t> seg(21, 1500);
  seg.push_back(32768 - 21 * 1500);
  for (int64_t B : {64, 128}) {
    BlockCausalLayout l = block_causal_layout(seg, B);
    EXPECT_LE(int64_t(l.qo_indptr.size()) - 1, max_blocks(22, 32768, B));
    EXPECT_LE(int64_t(l.kv_indices.size()), max_prefix_tokens(32768, B));
  }
  EXPECT_EQ(max_blocks(10, 3, 64), 3);  // more spans than tokens: spans are non-empty
  EXPECT_EQ(max_blocks(1, 130, 64), 3);
  EXPECT_EQ(max_blocks(0, 130, 64), 0);  // no span, no block
  EXPECT_EQ(max_blocks(0, 5, 1), 0);
  EXPECT_EQ(max_prefix_tokens(130, 64), 64 + 128 + 130);
}

TEST(BlockCausalLayout, Errors) {
  EXPECT_THROW(block_causal_layout({4}, 0), Error);
  EXPECT_THROW(block_causal_layout({4}, -2), Error);
  EXPECT_THROW(block_causal_layout({}, 4), Error);
  EXPECT_THROW(block_causal_layout({4, 0}, 4), Error);
  EXPECT_THROW(block_causal_layout({-1}, 4), Error);
  EXPECT_THROW(max_blocks(2, 10, 0), Error);
  EXPECT_THROW(max_blocks(-1, 10, 4), Error);
  EXPECT_THROW(max_prefix_tokens(10, 0), Error);
  EXPECT_THROW(max_prefix_tokens(-1, 4), Error);
  try {
    block_causal_layout({4, 0}, 4);
    ADD_FAILURE() << "an empty span was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("span 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace longctx
