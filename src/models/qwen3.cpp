// Qwen3ForCausalLM, following transformers/models/qwen3/modeling_qwen3.py: Llama's graph with an
// RMSNorm over each head of q and k (q_norm, k_norm) before RoPE, and head_dim set independently
// of hidden_size / num_attention_heads (so q_proj may be wider than hidden). Qwen3MoeForCausalLM
// is this model with Qwen3MoeSparseMoeBlock on its sparse layers (DecoderModel::sparse_moe_block).
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
  Tensor self_attn(const Tensor& hidden_states, int64_t i, const StepInputs& in,
                   AttentionBackend& attention) override {
    const LayerWeights& w = layers_[i];
    Tensor qkv = linear(hidden_states, w.qkv_proj, w.qkv_bias);
    QKV s = split_qkv(qkv);
    rms_norm_in_place(s.q, w.q_norm);  // per head: rows of head_dim
    rms_norm_in_place(s.k, w.k_norm);
    apply_rope(s.qk, in, i);
    attention.store_kv(i, s.k, s.v);
    Tensor attn_output = attention.attend(i, s.q);
    return linear(attn_output, w.o_proj, w.o_bias);
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<Qwen3ForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
