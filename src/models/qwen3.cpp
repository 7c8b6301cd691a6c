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

  // forward, Qwen3DecoderLayer and Qwen3Attention are Llama's (DecoderModel) with config.qk_norm:
  //   q = q_norm(q_proj(x).view(n, Hq, head_dim)); k = k_norm(k_proj(x).view(n, Hkv, head_dim))
  //   then RoPE on q and k, attention, o_proj.
};

}  // namespace

std::unique_ptr<Model> make_qwen3(std::shared_ptr<const Checkpoint> checkpoint,
                                  const ModelBuildOptions& options) {
  return std::make_unique<Qwen3ForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
