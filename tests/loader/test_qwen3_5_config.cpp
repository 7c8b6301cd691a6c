// Qwen3.5's config.json as transformers reads it: the presets of the Hub's Qwen3.5-27B (dense)
// and Qwen3.5-35B-A3B (MoE) text configs nested in their multimodal wrappers, the text config
// classes' defaults (head_dim 256, a quarter rotated), the fields the classes delete (the dense
// model's MoE fields, the MoE model's norm_topk_prob / decoder_sparse_step / mlp_only_layers),
// the multimodal rope keys, the split projections' weight names, and the tensors the text model
// leaves unloaded.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loader/config_error.h"
#include "loader/weight_spec.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

namespace longctx {
namespace {

using nlohmann::json;
using LA = LayerAttention;

// A small Qwen3_5TextConfig file: what the fixture script's config writes, minus what the
// tests vary.
json tiny_text(const char* arch = "Qwen3_5ForCausalLM") {
  return {{"architectures", {arch}},
          {"vocab_size", 512},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 32},
          {"dtype", "bfloat16"},
          {"linear_num_key_heads", 2},
          {"linear_num_value_heads", 4},
          {"linear_key_head_dim", 16},
          {"linear_value_head_dim", 16},
          {"rope_parameters",
           {{"rope_type", "default"},
            {"rope_theta", 10000.0},
            {"partial_rotary_factor", 0.25},
            {"mrope_section", {2, 1, 1}},
            {"mrope_interleaved", true}}}};
}

TEST(Qwen3_5Config, DensePresetIsQwen3_5_27B) {
  const ModelConfig c = dummy_preset_config("qwen3.5-27b");
  EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.num_hidden_layers, 64);
  EXPECT_EQ(c.num_attention_heads, 24);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.linear.num_key_heads, 16);
  EXPECT_EQ(c.linear.num_value_heads, 48);
  EXPECT_EQ(c.linear.projections, LinearProjLayout::kSplit);
  EXPECT_EQ(c.moe.num_experts, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_EQ(c.layer_type(2), LA::kLinear);
  EXPECT_EQ(c.layer_type(3), LA::kFull);
  EXPECT_EQ(c.layer_type(63), LA::kFull);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e7);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_TRUE(c.norm_plus_one && c.attn_output_gate && c.qk_norm);
  const auto w = expected_weights(c);
  EXPECT_EQ(w.at("model.layers.0.linear_attn.in_proj_qkv.weight"), (Shape{2 * 2048 + 6144, 5120}));
  EXPECT_EQ(w.at("model.layers.0.linear_attn.in_proj_z.weight"), (Shape{6144, 5120}));
  EXPECT_EQ(w.at("model.layers.0.linear_attn.in_proj_b.weight"), (Shape{48, 5120}));
  EXPECT_EQ(w.at("model.layers.0.linear_attn.in_proj_a.weight"), (Shape{48, 5120}));
  EXPECT_EQ(w.count("model.layers.0.linear_attn.in_proj_qkvz.weight"), 0u);
  EXPECT_EQ(w.at("model.layers.0.mlp.gate_proj.weight"), (Shape{17408, 5120}));
  EXPECT_EQ(w.at("model.layers.3.self_attn.q_proj.weight"), (Shape{2 * 24 * 256, 5120}));
}

TEST(Qwen3_5Config, MoePresetIsQwen3_5_35B_A3B) {
  const ModelConfig c = dummy_preset_config("qwen3.5-35b-a3b");
  EXPECT_EQ(c.architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.linear.num_value_heads, 32);
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe.moe_intermediate_size, 512);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 512);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  // No intermediate_size in Qwen3_5MoeTextConfig: the experts' width stands in (no layer is
  // dense).
  EXPECT_EQ(c.intermediate_size, 512);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
  const auto w = expected_weights(c);
  EXPECT_EQ(w.count("model.layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(w.at("model.layers.0.mlp.shared_expert_gate.weight"), (Shape{1, 2048}));
}

TEST(Qwen3_5Config, TextConfigClassDefaults) {
  // Qwen3_5TextConfig's: head_dim 256, partial_rotary_factor 0.25 when the file names none,
  // num_key_value_heads 4, intermediate_size 12288, three linear layers to one full.
  const ModelConfig c = parse_model_config(json{{"architectures", {"Qwen3_5ForCausalLM"}},
                                                {"vocab_size", 512},
                                                {"hidden_size", 64},
                                                {"num_hidden_layers", 8},
                                                {"num_attention_heads", 4}},
                                           "defaults");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.layer_types, (std::vector<LA>{LA::kLinear, LA::kLinear, LA::kLinear, LA::kFull,
                                            LA::kLinear, LA::kLinear, LA::kLinear, LA::kFull}));
  EXPECT_EQ(c.linear.num_value_heads, 32);
  // Qwen3_5MoeTextConfig's: 256 experts of 512, top 8, a shared expert of 512.
  const ModelConfig m = parse_model_config(
      json{{"architectures", {"Qwen3_5MoeForCausalLM"}}, {"num_hidden_layers", 4}}, "moe defaults");
  EXPECT_EQ(m.hidden_size, 2048);
  EXPECT_EQ(m.num_key_value_heads, 2);
  EXPECT_EQ(m.moe.num_experts, 256);
  EXPECT_EQ(m.moe.num_experts_per_tok, 8);
  EXPECT_EQ(m.moe.shared_expert_intermediate_size, 512);
  EXPECT_EQ(m.intermediate_size, 512);
}

TEST(Qwen3_5Config, FieldsTheClassesDeleteAreIgnored) {
  // The dense model: MoE fields (a file converted from another family) leave every MLP dense.
  json j = tiny_text();
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  ModelConfig c = parse_model_config(j, "dense");
  EXPECT_EQ(c.moe.num_experts, 0);
  EXPECT_EQ(expected_weights(c).at("model.layers.0.mlp.gate_proj.weight"), (Shape{96, 64}));
  // The MoE model: its router always renormalizes, every layer is sparse.
  j = tiny_text("Qwen3_5MoeForCausalLM");
  j.erase("intermediate_size");
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["norm_topk_prob"] = false;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {1};
  c = parse_model_config(j, "moe");
  EXPECT_TRUE(c.moe.norm_topk_prob);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(c.is_moe_layer(i)) << i;
  EXPECT_EQ(c.intermediate_size, 32);
}

TEST(Qwen3_5Config, MultimodalWrapperReadsItsTextConfig) {
  json text = tiny_text();
  text.erase("architectures");
  text.erase("dtype");
  json j = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
            {"model_type", "qwen3_5"},
            {"dtype", "bfloat16"},
            {"eos_token_id", 7},
            {"text_config", text},
            {"vision_config", {{"depth", 1}}}};
  const ModelConfig c = parse_model_config(j, "vl");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{7}));
  EXPECT_EQ(c.linear.projections, LinearProjLayout::kSplit);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);
  j.erase("text_config");
  const std::string e = testing::config_error_of(j);
  EXPECT_NE(e.find("Qwen3_5ForConditionalGeneration needs 'text_config'"), std::string::npos) << e;
}

TEST(Qwen3_5Config, VisionTowerAndMtpHeadAreLeftUnloaded) {
  const ModelConfig c = parse_model_config(tiny_text(), "text");
  for (const char* n : {"model.visual.blocks.0.attn.qkv.weight", "mtp.fc.weight",
                        "mtp.layers.0.input_layernorm.weight"})
    EXPECT_TRUE(is_ignorable_weight(n, c)) << n;
  EXPECT_FALSE(is_ignorable_weight("model.layers.0.linear_attn.in_proj_z.weight", c));
  // Only Qwen3.5 has a vision tower to skip; Gemma 3's wrapper keeps its own prefixes.
  json next = tiny_text();
  next["architectures"] = {"Qwen3NextForCausalLM"};
  next["num_experts"] = 0;
  const ModelConfig n = parse_model_config(next, "next");
  EXPECT_TRUE(is_ignorable_weight("mtp.fc.weight", n));
  EXPECT_FALSE(is_ignorable_weight("model.visual.blocks.0.attn.qkv.weight", n));
  EXPECT_EQ(n.linear.projections, LinearProjLayout::kGroupedByKeyHead);
  const ModelConfig g = dummy_preset_config("gemma-3-12b");
  EXPECT_TRUE(
      is_ignorable_weight("vision_tower.vision_model.embeddings.patch_embedding.weight", g));
  EXPECT_TRUE(is_ignorable_weight("model.multi_modal_projector.mm_input_projection_weight", g));
  EXPECT_FALSE(is_ignorable_weight("mtp.fc.weight", g));
}

}  // namespace
}  // namespace longctx
