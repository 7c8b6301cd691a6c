// The rope parameters of config.json: yarn, longrope, dynamic and partial_rotary_factor parse as
// transformers reads them; a bad field or an unsupported type is an Error naming the field, the
// value and what is supported.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

using namespace longctx;
using nlohmann::json;

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// Qwen3-8B's config.json (the fields the loader reads) with `rope_scaling` and rope_theta at the
// top level, as Qwen ships it.
json qwen3_8b() {
  return json{{"architectures", {"Qwen3ForCausalLM"}},
              {"model_type", "qwen3"},
              {"vocab_size", 151936},
              {"hidden_size", 4096},
              {"intermediate_size", 12288},
              {"num_hidden_layers", 36},
              {"num_attention_heads", 32},
              {"num_key_value_heads", 8},
              {"head_dim", 128},
              {"max_position_embeddings", 40960},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"rope_scaling", nullptr},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"}};
}

// A Phi-3-mini-128k-like config on the Llama architecture (the loader parses rope the same way for
// every architecture): head_dim 96, original_max_position_embeddings at the top level.
json phi3_like() {
  json j = qwen3_8b();
  j["architectures"] = {"LlamaForCausalLM"};
  j["hidden_size"] = 3072;
  j["num_attention_heads"] = 32;
  j["num_key_value_heads"] = 32;
  j.erase("head_dim");
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", std::vector<double>(48, 1.05)},
                       {"long_factor", std::vector<double>(48, 2.5)}};
  return j;
}

std::string config_error(const json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    EXPECT_NE(e.code(), ErrorCode::kInternal);
    return e.what();
  }
  return "";
}

}  // namespace

TEST(RopeConfig, QwenYarnRecipeLoads) {
  json j = qwen3_8b();
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ModelConfig c = parse_model_config(j, "qwen3");
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_EQ(c.rope.factor, 4.0);  // the explicit factor, not 40960 / 32768
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32768);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.beta_fast, 32);
  EXPECT_EQ(c.rope.beta_slow, 1);
  EXPECT_TRUE(c.rope.truncate);
  EXPECT_TRUE(std::isnan(c.rope.attention_factor));
  EXPECT_EQ(c.rope.partial_rotary_factor, 1.0);
  EXPECT_STREQ(rope_type_name(c.rope.type), "yarn");
  // The context reaches factor x original, as vLLM derives it.
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.max_positions(), 131072);
  // transformers 5's rope_parameters spelling, every option set.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 150000.0},
                          {"factor", 32.0},      {"original_max_position_embeddings", 4096},
                          {"beta_fast", 16},     {"beta_slow", 2.0},
                          {"mscale", 0.707},     {"mscale_all_dim", 1.0},
                          {"truncate", false},   {"attention_factor", 1.2}};
  c = parse_model_config(j, "x");
  EXPECT_EQ(c.rope.theta, 150000.0);
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.beta_fast, 16);
  EXPECT_EQ(c.rope.beta_slow, 2);
  EXPECT_EQ(c.rope.mscale, 0.707);
  EXPECT_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_FALSE(c.rope.truncate);
  EXPECT_EQ(c.rope.attention_factor, 1.2);
  // Without original_max_position_embeddings: max_position_embeddings.
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(parse_model_config(j, "x").rope.original_max_position_embeddings, 40960);
}

TEST(RopeConfig, YarnErrors) {
  json j = qwen3_8b();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 32768}};
  EXPECT_CONTAINS(config_error(j), "rope type 'yarn' needs field 'factor'");
  j["rope_scaling"]["factor"] = "four";
  EXPECT_CONTAINS(config_error(j), "field 'factor' must be a number, got \"four\"");
  j["rope_scaling"]["factor"] = -4.0;
  EXPECT_CONTAINS(config_error(j), "field 'factor' must be a positive finite number, got -4");
  j["rope_scaling"]["factor"] = 4.0;
  j["rope_scaling"]["original_max_position_embeddings"] = 0;
  EXPECT_CONTAINS(config_error(j), "field 'original_max_position_embeddings' must be in");
  j["rope_scaling"]["original_max_position_embeddings"] = 32768;
  j["rope_scaling"]["truncate"] = "yes";
  EXPECT_CONTAINS(config_error(j), "field 'truncate' must be true or false");
  j["rope_scaling"].erase("truncate");
  j["rope_scaling"]["attention_factor"] = 0.0;
  EXPECT_CONTAINS(config_error(j), "field 'attention_factor' must be a positive finite number");
  j["rope_scaling"].erase("attention_factor");
  EXPECT_EQ(config_error(j), "");
}

TEST(RopeConfig, LongropeFromTopLevelOriginal) {
  ModelConfig c = parse_model_config(phi3_like(), "phi3");
  EXPECT_EQ(c.rope.type, RopeType::kLongrope);  // "type" read when "rope_type" is absent
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.factor, 32.0);  // max_position_embeddings / original
  ASSERT_EQ(c.rope.short_factor.size(), 48u);
  EXPECT_EQ(c.rope.short_factor[0], 1.05);
  EXPECT_EQ(c.rope.long_factor[47], 2.5);
  EXPECT_EQ(c.max_positions(), 131072);
  // original_max_position_embeddings inside the rope parameters wins.
  json j = phi3_like();
  j["rope_scaling"]["original_max_position_embeddings"] = 8192;
  c = parse_model_config(j, "phi3");
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.rope.factor, 16.0);
  // Neither: the switch is max_position_embeddings and the factor the parameters' own.
  j = phi3_like();
  j.erase("original_max_position_embeddings");
  j["rope_scaling"]["factor"] = 8.0;
  c = parse_model_config(j, "phi3");
  EXPECT_EQ(c.rope.original_max_position_embeddings, 131072);
  EXPECT_EQ(c.rope.factor, 8.0);
  // Phi-3's old name.
  j = phi3_like();
  j["rope_scaling"]["type"] = "su";
  EXPECT_EQ(parse_model_config(j, "phi3").rope.type, RopeType::kLongrope);
}

TEST(RopeConfig, LongropeErrors) {
  json j = phi3_like();
  j["rope_scaling"].erase("long_factor");
  EXPECT_CONTAINS(config_error(j),
                  "rope type 'longrope' needs field 'long_factor' (a list of 48 numbers)");
  j = phi3_like();
  j["rope_scaling"]["short_factor"] = std::vector<double>(47, 1.0);
  EXPECT_CONTAINS(config_error(j),
                  "field 'short_factor' must be a list of 48 numbers (rotary_dim / 2), got [");
  j["rope_scaling"]["short_factor"] = std::vector<double>(48, 1.0);
  j["rope_scaling"]["short_factor"][3] = "x";
  EXPECT_CONTAINS(config_error(j),
                  "field 'short_factor' must hold positive finite numbers, got \"x\"");
  j["rope_scaling"]["short_factor"][3] = 0.0;
  EXPECT_CONTAINS(config_error(j), "field 'short_factor' must hold positive finite numbers, got 0");
  // With a partial rotary factor the lists cover rotary_dim / 2 (Phi-4-mini: 0.75 of 128 -> 48).
  j = phi3_like();
  j["hidden_size"] = 4096;  // head_dim 128
  j["partial_rotary_factor"] = 0.75;
  ModelConfig c = parse_model_config(j, "phi4");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope.partial_rotary_factor, 0.75);
  j["partial_rotary_factor"] = 1.0;
  EXPECT_CONTAINS(config_error(j), "field 'short_factor' must be a list of 64 numbers");
}

TEST(RopeConfig, DynamicAndPartial) {
  json j = qwen3_8b();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.rope.type, RopeType::kDynamic);
  EXPECT_EQ(c.rope.factor, 2.0);
  EXPECT_EQ(c.rope.max_position_embeddings, 40960);
  EXPECT_EQ(c.max_positions(), 81920);
  j["rope_scaling"].erase("factor");
  EXPECT_CONTAINS(config_error(j), "rope type 'dynamic' needs field 'factor'");

  // partial_rotary_factor at the top level (transformers 4) or in rope_parameters (5).
  j = qwen3_8b();
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse_model_config(j, "x").rope.partial_rotary_factor, 0.5);
  j.erase("partial_rotary_factor");
  j.erase("rope_scaling");
  j["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.25}};
  c = parse_model_config(j, "x");
  EXPECT_EQ(c.rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rope.theta, 1e4);
  j["rope_parameters"]["partial_rotary_factor"] = 0.34;  // int(128 * 0.34) = 43, odd
  EXPECT_CONTAINS(config_error(j),
                  "field 'partial_rotary_factor' 0.34 must be in (0, 1] and give "
                  "an even rotary_dim >= 2 (int(head_dim 128 * factor) = 43)");
  j["rope_parameters"]["partial_rotary_factor"] = 1.5;
  EXPECT_CONTAINS(config_error(j), "field 'partial_rotary_factor' 1.5 must be in (0, 1]");
  j["rope_parameters"]["partial_rotary_factor"] = "half";
  EXPECT_CONTAINS(config_error(j), "field 'partial_rotary_factor' must be a number");
}

TEST(RopeConfig, UnsupportedTypeListsSupported) {
  json j = qwen3_8b();
  j["rope_scaling"] = {{"rope_type", "mrope"}, {"factor", 2.0}};
  const std::string e = config_error(j);
  EXPECT_CONTAINS(e, "config.json rope_scaling: unsupported rope type 'mrope'");
  EXPECT_CONTAINS(e, "(supported: default, linear, llama3, yarn, longrope, dynamic)");
  // Kept as before: default, linear, llama3.
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse_model_config(j, "x").rope.type, RopeType::kLinear);
  EXPECT_EQ(parse_model_config(j, "x").max_positions(), 40960);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse_model_config(j, "x").rope.type, RopeType::kDefault);
}

TEST(RopeConfig, DummyYarnPreset) {
  ModelConfig c = dummy_preset_config("qwen3-8b-yarn-128k");
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32768);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.max_positions(), 131072);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.hidden_size, 4096);
}
