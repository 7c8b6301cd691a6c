// Qwen3ForCausalLM, following transformers/models/qwen3/modeling_qwen3.py: Llama's graph with an
// RMSNorm over each head of q and k (q_norm, k_norm) before RoPE, and head_dim set independently
// of hidden_size / num_attention_heads (so q_proj may be wider than hidden).
#include "models/architectures.h"
#include "models/decoder_common.h"

namespace longctx::models {

namespace {

class Qwen3ForCausalLM : public DecoderModel {
 public:
  Qwen3ForCausalLM(std::shared_ptr<const Checkpoint> checkpoint, const ModelBuildOptions& options)
      : DecoderModel(std::move(checkpoint), options) {
    for (size_t i = 0; i < layers_.size(); ++i)
      LONGCTX_CHECK(layers_[i].q_norm.defined() && layers_[i].k_norm.defined(),
                    ErrorCode::kNotFound, "Qwen3: layer {} lacks self_attn.q_norm/k_norm", i);
  }

 protected:
  // forward and Qwen3DecoderLayer are Llama's (DecoderModel); the attention differs.
  // Qwen3Attention.forward:
  //   q = q_norm(q_proj(x).view(n, Hq, head_dim)); k = k_norm(k_proj(x).view(n, Hkv, head_dim))
  //   then RoPE on q and k, attention, o_proj.
  Tensor self_attn(const Tensor& hidden_states, int64_t i, const Step& step) override {
    const ModelConfig& c = config();
    const LayerWeights& w = layers_[i];
    const int64_t n = step.n, d = c.head_dim;
    Tensor q = linear(hidden_states, w.q_proj, w.q_bias).view({n, c.num_attention_heads, d});
    q = rms_norm(q, w.q_norm);  // per head: rows of head_dim
    Tensor k = cache_k_slots(i, step);
    Tensor v = cache_v_slots(i, step);
    linear_into(hidden_states, w.k_proj, w.k_bias, k);
    linear_into(hidden_states, w.v_proj, w.v_bias, v);
    Tensor k_heads = k.view({n, c.num_key_value_heads, d});
    rms_norm_in_place(k_heads, w.k_norm);
    apply_rope(q, step);
    apply_rope(k_heads, step);
    Tensor attn_output = cache_attention(q, i, step);
    return linear(attn_output, w.o_proj, w.o_bias);
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<Qwen3ForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
