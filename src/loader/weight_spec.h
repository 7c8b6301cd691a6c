// The tensors each architecture's checkpoint holds, with the shapes its config implies.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

namespace longctx {

// How a checkpoint spells the routed experts of a MoE layer: one tensor per expert and
// projection (`mlp.experts.{e}.gate_proj.weight` [inter, hidden], up_proj, down_proj
// [hidden, inter]: what Qwen releases and transformers' save_pretrained writes), or the fused
// parameters of transformers 5's Qwen2MoeExperts (`mlp.experts.gate_up_proj`
// [experts, 2 inter, hidden], gate rows first, and `mlp.experts.down_proj`
// [experts, hidden, inter]).
enum class ExpertLayout { kPerExpert, kFused };

// kFused when any tensor name ends in `.mlp.experts.gate_up_proj`, else kPerExpert.
ExpertLayout detect_expert_layout(const std::vector<std::string>& names);

// How a checkpoint quantized in q's format spells its experts (dummy weights, and what `longctx
// info` counts): per expert for FP8 blocks, each expert a Linear quantized as Qwen3-30B-A3B-FP8
// and Qwen3-Next-80B-A3B-Instruct-FP8 publish them (the MoE op can run them packed); fused
// otherwise (experts stay dense: no other format's experts run packed).
ExpertLayout quantized_expert_layout(const QuantConfig& q);

// name -> shape of every tensor a checkpoint of `config` must hold.
std::map<std::string, Shape> expected_weights(const ModelConfig& config,
                                              ExpertLayout experts = ExpertLayout::kFused);

// Tensors a checkpoint may hold that longctx does not need (e.g. rotary inv_freq buffers of old
// exports, or lm_head.weight next to tied embeddings).
bool is_ignorable_weight(const std::string& name, const ModelConfig& config);

// The checkpoint's tensors under the names expected_weights() uses: a multimodal checkpoint's
// text model (model.language_model.* as transformers >= 4.52 saves it, language_model.model.* and
// language_model.lm_head.* as 4.50 did) under model.* / lm_head.*; Phi-3's fused
// self_attn.qkv_proj and mlp.gate_up_proj split into row views of the same bytes. Throws
// Error(kInvalidArgument) naming a fused tensor whose shape does not match the config.
WeightStore canonical_weights(const WeightStore& raw, const ModelConfig& config);

// canonical_weights for a quantized checkpoint's packed Linears (keyed by their dense weight's
// name): renamed alike, a fused projection split into its parts in the format's own layout
// (slice_quantized). A fused projection the format cannot split there (an FP8 scale block that a
// part ends inside) is dequantized to config.dtype and its parts added to `dense` instead.
// Throws Error(kInvalidArgument) naming a fused tensor whose shape does not match the config.
std::map<std::string, QuantizedWeight> canonical_quantized(
    const std::map<std::string, QuantizedWeight>& raw, const ModelConfig& config,
    WeightStore& dense);

}  // namespace longctx
