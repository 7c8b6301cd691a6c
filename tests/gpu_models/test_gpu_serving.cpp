// The serving engine on the GPU (H200): continuous batching, prefix caching, preemption, CUDA
// graphs and device sampling through the LLM API, against runs of each request alone, runs
// without the prefix cache and eager runs. bf16 GEMMs may round differently for another number
// of rows, so greedy tokens are compared up to a step where the reference's top-2 logprobs were
// within kTieMargin (there a flip is rounding, not a bug).
#include <gtest/gtest.h>

#include <random>

#include "common/engine_properties.h"
#include "common/test_data.h"
#include "gpu_models/gpu_executor.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

constexpr double kTieMargin = 0.02;

std::string needle_dir() { return longctx::testing::needle_v1_dir(); }

EngineConfig gpu_config(int64_t num_gpu_blocks, bool eager, bool caching = true,
                        int64_t max_model_len = 1024) {
  EngineConfig c;
  c.model = needle_dir();
  c.device = "cuda";
  c.max_model_len = max_model_len;
  c.block_size = 16;
  c.max_num_batched_tokens = 512;
  c.max_num_seqs = 32;
  c.num_gpu_blocks = num_gpu_blocks;
  c.enforce_eager = eager;
  c.enable_prefix_caching = caching;
  return c;
}

std::vector<std::vector<int32_t>> prompts(int n, int64_t shared, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> prefix(shared);
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % 2000);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    auto p = prefix;
    for (int64_t k = 0, len = 5 + rng() % 300; k < len; ++k)
      p.push_back(static_cast<int32_t>(rng() % 2000));
    out.push_back(p);
  }
  return out;
}

TEST(GpuServing, BatchedGraphRunsEqualEachRequestAloneEager) {
  auto ps = prompts(24, 40, 1);
  LLM batched(gpu_config(4096, /*eager=*/false));
  auto outs =
      batched.generate(std::vector<Prompt>(ps.begin(), ps.end()), greedy_with_logprobs(48), false);
  LLM eager(gpu_config(4096, /*eager=*/true, /*caching=*/false));
  size_t same = 0, total = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    auto alone = eager.generate({ps[i]}, greedy_with_logprobs(48), false);
    same += expect_same_tokens_up_to_ties(alone[0], outs[i], {kTieMargin, 0},
                                          "batched+graphs vs alone eager");
    total += alone[0].token_ids.size();
  }
  std::printf("batched with graphs vs alone eager: %zu of %zu tokens equal\n", same, total);
}

class GpuServingModes : public ::testing::TestWithParam<bool> {};  // enforce_eager

// common/engine_properties.h's body (tests/engine/test_preemption.cpp runs it on the CPU).
TEST_P(GpuServingModes, PreemptionAndPrefixCacheKeepOutputs) {
  // 16 requests of up to ~410 tokens need ~410 blocks of 16 at once; 120 forces preemption.
  const auto ps = shared_prefix_prompts(16, 64, 64, 0, 300, 2000, 2);
  EngineSpec tight;
  tight.checkpoint = checkpoint_of(needle_dir());
  tight.max_model_len = 1024;
  tight.block_size = 16;
  tight.num_blocks = 120;
  tight.max_num_batched_tokens = 512;
  tight.max_num_seqs = 32;
  EngineSpec roomy = tight;
  roomy.num_blocks = 4096;
  roomy.enable_prefix_caching = false;
  check_preemption_and_prefix_cache_keep_outputs(GpuExecutorFactory{.enforce_eager = GetParam()},
                                                 tight, roomy, ps, 40, {kTieMargin, 0});
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuServingModes, ::testing::Values(true, false));

TEST(GpuServing, SeededSamplingReproduces) {
  auto ps = prompts(8, 0, 3);
  SamplingParams sp;
  sp.temperature = 0.8;
  sp.top_p = 0.95;
  sp.max_tokens = 32;
  sp.ignore_eos = true;
  sp.seed = 1234;
  LLM a(gpu_config(4096, false));
  auto x = a.generate(std::vector<Prompt>(ps.begin(), ps.end()), sp, false);
  LLM b(gpu_config(4096, false));
  auto z = b.generate(std::vector<Prompt>(ps.begin(), ps.end()), sp, false);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(x[i].token_ids, z[i].token_ids) << "run-to-run, request " << i;
    EXPECT_EQ(x[i].token_ids.size(), 32u);
  }
  // Different seeds give different runs.
  sp.seed = 99;
  auto w = b.generate({ps[0]}, sp, false);
  EXPECT_NE(w[0].token_ids, z[0].token_ids);
}

TEST(GpuServing, OutOfBlocksRequestIsAClearError) {
  // 8 blocks of 16 = 128 tokens = max_model_len, but one block is the graphs' padding block: a
  // request that may reach 128 tokens can never fit the 7 the engine has.
  LLM llm(gpu_config(8, false, true, 128));
  try {
    llm.generate({std::vector<int32_t>(100, 5)}, greedy_with_logprobs(100), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  }
  EXPECT_EQ(llm.generate({std::vector<int32_t>(20, 5)}, greedy_with_logprobs(8), false)[0]
                .token_ids.size(),
            8u);
}

}  // namespace
}  // namespace longctx::testing
