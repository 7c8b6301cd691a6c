// Gemma3ForCausalLM (and the text tower of Gemma3ForConditionalGeneration), following
// transformers/models/gemma3/modeling_gemma3.py. What differs from Llama, each handled once:
// - Gemma3RMSNorm scales by (1 + w): the loader stores 1 + w (decoder_common.cpp);
// - the embedding is scaled by sqrt(hidden_size) (config.embed_scale, in the embedding op);
// - GeGLU MLP with gelu_pytorch_tanh (config.hidden_act);
// - the softmax scale is query_pre_attn_scalar^-0.5 (Model::attention_scale);
// - five sliding-window layers to one global (config.layer_types; the KV groups keep only the
//   window of a sliding layer), each kind with its own rope base (apply_rope by layer);
// - q_norm / k_norm over each head before RoPE (as Qwen3), and four norms per layer (below).
#include "models/architectures.h"
#include "models/decoder_common.h"

namespace longctx::models {

namespace {

class Gemma3ForCausalLM : public DecoderModel {
 public:
  Gemma3ForCausalLM(std::shared_ptr<const Checkpoint> checkpoint, const ModelBuildOptions& options)
      : DecoderModel(std::move(checkpoint), options) {
    for (size_t i = 0; i < layers_.size(); ++i)
      LONGCTX_CHECK(layers_[i].q_norm.defined() && layers_[i].k_norm.defined(),
                    ErrorCode::kNotFound, "Gemma 3: layer {} lacks self_attn.q_norm/k_norm", i);
  }

 protected:
  // Gemma3DecoderLayer.forward:
  //   residual = x; x = input_layernorm(x); x = self_attn(x); x = post_attention_layernorm(x)
  //   x = residual + x; residual = x
  //   x = pre_feedforward_layernorm(x); x = mlp(x); x = post_feedforward_layernorm(x)
  //   x = residual + x
  // With the residual adds fused into the next norm as in every decoder here: `mlp_out` carries
  // post_feedforward_layernorm(mlp(x)) to the next layer's input norm (or the final norm).
  void decoder_layer(int64_t i, Tensor& residual, Tensor& mlp_out, const StepInputs& in,
                     AttentionBackend& attention) override {
    const LayerWeights& w = layers_[i];
    Tensor h = mlp_out.defined() ? add_rms_norm(mlp_out, residual, w.input_layernorm)
                                 : rms_norm(residual, w.input_layernorm);
    h = self_attn(h, i, in, attention);
    reduce(h);  // o_proj is row-parallel
    h = rms_norm(h, w.post_attention_layernorm);
    h = add_rms_norm(h, residual, w.pre_feedforward_layernorm);
    Tensor m = gated_mlp(h, w);
    reduce(m);  // down_proj is row-parallel
    mlp_out = rms_norm(m, w.post_feedforward_layernorm);
  }

  // Gemma3Attention.forward is DecoderModel's with config.qk_norm (q_norm / k_norm per head before
  // RoPE) and the layer kind's rope (apply_rope by layer).
};

}  // namespace

std::unique_ptr<Model> make_gemma3(std::shared_ptr<const Checkpoint> checkpoint,
                                   const ModelBuildOptions& options) {
  return std::make_unique<Gemma3ForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
