// The tiny fixture models against transformers' logits and greedy continuations, and
// incremental decoding and chunked prefill against one full forward: tiny-llama3, tiny-qwen3,
// tiny-qwen2; tiny-gemma3 and tiny-mistral-sw with sliding windows of 48 keys (the 64- to
// 2048-token cases cross them); the MoE fixtures tiny-qwen3-moe (8 experts, top 2,
// norm_topk_prob, layer 1 dense, num_local_experts) and tiny-qwen2-moe (no renormalization, a
// shared expert with its sigmoid gate); tiny-qwen3-yarn (yarn factor 4 over 64 positions);
// tiny-qwen3-next (three Gated DeltaNet layers, their states carried by the KV cache across the
// incremental and chunked cases, then a gated full-attention layer with partial RoPE);
// tiny-qwen3.5 (Qwen3_5ForCausalLM: those layers with the projections stored apart and dense
// MLPs), tiny-qwen3.5-moe (Qwen3_5MoeForCausalLM) and tiny-qwen3.5-vl (the text model of
// Qwen3_5ForConditionalGeneration, beside a vision tower).
// (tiny-llama-dynamic and tiny-phi3-longrope: test_rope_fixtures.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "longctx/engine/reference_forward.h"
#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

class FixtureModel : public ::testing::TestWithParam<std::string> {};

void expect_logits_match(const std::string& model_name, int64_t len) {
  auto model = load_fixture_model(model_name);
  ReferenceCase ref = reference_case(model_name, len);
  Tensor logits = full_forward(*model, ref.input_ids);
  ASSERT_EQ(logits.size(0), len);
  ASSERT_EQ(logits.size(1), model->config().vocab_size);
  EXPECT_LE(max_logit_error(logits, ref), 1e-3) << model_name << " length " << len;
}

// How far a prefill split into pieces may move the logits from one forward. Attention alone
// only reorders a softmax's sums: 1e-4. The gated delta rule's chunked form rounds differently
// wherever a piece moves its chunk boundaries (and decode rows run the recurrent form): on
// tiny-qwen3-next, with logits up to 20 in magnitude, the pieces measured 3.0e-4 (incremental)
// and 9.4e-4 (chunked) from one forward, the same order as one forward's distance from
// transformers (1.0e-4 to 6.9e-4, whichever form runs), while a state that is not carried over
// moves them by whole units.
double split_tolerance(const Model& model) {
  const ModelConfig& c = model.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.layer_type(l) == LayerAttention::kLinear) return 2e-3;
  return 1e-4;
}

// Prefill n - k tokens, then k single-token steps; every row must equal the full forward's.
void expect_incremental_matches_full(Model& model, const std::vector<int32_t>& ids, int64_t k) {
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor full = full_forward(model, ids);
  const int64_t vocab = full.size(1);
  auto cache = std::make_unique<KVCache>(model.config(), n);
  std::vector<int32_t> head(ids.begin(), ids.end() - k);
  Tensor prefill = reference_forward(model, head, iota_positions(0, n - k), *cache);
  double m = 0;
  for (int64_t i = 0; i < (n - k) * vocab; ++i)
    m = std::max(m, std::abs(double(prefill.data<float>()[i]) - full.data<float>()[i]));
  for (int64_t s = n - k; s < n; ++s) {
    std::vector<int32_t> one = {ids[s]};
    std::vector<int64_t> pos = {s};
    Tensor step = reference_forward(model, one, pos, *cache);
    ASSERT_EQ(step.size(0), 1);
    for (int64_t i = 0; i < vocab; ++i)
      m = std::max(m, std::abs(double(step.data<float>()[i]) - full.data<float>()[s * vocab + i]));
  }
  EXPECT_EQ(cache->length(), n);
  EXPECT_LE(m, split_tolerance(model)) << "n=" << n << " k=" << k;
}

// A fixture's name as a test name ("tiny-qwen3.5" -> "tiny_qwen3_5").
std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (ch == '-' || ch == '.') ch = '_';
  return s;
}

}  // namespace

TEST_P(FixtureModel, LogitsMatchTransformersShortCases) {
  for (int64_t len : {1, 7, 64, 515}) expect_logits_match(GetParam(), len);
}

TEST_P(FixtureModel, LogitsMatchTransformers2048) { expect_logits_match(GetParam(), 2048); }

TEST_P(FixtureModel, IncrementalDecodeEqualsFullForward) {
  auto model = load_fixture_model(GetParam());
  expect_incremental_matches_full(*model, reference_case(GetParam(), 64).input_ids, 5);
  expect_incremental_matches_full(*model, reference_case(GetParam(), 515).input_ids, 5);
}

TEST_P(FixtureModel, ChunkedPrefillEqualsFullForward) {
  // Three uneven chunks over a cached prefix, compared row by row with one forward.
  auto model = load_fixture_model(GetParam());
  std::vector<int32_t> ids = reference_case(GetParam(), 515).input_ids;
  Tensor full = full_forward(*model, ids);
  const int64_t vocab = full.size(1);
  auto cache = std::make_unique<KVCache>(model->config(), 515);
  double m = 0;
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 200}, {200, 333}, {333, 515}}) {
    std::vector<int32_t> chunk(ids.begin() + b, ids.begin() + e);
    Tensor out = reference_forward(*model, chunk, iota_positions(b, e - b), *cache);
    for (int64_t i = 0; i < (e - b) * vocab; ++i)
      m = std::max(m, std::abs(double(out.data<float>()[i]) - full.data<float>()[b * vocab + i]));
  }
  EXPECT_LE(m, split_tolerance(*model));
}

TEST_P(FixtureModel, GreedyTokensMatchTransformers) {
  auto model = load_fixture_model(GetParam());
  for (int64_t len : {7, 515}) expect_greedy_matches(*model, GetParam(), len);
}

TEST_P(FixtureModel, LastOnlyIsTheLastRow) {
  auto model = load_fixture_model(GetParam());
  std::vector<int32_t> ids = reference_case(GetParam(), 64).input_ids;
  Tensor full = full_forward(*model, ids);
  auto cache = std::make_unique<KVCache>(model->config(), 64);
  Tensor last = reference_forward(*model, ids, iota_positions(0, 64), *cache, true);
  ASSERT_EQ(last.shape(), (Shape{1, full.size(1)}));
  for (int64_t i = 0; i < full.size(1); ++i)
    EXPECT_EQ(last.data<float>()[i], full.data<float>()[63 * full.size(1) + i]);
}

class FixtureModelStates : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModelStates, PrefillInChunksOfEverySizeEqualsOneForward) {
  // Pieces of 1 (every step a decode row: the recurrent form), 5 and 17 (odd, across the chunked
  // form's chunks of 64), 64 and 100, each continuing the states the previous piece left.
  auto model = load_fixture_model(GetParam());
  std::vector<int32_t> ids = reference_case(GetParam(), 515).input_ids;
  ids.resize(160);
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor full = full_forward(*model, ids);
  const int64_t vocab = full.size(1);
  for (int64_t piece : {1, 5, 17, 64, 100}) {
    auto cache = std::make_unique<KVCache>(model->config(), n);
    double m = 0;
    for (int64_t b = 0; b < n; b += piece) {
      const int64_t e = std::min(n, b + piece);
      std::vector<int32_t> chunk(ids.begin() + b, ids.begin() + e);
      Tensor out = reference_forward(*model, chunk, iota_positions(b, e - b), *cache);
      for (int64_t i = 0; i < (e - b) * vocab; ++i)
        m = std::max(m, std::abs(double(out.data<float>()[i]) - full.data<float>()[b * vocab + i]));
    }
    EXPECT_LE(m, split_tolerance(*model)) << "pieces of " << piece;
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrid, FixtureModelStates,
                         ::testing::Values("tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-moe"),
                         fixture_test_name);

TEST(FixtureModelRope, ExactInvFreqIsNotWhatTheFixturesUsed) {
  // The fixtures were made by transformers from a model loaded at bf16 and upcast, so its rope
  // inv_freq was rounded to bf16. With exact float32 inv_freq the 515-token logits move by far
  // more than the tolerance: the default (checkpoint dtype) is the one that matches.
  ReferenceCase ref = reference_case("tiny-llama3", 515);
  ModelBuildOptions exact;
  exact.rope_inv_freq_dtype = DType::kF32;
  auto model = load_fixture_model("tiny-llama3", exact);
  EXPECT_GT(max_logit_error(full_forward(*model, ref.input_ids), ref), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Tiny, FixtureModel,
                         ::testing::Values("tiny-llama3", "tiny-qwen3", "tiny-qwen2", "tiny-gemma3",
                                           "tiny-mistral-sw", "tiny-qwen3-moe", "tiny-qwen2-moe",
                                           "tiny-qwen3-yarn", "tiny-qwen3-next", "tiny-qwen3.5",
                                           "tiny-qwen3.5-moe", "tiny-qwen3.5-vl"),
                         fixture_test_name);
