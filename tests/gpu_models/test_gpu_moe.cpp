// Tiny random Qwen3-MoE / Qwen2-MoE checkpoints (written here, f32 on disk) on the GPU against the
// CPU reference of the same model code:
//   - prompt logits (f16 activations, 300 tokens: the grouped-GEMM path) within a KL bound, top-1
//     agreement where the CPU margin exceeds 0.05 (the decode GEMV path against the CPU twin is
//     tests/gpu_ops/moe_test.cpp's);
//   - the engine with CUDA graphs (routing inside the captured decode graphs) gives the greedy
//     tokens of the eager engine, batched, except at steps whose top-2 margin is a near tie.
// The bounds are first guesses (not yet run on a GPU when written): a routing flip on one token
// of one layer moves that token's logits a lot in these random-weight models, so they are looser
// than the dense fixtures' 1e-3 and meant to be set from the first H200 run; a broken op gives
// KL ~1 and top-1 near chance.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/greedy_compare.h"
#include "common/moe_checkpoint.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/llm.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxKl = 2e-2, kMinTop1 = 0.97, kTieMargin = 0.02;

class GpuMoe : public ::testing::TestWithParam<bool> {  // the shared-expert variant
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("longctx_gpu_moe_" + std::to_string(GetParam()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    const nlohmann::json config = tiny_moe_config_json(GetParam());
    write_checkpoint_dir(
        dir_, config,
        per_expert_weights(tiny_moe_weights(parse_model_config(config, "tiny-moe"), 47)), 2);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(GpuMoe, PromptLogitsMatchTheCpuReference) {
  auto ck = std::make_shared<const Checkpoint>(load_checkpoint(dir_.string()));
  const std::vector<int32_t> ids = make_ids(300, 5, 320);
  Tensor ref = full_forward(*create_model(ck, {}), ids);
  ModelBuildOptions o;
  o.device = Device::cuda(0);
  o.activation_dtype = DType::kF16;
  GpuRunnerOptions r;
  r.block_size = 16;
  r.max_model_len = 512;
  r.max_num_batched_tokens = 1024;
  r.max_num_seqs = 4;
  r.num_gpu_blocks = 256;
  ExecutorSession session = make_gpu_session(std::make_shared<GpuRunner>(create_model(ck, o), r));
  Tensor got = session.prompt_logits(ids);
  ASSERT_EQ(got.shape(), ref.shape());
  const int64_t n = ref.size(0), v = ref.size(1);
  double max_kl = 0;
  int64_t compared = 0, agree = 0;
  for (int64_t row = 0; row < n; ++row) {
    const float* p = ref.data<float>() + row * v;
    const float* q = got.data<float>() + row * v;
    for (int64_t i = 0; i < v; ++i) ASSERT_TRUE(std::isfinite(q[i])) << row << " " << i;
    max_kl = std::max(max_kl, kl_logits(p, q, v));
    const int64_t top1 = argmax_row(ref, row);
    double second = -INFINITY;
    for (int64_t i = 0; i < v; ++i)
      if (i != top1) second = std::max<double>(second, p[i]);
    if (p[top1] - second > 0.05) {
      ++compared;
      agree += argmax_row(got, row) == top1;
    }
  }
  std::printf("%s: KL max %.2e, top-1 %lld/%lld\n", GetParam() ? "qwen2-moe" : "qwen3-moe", max_kl,
              (long long)agree, (long long)compared);
  EXPECT_LE(max_kl, kMaxKl);
  ASSERT_GT(compared, 0);
  EXPECT_GE(double(agree) / compared, kMinTop1);
}

TEST_P(GpuMoe, GraphDecodeEqualsEagerBatched) {
  auto config = [&](bool eager) {
    EngineConfig c;
    c.model = dir_.string();
    c.device = "cuda";
    c.max_model_len = 512;
    c.block_size = 16;
    c.max_num_batched_tokens = 256;
    c.max_num_seqs = 8;
    c.num_gpu_blocks = 512;
    c.enforce_eager = eager;
    return c;
  };
  std::vector<Prompt> prompts;
  for (int64_t n : {3, 17, 60, 129, 200}) prompts.push_back(Prompt(make_ids(n, n, 320)));
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 24;
  sp.ignore_eos = true;
  sp.logprobs = 2;
  const auto graphs = LLM(config(false)).generate(prompts, sp, false);
  const auto eager = LLM(config(true)).generate(prompts, sp, false);
  expect_same_tokens_up_to_ties(eager, graphs, kTieMargin, "graphs vs eager");
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuMoe, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Qwen2Moe" : "Qwen3Moe"; });

}  // namespace
}  // namespace longctx::testing
