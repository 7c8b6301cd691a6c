// Per-layer attention types from config.json: explicit `layer_types`, Mistral's `sliding_window`
// on every layer, Qwen2/Qwen3's `use_sliding_window` + `max_window_layers`, Gemma 3's
// `sliding_window_pattern`; the fixtures stay all full; unknown types are clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "loader/config_error.h"
#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

using nlohmann::json;
using LA = LayerAttention;

json config(const std::string& arch, int64_t layers = 4) {
  return {{"architectures", {arch}},     {"vocab_size", 64},
          {"hidden_size", 32},           {"intermediate_size", 64},
          {"num_hidden_layers", layers}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}};
}

std::string error_of(const json& j) { return testing::config_error_of(j); }

TEST(LayerTypes, FixturesAreAllFull) {
  for (const char* name : {"tiny-llama3", "tiny-qwen3", "tiny-qwen2"}) {
    const ModelConfig c =
        load_model_config(testing::test_data_dir() + "/fixtures/" + name + "/config.json");
    EXPECT_EQ(c.layer_types, std::vector<LA>(c.num_hidden_layers, LA::kFull)) << name;
    EXPECT_EQ(c.sliding_window, 0) << name;
  }
}

TEST(LayerTypes, MistralSlidesOnEveryLayerWhenSet) {
  json j = config("MistralForCausalLM");
  EXPECT_EQ(parse_model_config(j, "c").layer_types, std::vector<LA>(4, LA::kFull));
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse_model_config(j, "c").sliding_window, 0);
  j["max_position_embeddings"] = 32768;  // Mistral-7B-v0.1's
  j["sliding_window"] = 4096;
  const ModelConfig c = parse_model_config(j, "c");
  EXPECT_EQ(c.layer_types, std::vector<LA>(4, LA::kSliding));
  EXPECT_EQ(c.sliding_window, 4096);
  // A window as long as every position masks nothing: full attention.
  j["max_position_embeddings"] = 4096;
  EXPECT_EQ(parse_model_config(j, "c").layer_types, std::vector<LA>(4, LA::kFull));
}

TEST(LayerTypes, QwenSlidesOnlyWithUseSlidingWindowFromMaxWindowLayers) {
  for (const char* arch : {"Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    json j = config(arch);
    j["sliding_window"] = 32;
    j["max_window_layers"] = 2;
    j["use_sliding_window"] = false;
    EXPECT_EQ(parse_model_config(j, "c").layer_types, std::vector<LA>(4, LA::kFull)) << arch;
    EXPECT_EQ(parse_model_config(j, "c").sliding_window, 0);
    j["use_sliding_window"] = true;
    const ModelConfig c = parse_model_config(j, "c");
    EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kFull, LA::kFull, LA::kSliding, LA::kSliding}))
        << arch;
    EXPECT_EQ(c.sliding_window, 32);
  }
}

TEST(LayerTypes, ExplicitLayerTypesAndPatterns) {
  json j = config("MistralForCausalLM");
  j["sliding_window"] = 20;
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kSliding, LA::kFull, LA::kSliding, LA::kFull}));
  EXPECT_EQ(c.sliding_window, 20);
  EXPECT_EQ(c.layer_type(1), LA::kFull);
  // Gemma 3's rule: every Nth layer global.
  j = config("Qwen3ForCausalLM", 6);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 512;
  j["sliding_window_pattern"] = 3;
  c = parse_model_config(j, "c");
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kSliding, LA::kSliding, LA::kFull, LA::kSliding,
                                            LA::kSliding, LA::kFull}));
  // Llama has no sliding window: the field is ignored, as transformers ignores it.
  j = config("LlamaForCausalLM");
  j["sliding_window"] = 16;
  EXPECT_EQ(parse_model_config(j, "c").layer_types, std::vector<LA>(4, LA::kFull));
}

TEST(LayerTypes, ClearErrors) {
  json j = config("MistralForCausalLM");
  j["sliding_window"] = 20;
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention", "full_attention"};
  std::string e = error_of(j);
  EXPECT_NE(e.find("layer_types[1] is 'chunked_attention'"), std::string::npos) << e;
  EXPECT_NE(e.find("supported: full_attention, sliding_attention, linear_attention"),
            std::string::npos)
      << e;
  j["layer_types"] = {"full_attention"};
  e = error_of(j);
  EXPECT_NE(e.find("'layer_types' must be a list of num_hidden_layers (4)"), std::string::npos)
      << e;
  j["layer_types"] = {"full_attention", "linear_attention", "full_attention", "full_attention"};
  e = error_of(j);
  EXPECT_NE(e.find("linear_attention layers, which MistralForCausalLM does not have"),
            std::string::npos)
      << e;
  j["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention"};
  j["sliding_window"] = nullptr;
  e = error_of(j);
  EXPECT_NE(e.find("sliding_attention layers but no sliding window"), std::string::npos) << e;
  j.erase("layer_types");
  j["sliding_window"] = -3;
  e = error_of(j);
  EXPECT_NE(e.find("'sliding_window' must be in [1,"), std::string::npos) << e;
}

}  // namespace
}  // namespace longctx
