// Speculative decoding on the GPU engine (docs/engine.md, "Speculative decoding"): the bodies of
// common/engine_properties.h that tests/engine runs on the CPU. Greedy outputs with prompt-lookup
// drafts equal the non-speculative engine's: the needle model's answer (copied from its
// haystack, accepted from drafts) with CUDA graphs for plain decode steps and eager verifying
// steps; batched beside draftless sequences with prefix caching and preemption, against each
// request alone; and with the KV offloaded.
#include <gtest/gtest.h>

#include "common/engine_properties.h"
#include "gpu_models/gpu_executor.h"

namespace longctx::testing {
namespace {

// A verifying step runs its k + 1 positions through the paged prefill kernel, a plain decode
// step through the split-KV decode: bf16 sums in another order move near-ties (the needle model
// is sensitive to rounding: tests/common/test_data.h). The other GPU model tests hold 0.05 too.
constexpr GreedyTolerance kBf16Ties{0.05, 0};

TEST(GpuSpeculative, NeedleGreedyEqualsNonSpeculative) {
  check_speculative_needle_equals_plain(GpuExecutorFactory{}, kBf16Ties);
}

TEST(GpuSpeculative, BatchedPrefixCachedPreemptedEqualsAlone) {
  check_speculative_batched_cached_preempted_equals_alone(GpuExecutorFactory{}, kBf16Ties);
}

TEST(GpuSpeculative, OffloadedGreedyEqualsNonSpeculative) {
  check_speculative_offloaded_equals_plain(GpuExecutorFactory{}, kBf16Ties);
}

}  // namespace
}  // namespace longctx::testing
