// Quest over an FP8 KV cache, one body per property for the CPU engine (tests/engine/
// test_fp8_kv_engine.cpp: the CPU reference policy, resident and through the simulated offload
// device) and the GPU engine (tests/gpu_models/test_gpu_fp8_kv.cpp: QuestCuda over the resident
// pool and the CUDA offload device), along a chunked prefill (dense: quest selects decode steps)
// and a greedy decode whose steps read budget_tokens of each KV head's keys:
//   - check_quest_fp8_offload_equals_resident: the offloaded reader (pages selected from the
//     metadata of the dequantized keys, read where they are: host pages in place, codes and
//     scales) gives the resident quest's logits; and quest does select: its decode logits differ
//     from the dense FP8 cache's, so the comparison is of sparse reads;
//   - check_quest_fp8_whole_budget_is_dense: a budget that covers the sequence reads every page (on
//     the GPU through quest's gather, dequantized, and its compact decode; the CPU policy then
//     selects nothing and the dense path runs) and gives the dense FP8 cache's logits.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "common/fp8_offload_equals_resident.h"
#include "longctx/attention/sparse_options.h"
#include "longctx/engine/executor.h"

namespace longctx::testing {

// Quest reading `budget` tokens of each KV head's keys: pages of 16, 16 sink and 32 window
// tokens.
inline SparseOptions quest_fp8_options(int64_t budget) {
  SparseOptions o;
  o.policy = SparsePolicyKind::kQuest;
  o.page_tokens = 16;
  o.budget_tokens = budget;
  o.sink_tokens = 16;
  o.window_tokens = 32;
  return o;
}

struct QuestFp8Bounds {
  Fp8OffloadBounds equal;      // offloaded vs resident quest, or whole-budget quest vs dense
  double min_sparse_diff = 0;  // quest vs dense at the decode steps: max |logit diff| above this
};

// dense, quest, quest_offload: executors of one model and block size with FP8 KV caches (the
// last through its offload device, with a GPU cache smaller than the sequence), each holding
// tokens.size() + decode_steps tokens of one sequence; quest's budget below the sequence's
// length at every decode step.
inline void check_quest_fp8_offload_equals_resident(Executor& dense, Executor& quest,
                                                    Executor& quest_offload,
                                                    const std::vector<int32_t>& tokens,
                                                    int64_t chunk, int64_t decode_steps,
                                                    const QuestFp8Bounds& bounds) {
  Fp8OffloadReport sparse_decode;
  compare_fp8_executors(dense, quest, tokens, chunk, decode_steps, bounds.equal.top1_margin,
                        &sparse_decode);
  std::printf("quest vs dense FP8 over %d decode steps: max |logit difference| %.3e, max KL %.3e\n",
              sparse_decode.rows, sparse_decode.max_abs_logit, sparse_decode.max_kl);
  EXPECT_GT(sparse_decode.max_abs_logit, bounds.min_sparse_diff)
      << "quest's decode steps gave the dense logits: did it select pages?";
  check_fp8_offload_equals_resident(quest, quest_offload, tokens, chunk, decode_steps,
                                    bounds.equal);
}

// dense, quest: resident executors as above, quest's budget at least the sequence's length.
inline void check_quest_fp8_whole_budget_is_dense(Executor& dense, Executor& quest,
                                                  const std::vector<int32_t>& tokens, int64_t chunk,
                                                  int64_t decode_steps,
                                                  const Fp8OffloadBounds& bounds) {
  Fp8OffloadReport decode;
  const Fp8OffloadReport r =
      compare_fp8_executors(dense, quest, tokens, chunk, decode_steps, bounds.top1_margin, &decode);
  std::printf(
      "quest (whole budget) vs dense FP8 over %d rows (%d decode steps): max |logit difference| "
      "%.3e, max KL %.3e, top-1 %d of %d confident rows\n",
      r.rows, decode.rows, r.max_abs_logit, r.max_kl, r.agree, r.confident);
  EXPECT_GT(decode.rows, 0);
  EXPECT_LE(r.max_abs_logit, bounds.max_abs_logit);
  EXPECT_LE(r.max_kl, bounds.max_kl);
  EXPECT_EQ(r.agree, r.confident) << "greedy tokens where the dense cache is confident";
}

}  // namespace longctx::testing
