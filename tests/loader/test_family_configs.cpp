// The 2025 families' configs as their checkpoints spell them (Gemma 3 as Google publishes it and
// as transformers 5 writes it, Phi-3's fused weights, multimodal prefixes), and the errors for
// what is not supported.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "loader/config_error.h"
#include "loader/weight_spec.h"
#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

using nlohmann::json;
using LA = LayerAttention;

std::string error_of(const json& j) { return testing::config_error_of(j); }

TEST(Gemma3Config, GooglesPublishedConfigTakesGemma3TextConfigDefaults) {
  // gemma-3-12b-it's config.json names 8 text fields; everything else is a default.
  const ModelConfig c = dummy_preset_config("gemma-3-12b");
  EXPECT_EQ(c.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.head_dim, 256);  // not hidden / heads = 240
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm && c.norm_plus_one && c.sandwich_norms);
  EXPECT_EQ(c.hidden_act, HiddenAct::kGeluTanh);
  EXPECT_DOUBLE_EQ(c.embed_scale, std::sqrt(3840.0));
  EXPECT_EQ(c.sliding_window, 1024);
  ASSERT_EQ(c.layer_types.size(), 48u);
  for (int64_t i = 0; i < 48; ++i)
    EXPECT_EQ(c.layer_types[i], (i + 1) % 6 == 0 ? LA::kFull : LA::kSliding) << i;
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.theta, 1e6);
  ASSERT_TRUE(c.has_local_rope);
  EXPECT_EQ(c.local_rope.type, RopeType::kDefault);
  EXPECT_EQ(c.local_rope.theta, 1e4);
  EXPECT_EQ(c.dtype, DType::kBF16);  // the top level's torch_dtype
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
}

TEST(Gemma3Config, Transformers5RopeParametersByLayerType) {
  json j = {{"architectures", {"Gemma3ForCausalLM"}},
            {"hidden_size", 64},
            {"intermediate_size", 128},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"head_dim", 32},
            {"sliding_window", 48},
            {"layer_types",
             {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
            {"rope_parameters",
             {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}}}};
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kSliding, LA::kFull, LA::kSliding, LA::kFull}));
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.local_rope.theta, 1e4);
  EXPECT_EQ(c.vocab_size, 262208);  // a default
  // The sliding layers' rope may be scaled too: it is parsed as any rope.
  j["rope_parameters"]["sliding_attention"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  EXPECT_EQ(parse_model_config(j, "c").local_rope.type, RopeType::kYarn);
  j["rope_parameters"]["sliding_attention"] = {{"rope_type", "ntk-by-parts"}};
  EXPECT_NE(error_of(j).find("rope_parameters.sliding_attention"), std::string::npos);
}

TEST(Gemma3Config, UnsupportedFieldsAreNamed) {
  json j = {{"architectures", {"Gemma3ForCausalLM"}}, {"num_hidden_layers", 2}};
  EXPECT_EQ(error_of(j), "");
  j["final_logit_softcapping"] = 30.0;
  EXPECT_NE(error_of(j).find("'final_logit_softcapping'"), std::string::npos) << error_of(j);
  j.erase("final_logit_softcapping");
  j["hidden_activation"] = "relu";
  EXPECT_NE(error_of(j).find("'hidden_activation' is 'relu'"), std::string::npos) << error_of(j);
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["use_bidirectional_attention"] = true;
  EXPECT_NE(error_of(j).find("'use_bidirectional_attention'"), std::string::npos) << error_of(j);
  json m = {{"architectures", {"Gemma3ForConditionalGeneration"}}};
  EXPECT_NE(error_of(m).find("'text_config'"), std::string::npos) << error_of(m);
  json l = {{"architectures", {"LlamaForCausalLM"}},
            {"vocab_size", 8},
            {"hidden_size", 8},
            {"intermediate_size", 8},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"hidden_act", "gelu"}};
  EXPECT_NE(error_of(l).find("'hidden_act' is 'gelu'"), std::string::npos) << error_of(l);
}

TEST(SlidingWindow, AWindowPastEveryPositionIsFullAttention) {
  // Phi-4-mini: sliding_window 262144 over 131072 positions masks nothing.
  json j = {{"architectures", {"Phi3ForCausalLM"}},
            {"vocab_size", 8},
            {"hidden_size", 8},
            {"intermediate_size", 8},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 2},
            {"max_position_embeddings", 131072},
            {"sliding_window", 262144}};
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kFull, LA::kFull}));
  j["sliding_window"] = 2047;  // Phi-3-mini-4k's
  c = parse_model_config(j, "c");
  EXPECT_EQ(c.sliding_window, 2047);
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kSliding, LA::kSliding}));
}

// A WeightStore of f32 tensors filled with their element index + offset.
Tensor iota(const Shape& shape, float offset) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = offset + float(i);
  return t;
}

TEST(CanonicalWeights, Phi3FusedTensorsSplitIntoViewsOfTheSameBytes) {
  ModelConfig c = dummy_preset_config("tiny-llama");
  c.architecture = "Phi3ForCausalLM";
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  WeightStore raw;
  Tensor qkv = iota({q + 2 * kv, h}, 0), gate_up = iota({2 * inter, h}, 0.5f);
  raw.add("model.layers.0.self_attn.qkv_proj.weight", qkv);
  raw.add("model.layers.0.mlp.gate_up_proj.weight", gate_up);
  raw.add("model.norm.weight", iota({h}, 0));
  const WeightStore w = canonical_weights(raw, c);
  EXPECT_EQ(w.names().size(), 6u);
  const Tensor& k = w.get("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.shape(), (Shape{kv, h}));
  EXPECT_EQ(k.data_ptr(), qkv.data<float>() + q * h);  // a view, no copy
  EXPECT_EQ(w.get("model.layers.0.self_attn.v_proj.weight").data<float>()[0], float((q + kv) * h));
  EXPECT_EQ(w.get("model.layers.0.mlp.up_proj.weight").data<float>()[0], 0.5f + float(inter * h));
  EXPECT_EQ(w.get("model.layers.0.mlp.gate_proj.weight").shape(), (Shape{inter, h}));

  WeightStore bad;
  bad.add("model.layers.3.self_attn.qkv_proj.weight", iota({q + kv, h}, 0));
  try {
    canonical_weights(bad, c);
    FAIL() << "a qkv_proj without v rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.3.self_attn.qkv_proj.weight"),
              std::string::npos)
        << e.what();
  }
}

TEST(CanonicalWeights, MultimodalTextModelPrefixes) {
  const ModelConfig c = dummy_preset_config("tiny-llama");
  WeightStore raw;
  raw.add("model.language_model.embed_tokens.weight", iota({2, 2}, 0));
  raw.add("language_model.model.layers.0.input_layernorm.weight", iota({2}, 0));
  raw.add("language_model.lm_head.weight", iota({2, 2}, 0));
  raw.add("model.vision_tower.x.weight", iota({2}, 0));  // left for is_ignorable_weight
  const WeightStore w = canonical_weights(raw, c);
  EXPECT_TRUE(w.has("model.embed_tokens.weight"));
  EXPECT_TRUE(w.has("model.layers.0.input_layernorm.weight"));
  EXPECT_TRUE(w.has("lm_head.weight"));
  ModelConfig g = dummy_preset_config("gemma-3-12b");
  EXPECT_TRUE(is_ignorable_weight("model.vision_tower.x.weight", g));
  EXPECT_TRUE(is_ignorable_weight("multi_modal_projector.mm_input_projection_weight", g));
  EXPECT_FALSE(is_ignorable_weight("model.vision_tower.x.weight", c));
}

}  // namespace
}  // namespace longctx
