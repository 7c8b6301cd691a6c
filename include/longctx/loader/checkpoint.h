// A Hugging Face checkpoint folder: config.json (+ generation_config.json), and one
// model.safetensors or shards listed by model.safetensors.index.json. Files are memory-mapped
// and every weight is a CPU Tensor viewing the mapping in place (no copy).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/model_config.h"
#include "longctx/loader/quantization.h"

namespace longctx {

class SafetensorsFile;

// Named weights. Real checkpoints view mmaps; dummy ones own random data.
class WeightStore {
 public:
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws Error(kNotFound) naming the tensor.
  const Tensor& get(const std::string& name) const;
  std::vector<std::string> names() const;
  void add(const std::string& name, Tensor t);
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  int64_t num_parameters() const;
  size_t num_bytes() const;

 private:
  std::map<std::string, Tensor> tensors_;
};

struct Checkpoint {
  std::string dir;  // empty for dummy checkpoints
  ModelConfig config;
  // Dense weights in config.dtype. A quantized checkpoint's Linears are not here (no dense host
  // copy is made at load): dense_weight() dequantizes one on demand; `quantized` holds them.
  WeightStore weights;
  // The packed tensors of a quantized checkpoint's Linears as stored (views of the mmaps; dummy
  // ones own random data), under their dense weight's canonical name
  // ("model.layers.0.self_attn.q_proj.weight"), checked against the config's [out, in].
  std::map<std::string, QuantizedWeight> quantized;
  std::vector<std::shared_ptr<SafetensorsFile>> files;  // keeps the mmaps alive

  // weights.get(name), or `quantized[name]` dequantized to config.dtype into a new host tensor
  // (the checkpoint keeps no copy). Throws Error(kNotFound) naming the tensor when neither exists.
  Tensor dense_weight(const std::string& name) const;
  bool has_weight(const std::string& name) const {
    return weights.has(name) || quantized.count(name) > 0;
  }
};

// Opens and validates a checkpoint folder: every tensor the architecture expects is present
// with the shape the config implies and a floating dtype (missing ones listed), no unexpected
// tensor (listed). A quantized checkpoint's Linears (config.quantization) are checked against
// their format and the config's shapes and kept packed. Throws Error naming file, tensor, problem.
Checkpoint load_checkpoint(const std::string& dir);

// Built-in shape presets for --load-format dummy ("llama-3.1-8b", "qwen3-0.6b", "qwen3-8b", ...).
std::vector<std::string> dummy_presets();
ModelConfig dummy_preset_config(const std::string& preset);
// The config of the model's first n decoder layers (1 <= n <= num_hidden_layers; per-layer lists
// cut to match): the per-layer speed of a model larger than the GPU from dummy weights.
ModelConfig first_layers(ModelConfig config, int64_t n);
// Random weights of the config's shapes (deterministic in seed), bf16 unless dtype given.
// Norm weights are near 1 so activations stay sane. With config.quantization, the decoder
// layers' Linears are random packed tensors in that format (`quantized`) with no dense copy.
Checkpoint make_dummy_checkpoint(const ModelConfig& config, uint64_t seed = 0);

}  // namespace longctx
