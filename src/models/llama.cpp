// LlamaForCausalLM, following transformers/models/llama/modeling_llama.py. MistralForCausalLM is
// the same graph (the loader refuses Mistral's sliding window), so it runs here too.
#include "models/architectures.h"
#include "models/decoder_common.h"
#include "ops/add.h"

namespace longctx::models {

namespace {

class LlamaForCausalLM : public DecoderModel {
 public:
  using DecoderModel::DecoderModel;

  // LlamaForCausalLM.forward -> LlamaModel.forward, then the lm_head.
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
  // LlamaDecoderLayer.forward: pre-norm attention and MLP, each with a residual.
  Tensor decoder_layer(const Tensor& hidden_states, int64_t i, const Step& step) {
    const LayerWeights& w = layers_[i];
    Tensor residual = hidden_states;
    Tensor h = rms_norm(hidden_states, w.input_layernorm);
    h = self_attn(h, i, step);
    ops::add(residual, h, h);
    residual = h;
    h = rms_norm(h, w.post_attention_layernorm);
    h = gated_mlp(h, w);  // LlamaMLP
    ops::add(residual, h, h);
    return h;
  }

  // LlamaAttention.forward: project, rotate q and k, attend over the cache, project back.
  // K and V are projected straight into the cache slots of the new tokens.
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
    return linear(attn_output, w.o_proj, w.o_bias);
  }
};

}  // namespace

std::unique_ptr<Model> make_llama(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<LlamaForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
