// The RoPE-variant fixtures made by tests/data/make_rope_fixtures.py on the GPU machine
// (tiny-qwen3-yarn, tiny-llama-dynamic, tiny-phi3-longrope): logits against transformers' within
// 1e-3 and greedy continuations decoded a token at a time. Their reference keeps inv_freq in
// exact float32 (never cast to bf16; reference.json says so), so the models are built with
// rope_inv_freq_dtype F32. (Chunked prefill and one-token steps are not compared with one full
// forward here: longrope's table and dynamic NTK's base follow each forward's length, as in
// transformers.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

class RopeFixtures : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Model> load() {
    ModelBuildOptions o;
    o.rope_inv_freq_dtype = DType::kF32;
    return load_fixture_model(GetParam(), o);
  }
};

TEST_P(RopeFixtures, LogitsMatchTransformers) {
  auto model = load();
  for (int64_t len : {1, 7, 64, 515, 2048}) {
    ReferenceCase ref = reference_case(GetParam(), len);
    Tensor logits = full_forward(*model, ref.input_ids);
    const int64_t vocab = logits.size(1);
    ASSERT_EQ(ref.logits.size(1), vocab);
    double m = 0;
    for (size_t r = 0; r < ref.logits_positions.size(); ++r) {
      const float* a = logits.data<float>() + ref.logits_positions[r] * vocab;
      const float* b = ref.logits.data<float>() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i) {
        const double d = std::abs(double(a[i]) - double(b[i]));
        if (!(d <= m)) m = d;  // keeps NaN
      }
    }
    EXPECT_LE(m, 1e-3) << GetParam() << " length " << len;
  }
}

// One forward for the prompt, then a token per forward: each decode step picks longrope's table
// / dynamic NTK's base from its own length, cached keys keep theirs, as transformers' cache does.
TEST_P(RopeFixtures, GreedyMatchesTransformers) {
  auto model = load();
  for (int64_t len : {7, 515}) {
    ReferenceCase ref = reference_case(GetParam(), len);
    ASSERT_EQ(ref.greedy_new_tokens.size(), 24u);
    auto cache = std::make_unique<KVCache>(model->config(), len + 24);
    Tensor logits = reference_forward(*model, ref.input_ids, iota_positions(0, len), *cache, true);
    for (size_t step = 0; step < ref.greedy_new_tokens.size(); ++step) {
      if (ref.greedy_margins[step] < 1e-3) break;  // past a near tie either token is right
      const int32_t token = argmax_row(logits, 0);
      ASSERT_EQ(token, ref.greedy_new_tokens[step])
          << GetParam() << " len " << len << " step " << step;
      std::vector<int32_t> one = {token};
      std::vector<int64_t> pos = {len + int64_t(step)};
      logits = reference_forward(*model, one, pos, *cache, true);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RopeFixtures,
                         ::testing::Values("tiny-qwen3-yarn", "tiny-llama-dynamic",
                                           "tiny-phi3-longrope"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
