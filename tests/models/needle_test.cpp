// The needle model (models/needle, trained by tools/needle_model) against transformers: f32
// logits of a ~1K-token needle prompt and the greedy continuation (tests/data/needle).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

std::string needle_model_dir() { return test_data_dir() + "/../../models/needle"; }

struct NeedleReference {
  std::vector<int32_t> input_ids;
  std::vector<int64_t> logits_positions;
  Tensor logits;  // [logits_positions.size(), vocab] f32
  std::vector<int32_t> greedy_new_tokens;
  std::vector<double> greedy_margins;
};

NeedleReference load_reference() {
  const std::string dir = test_data_dir() + "/needle";
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << "missing " << dir << "/reference.json";
  nlohmann::json j = nlohmann::json::parse(f);
  NeedleReference r;
  r.input_ids = j.at("input_ids").get<std::vector<int32_t>>();
  r.logits_positions = j.at("logits_positions").get<std::vector<int64_t>>();
  r.logits = read_npy(dir + "/" + j.at("logits_file").get<std::string>());
  r.greedy_new_tokens = j.at("greedy_new_tokens").get<std::vector<int32_t>>();
  r.greedy_margins = j.at("greedy_margins").get<std::vector<double>>();
  return r;
}

std::unique_ptr<Model> load_needle_model() {
  auto ckpt = std::make_shared<Checkpoint>(load_checkpoint(needle_model_dir()));
  return create_model(std::move(ckpt));
}

}  // namespace

TEST(NeedleModel, ConfigIsTheCommittedShape) {
  auto model = load_needle_model();
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 2048);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e7);
}

TEST(NeedleModel, LogitsMatchTransformers1K) {
  auto model = load_needle_model();
  NeedleReference ref = load_reference();
  ASSERT_GT(ref.input_ids.size(), 900u);
  Tensor logits = full_forward(*model, ref.input_ids);
  const int64_t vocab = logits.size(1);
  ASSERT_EQ(vocab, 2048);
  ASSERT_EQ(ref.logits.size(0), int64_t(ref.logits_positions.size()));
  ASSERT_EQ(ref.logits.size(1), vocab);
  double max_err = 0;
  for (size_t r = 0; r < ref.logits_positions.size(); ++r) {
    const float* a = logits.data<float>() + ref.logits_positions[r] * vocab;
    const float* b = ref.logits.data<float>() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      double d = std::abs(double(a[i]) - double(b[i]));
      if (!(d <= max_err)) max_err = d;  // keeps NaN
    }
  }
  EXPECT_LE(max_err, 1e-3);
}

TEST(NeedleModel, GreedyTokensMatchTransformers) {
  auto model = load_needle_model();
  NeedleReference ref = load_reference();
  const int64_t len = static_cast<int64_t>(ref.input_ids.size());
  auto cache = model->make_cache(len + int64_t(ref.greedy_new_tokens.size()));
  Tensor logits = model->forward(ref.input_ids, iota_positions(0, len), *cache, true);
  for (size_t step = 0; step < ref.greedy_new_tokens.size(); ++step) {
    // Past a near tie, transformers and we may legitimately diverge: stop comparing there.
    if (ref.greedy_margins[step] < 1e-3) break;
    const int32_t token = argmax_row(logits, 0);
    ASSERT_EQ(token, ref.greedy_new_tokens[step]) << "step " << step;
    std::vector<int32_t> one = {token};
    std::vector<int64_t> pos = {len + int64_t(step)};
    logits = model->forward(one, pos, *cache, true);
  }
}
