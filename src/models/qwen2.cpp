// Qwen2ForCausalLM, following transformers/models/qwen2/modeling_qwen2.py: Llama's graph with a
// bias on the q, k and v projections (none on o_proj).
#include "models/architectures.h"
#include "models/decoder_common.h"

namespace longctx::models {

namespace {

class Qwen2ForCausalLM : public DecoderModel {
 public:
  Qwen2ForCausalLM(std::shared_ptr<const Checkpoint> checkpoint, const ModelBuildOptions& options)
      : DecoderModel(std::move(checkpoint), options) {
    // The loader fuses q/k/v biases only when all three are present.
    for (size_t i = 0; i < layers_.size() && config_.attention_bias; ++i)
      LONGCTX_CHECK(layers_[i].qkv_bias.defined(), ErrorCode::kNotFound,
                    "Qwen2: layer {} lacks a q/k/v projection bias", i);
  }
  // forward, Qwen2DecoderLayer and Qwen2Attention are Llama's (DecoderModel): q/k/v carry the
  // bias checked above, o_proj has none (the loader admits no o_proj.bias for Qwen2).
  // Qwen2MoeForCausalLM is this model with Qwen2MoeSparseMoeBlock on its sparse layers
  // (DecoderModel::sparse_moe_block) and q/k/v biases only with `qkv_bias`.
};

}  // namespace

std::unique_ptr<Model> make_qwen2(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<Qwen2ForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
