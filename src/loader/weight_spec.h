// The tensors each architecture's checkpoint holds, with the shapes its config implies.
#pragma once

#include <map>
#include <string>

#include "longctx/core/tensor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"

namespace longctx {

// name -> shape of every tensor a checkpoint of `config` must hold.
std::map<std::string, Shape> expected_weights(const ModelConfig& config);

// Tensors a checkpoint may hold that longctx does not need (e.g. rotary inv_freq buffers of old
// exports, or lm_head.weight next to tied embeddings).
bool is_ignorable_weight(const std::string& name, const ModelConfig& config);

// The checkpoint's tensors under the names expected_weights() uses: a multimodal checkpoint's
// text model (model.language_model.* as transformers >= 4.52 saves it, language_model.model.* and
// language_model.lm_head.* as 4.50 did) under model.* / lm_head.*; Phi-3's fused
// self_attn.qkv_proj and mlp.gate_up_proj split into row views of the same bytes. Throws
// Error(kInvalidArgument) naming a fused tensor whose shape does not match the config.
WeightStore canonical_weights(const WeightStore& raw, const ModelConfig& config);

}  // namespace longctx
