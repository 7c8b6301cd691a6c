// Qwen2ForCausalLM, following transformers/models/qwen2/modeling_qwen2.py: Llama's graph with a
// bias on the q, k and v projections (none on o_proj).
#include "models/architectures.h"
#include "models/decoder_common.h"
#include "ops/add.h"

namespace longctx::models {

namespace {

class Qwen2ForCausalLM : public DecoderModel {
 public:
  Qwen2ForCausalLM(std::shared_ptr<const Checkpoint> checkpoint, const ModelBuildOptions& options)
      : DecoderModel(std::move(checkpoint), options) {
    for (size_t i = 0; i < layers_.size(); ++i)
      LONGCTX_CHECK(
          layers_[i].q_bias.defined() && layers_[i].k_bias.defined() && layers_[i].v_bias.defined(),
          ErrorCode::kNotFound, "Qwen2: layer {} lacks a q/k/v projection bias", i);
  }

  // Qwen2ForCausalLM.forward -> Qwen2Model.forward, then the lm_head.
  Tensor forward(std::span<const int32_t> ids, std::span<const int64_t> positions, KVCache& cache,
                 bool last_only) override {
    Step step = begin_step(ids, positions, cache);
    Tensor hidden_states = embed_tokens(step);
    for (int64_t i = 0; i < config().num_hidden_layers; ++i)
      hidden_states = decoder_layer(hidden_states, i, step);
    Tensor logits = final_logits(hidden_states, last_only);  // norm, lm_head
    end_step(step);
    return logits;
  }

 private:
  // Qwen2DecoderLayer.forward
  Tensor decoder_layer(const Tensor& hidden_states, int64_t i, const Step& step) {
    const LayerWeights& w = layers_[i];
    Tensor residual = hidden_states;
    Tensor h = rms_norm(hidden_states, w.input_layernorm);
    h = self_attn(h, i, step);
    ops::add(residual, h, h);
    residual = h;
    h = rms_norm(h, w.post_attention_layernorm);
    h = gated_mlp(h, w);  // Qwen2MLP
    ops::add(residual, h, h);
    return h;
  }

  // Qwen2Attention.forward: q_proj/k_proj/v_proj with bias, o_proj without.
  Tensor self_attn(const Tensor& hidden_states, int64_t i, const Step& step) {
    const ModelConfig& c = config();
    const LayerWeights& w = layers_[i];
    const int64_t n = step.n, d = c.head_dim;
    Tensor q = linear(hidden_states, w.q_proj, w.q_bias).view({n, c.num_attention_heads, d});
    Tensor k = cache_k_slots(i, step);
    Tensor v = cache_v_slots(i, step);
    linear_into(hidden_states, w.k_proj, w.k_bias, k);
    linear_into(hidden_states, w.v_proj, w.v_bias, v);
    apply_rope(q, step);
    apply_rope(k.view({n, c.num_key_value_heads, d}), step);
    Tensor attn_output = cache_attention(q, i, step);
    return linear(attn_output, w.o_proj, Tensor());
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen2(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<Qwen2ForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
