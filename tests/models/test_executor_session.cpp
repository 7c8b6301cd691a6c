// ExecutorSession over the CPU executor (tests/common/executor_session_cases.h, the body the GPU
// suite runs over the GPU runner): one KV group (tiny-llama3), full + sliding-window groups
// (tiny-gemma3) and full + linear-attention state groups (tiny-qwen3-next), standalone.
#include <gtest/gtest.h>

#include "common/executor_session_cases.h"

namespace longctx::testing {
namespace {

SessionDevice cpu_device() {
  SessionDevice d;
  d.make = [](const std::string& name, int64_t num_blocks, const ExecutorSessionOptions& limits) {
    CpuExecutorOptions o;
    o.block_size = kSessionBlockSize;
    o.num_blocks = num_blocks;
    o.max_state_seqs = limits.max_num_seqs;
    o.max_state_snapshots = 0;  // a session caches no prefixes
    return make_cpu_executor(load_fixture_model(name), o);
  };
  // fp32 on both sides: chunks and decode rows move logits by up to test_fixture_models.cpp's
  // split tolerance (2e-3 with recurrent state, logits up to 20), far below a top-1 margin.
  d.max_kl = 1e-5;
  d.min_top1 = 1.0;
  d.row_tolerance = 2e-4;
  // test_fixture_models.cpp's 1e-3 of one dense forward, plus that split tolerance.
  d.max_transformers_error = 3e-3;
  return d;
}

class CpuExecutorSession : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuExecutorSession, PromptLogitsMatchTheReferenceAndTransformers) {
  expect_session_prompt_logits_match_reference(cpu_device(), GetParam());
}

TEST_P(CpuExecutorSession, RunOfABatchEqualsPromptLogitsAlone) {
  expect_session_run_equals_prompt_logits(cpu_device(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CpuExecutorSession,
                         ::testing::Values("tiny-llama3", "tiny-gemma3", "tiny-qwen3-next"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(CpuExecutorSessionErrors, BadCallsAreClearErrors) {
  expect_session_errors_are_clear(cpu_device(), "tiny-llama3");
}

TEST(CpuExecutorSessionErrors, NullExecutorAndBadLimitsAreRefused) {
  EXPECT_THROW(ExecutorSession(nullptr, {}), Error);
  ExecutorSessionOptions o;
  o.max_num_seqs = 0;
  EXPECT_THROW(ExecutorSession(cpu_device().make("tiny-llama3", 16, o), o), Error);
}

}  // namespace
}  // namespace longctx::testing
