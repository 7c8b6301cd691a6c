// The tensors each architecture's checkpoint holds, with the shapes its config implies.
#pragma once

#include <map>
#include <string>

#include "longctx/core/tensor.h"
#include "longctx/loader/model_config.h"

namespace longctx {

// name -> shape of every tensor a checkpoint of `config` must hold.
std::map<std::string, Shape> expected_weights(const ModelConfig& config);

// Tensors a checkpoint may hold that longctx does not need (e.g. rotary inv_freq buffers of old
// exports, or lm_head.weight next to tied embeddings).
bool is_ignorable_weight(const std::string& name, const ModelConfig& config);

}  // namespace longctx
