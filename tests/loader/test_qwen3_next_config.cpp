// Qwen3-Next's config.json: the fixture's fields as parsed (layer types, linear-attention sizes,
// the shared-expert MoE, zero-centred norms, the output gate, partial rotary), the
// full_attention_interval rule when layer_types is absent, the weights a checkpoint must hold,
// and malformed linear-attention fields named in errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "loader/config_error.h"
#include "loader/weight_spec.h"
#include "longctx/core/error.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

using nlohmann::json;
using LA = LayerAttention;

json fixture_json() {
  std::ifstream f(testing::test_data_dir() + "/fixtures/tiny-qwen3-next/config.json");
  return json::parse(f);
}

std::string error_of(const json& j) { return testing::config_error_of(j); }

TEST(Qwen3NextConfig, FixtureParsesAsTransformersReadsIt) {
  const ModelConfig c = parse_model_config(fixture_json(), "tiny-qwen3-next");
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kLinear, LA::kLinear, LA::kLinear, LA::kFull}));
  EXPECT_EQ(c.linear.num_key_heads, 2);
  EXPECT_EQ(c.linear.num_value_heads, 4);
  EXPECT_EQ(c.linear.key_head_dim, 16);
  EXPECT_EQ(c.linear.value_head_dim, 16);
  EXPECT_EQ(c.linear.conv_kernel_dim, 4);
  EXPECT_TRUE(c.norm_plus_one);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.sandwich_norms);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 48);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
  // Linear layers hold linear_attn.* and no self_attn.*; q_proj emits q and its gate.
  const auto w = expected_weights(c);
  EXPECT_EQ(w.at("model.layers.0.linear_attn.in_proj_qkvz.weight"), (Shape{192, 64}));
  EXPECT_EQ(w.at("model.layers.0.linear_attn.conv1d.weight"), (Shape{128, 1, 4}));
  EXPECT_EQ(w.count("model.layers.0.self_attn.q_proj.weight"), 0u);
  EXPECT_EQ(w.at("model.layers.3.self_attn.q_proj.weight"), (Shape{256, 64}));
  EXPECT_EQ(w.count("model.layers.3.linear_attn.A_log"), 0u);
}

TEST(Qwen3NextConfig, FullAttentionIntervalWithoutLayerTypes) {
  json j = fixture_json();
  j.erase("layer_types");
  j["num_hidden_layers"] = 6;
  j["full_attention_interval"] = 3;
  const ModelConfig c = parse_model_config(j, "interval");
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kLinear, LA::kLinear, LA::kFull, LA::kLinear,
                                            LA::kLinear, LA::kFull}));
  j.erase("full_attention_interval");  // Qwen3NextConfig's default: 4
  j["num_hidden_layers"] = 8;
  EXPECT_EQ(parse_model_config(j, "default").layer_types[3], LA::kFull);
  EXPECT_EQ(parse_model_config(j, "default").layer_types[4], LA::kLinear);
  j["full_attention_interval"] = 0;
  EXPECT_NE(error_of(j).find("'full_attention_interval' must be in [1,"), std::string::npos)
      << error_of(j);
}

TEST(Qwen3NextConfig, MalformedLinearFieldsAreNamed) {
  json j = fixture_json();
  j["linear_num_value_heads"] = 3;  // not a multiple of 2 key heads
  EXPECT_NE(error_of(j).find("linear_num_value_heads (3) must be a multiple of "
                             "linear_num_key_heads (2)"),
            std::string::npos)
      << error_of(j);
  j = fixture_json();
  j["linear_conv_kernel_dim"] = 0;
  EXPECT_NE(error_of(j).find("'linear_conv_kernel_dim' must be in [1, 64]"), std::string::npos)
      << error_of(j);
  j = fixture_json();
  j["linear_key_head_dim"] = "sixteen";
  EXPECT_NE(error_of(j).find("'linear_key_head_dim' must be an integer"), std::string::npos)
      << error_of(j);
  j = fixture_json();
  j["linear_num_key_heads"] = -2;
  EXPECT_NE(error_of(j).find("'linear_num_key_heads' must be in [1,"), std::string::npos)
      << error_of(j);
}

}  // namespace
}  // namespace longctx
