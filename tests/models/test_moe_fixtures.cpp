// The transformers fixtures of the MoE families (tests/data/make_family_fixtures.py, transformers
// 5.17): tiny-qwen3-moe (8 experts, top 2, norm_topk_prob, layer 1 dense via mlp_only_layers,
// config.json naming the expert count num_local_experts) and tiny-qwen2-moe (8 experts, top 2,
// no renormalization, a shared expert with its sigmoid gate, q/k/v biases), both with per-expert
// tensors in bf16. Logits within 1e-3 of transformers' (float32 from the upcast weights, exact
// float32 rope inv_freq: reference.json's rope_inv_freq_dtype) at 1 / 7 / 64 / 515 / 2048 tokens,
// and transformers' 24 greedy tokens after the 7- and 515-token prompts, up to a near tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "longctx/engine/reference_forward.h"
#include "model_test_util.h"

namespace longctx::testing {
namespace {

class MoeFixture : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Model> load() {
    std::ifstream f(fixture_dir(GetParam()) + "/reference.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("rope_inv_freq_dtype").get<std::string>(), "float32");
    ModelBuildOptions o;
    o.rope_inv_freq_dtype = DType::kF32;
    return load_fixture_model(GetParam(), o);
  }
};

TEST_P(MoeFixture, LogitsMatchTransformers) {
  auto model = load();
  ASSERT_GT(model->config().moe.num_experts, 0);
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
        const double d = std::fabs(double(a[i]) - double(b[i]));
        if (!(d <= m)) m = d;  // keeps NaN
      }
    }
    std::printf("%s[%lld]: max |dlogit| %.2e\n", GetParam().c_str(), (long long)len, m);
    EXPECT_LE(m, 1e-3) << GetParam() << " length " << len;
  }
}

TEST_P(MoeFixture, GreedyTokensMatchTransformers) {
  auto model = load();
  for (int64_t len : {7, 515}) {
    ReferenceCase ref = reference_case(GetParam(), len);
    ASSERT_EQ(ref.greedy_new_tokens.size(), 24u);
    auto cache = std::make_unique<KVCache>(model->config(), len + 24);
    Tensor logits = reference_forward(*model, ref.input_ids, iota_positions(0, len), *cache, true);
    size_t compared = 0;
    for (size_t step = 0; step < ref.greedy_new_tokens.size(); ++step) {
      if (ref.greedy_margins[step] < 1e-3) break;  // past a near tie the order means nothing
      const int32_t token = argmax_row(logits, 0);
      ASSERT_EQ(token, ref.greedy_new_tokens[step])
          << GetParam() << " len " << len << " step " << step;
      ++compared;
      std::vector<int32_t> one = {token};
      std::vector<int64_t> pos = {len + int64_t(step)};
      logits = reference_forward(*model, one, pos, *cache, true);
    }
    EXPECT_GE(compared, 8u) << "too few comparable steps to mean anything";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MoeFixture,
                         ::testing::Values("tiny-qwen3-moe", "tiny-qwen2-moe"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace longctx::testing
