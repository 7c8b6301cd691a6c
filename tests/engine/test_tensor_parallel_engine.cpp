// The engine over a tensor-parallel model on the CPU (ranks as threads, one executor per rank
// driven in lockstep): batched, chunked generation with prefix caching gives the tokens of the
// whole model (fp32; a divergence only where the top-2 logprobs tie within 1e-4) and frees every
// block; bad sizes are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine/llm_internal.h"
#include "longctx/core/error.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

EngineConfig config(const std::string& fixture, int64_t tp) {
  EngineConfig c;
  c.model = test_data_dir() + "/fixtures/" + fixture;
  c.device = "cpu";
  c.max_model_len = 512;
  c.block_size = 16;
  c.max_num_batched_tokens = 64;  // prompts prefill in chunks
  c.max_num_seqs = 4;
  c.model_options.rope_inv_freq_dtype = DType::kBF16;
  c.tensor_parallel_size = tp;
  return c;
}

TEST(TensorParallelEngine, RanksGenerateTheWholeModelsTokens) {
  std::mt19937 rng(9);
  std::vector<int32_t> shared(40);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 900);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 5; ++i) {
    auto p = shared;
    p.resize(10 + 7 * i);
    for (int k = 0; k < 20 + 9 * i; ++k) p.push_back(static_cast<int32_t>(rng() % 900));
    prompts.emplace_back(p);
  }
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 12;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  for (const std::string name : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    LLM whole(config(name, 1));
    const auto want = whole.generate(prompts, sp, false);
    for (int64_t tp : {2, 4}) {
      LLM llm(config(name, tp));
      const auto got = llm.generate(prompts, sp, false);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        size_t k = 0;
        while (k < want[i].token_ids.size() && got[i].token_ids[k] == want[i].token_ids[k]) ++k;
        if (k < want[i].token_ids.size()) {
          const auto& top = want[i].logprobs.at(k).top;
          EXPECT_LT(top.at(0).second - top.at(1).second, 1e-4)
              << name << " tp " << tp << " request " << i << " token " << k;
        }
        for (size_t t = 0; t < std::min(k, got[i].logprobs.size()); ++t)
          EXPECT_NEAR(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-4);
      }
      EXPECT_EQ(engine_core(llm).stats().kv_blocks_used, 0) << name << " tp " << tp;
    }
  }
}

TEST(TensorParallelEngine, SizesThatDoNotSplitAreClearErrors) {
  try {
    LLM llm(config("tiny-qwen3", 8));  // 4 attention heads
    FAIL() << "8 ranks for 4 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not split evenly"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LLM(config("tiny-qwen3", 0)), Error);
}

}  // namespace
}  // namespace longctx::testing
