// The RoPE-variant fixtures whose rotation follows each forward's length (tiny-llama-dynamic,
// tiny-phi3-longrope; made by tests/data/make_rope_fixtures.py on the GPU machine): logits within
// 1e-3 of transformers' and greedy continuations decoded a token at a time. Chunked prefill and
// one-token steps are not compared with one full forward here: longrope's table and dynamic
// NTK's base follow each forward's length, as in transformers. (tiny-qwen3-yarn runs with the
// other fixtures in test_fixture_models.cpp.)
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
    EXPECT_LE(max_logit_error(full_forward(*model, ref.input_ids), ref), 1e-3)
        << GetParam() << " length " << len;
  }
}

// One forward for the prompt, then a token per forward: each decode step picks longrope's table
// / dynamic NTK's base from its own length, cached keys keep theirs, as transformers' cache does.
TEST_P(RopeFixtures, GreedyMatchesTransformers) {
  auto model = load();
  for (int64_t len : {7, 515}) expect_greedy_matches(*model, GetParam(), len);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RopeFixtures,
                         ::testing::Values("tiny-llama-dynamic", "tiny-phi3-longrope"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
