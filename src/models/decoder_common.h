// Building blocks shared by the decoder-only architectures (Llama, Mistral, Qwen2, Qwen3): the
// weights of a layer by their Hugging Face names, and the pieces every HF modeling file repeats
// ("Copied from transformers.models.llama..."): RMSNorm, the gated SiLU MLP, projections with
// optional bias, rotary embedding, and attention over the KV cache. Each architecture file
// composes them in the order of its HF forward().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/kv/kv_cache.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::models {

// One decoder layer. Optional tensors (biases, q/k norms) are undefined when absent.
struct LayerWeights {
  Tensor input_layernorm;           // [hidden]
  Tensor q_proj, q_bias;            // [q_size, hidden], [q_size]
  Tensor k_proj, k_bias;            // [kv_size, hidden], [kv_size]
  Tensor v_proj, v_bias;            // [kv_size, hidden], [kv_size]
  Tensor o_proj, o_bias;            // [hidden, q_size], [hidden]
  Tensor q_norm, k_norm;            // [head_dim] each (Qwen3)
  Tensor post_attention_layernorm;  // [hidden]
  Tensor gate_proj, gate_bias;      // [intermediate, hidden], [intermediate]
  Tensor up_proj, up_bias;          // [intermediate, hidden], [intermediate]
  Tensor down_proj, down_bias;      // [hidden, intermediate], [hidden]
};

// What a decoder-only model owns: the checkpoint (its mmaps back every weight), the weights by
// role, and the rope frequencies. forward() and the decoder layer are the same in every HF file
// of this family (LlamaModel / Qwen2Model / Qwen3Model); an architecture overrides self_attn()
// where its attention differs.
class DecoderModel : public Model {
 public:
  DecoderModel(std::shared_ptr<const Checkpoint> checkpoint, const ModelBuildOptions& options);
  const ModelConfig& config() const override { return checkpoint_->config; }

  // *ForCausalLM.forward -> *Model.forward (embed, decoder layers), then norm and lm_head.
  Tensor forward(std::span<const int32_t> ids, std::span<const int64_t> positions, KVCache& cache,
                 bool last_only) override;

 protected:
  // Per-call views of forward()'s arguments, checked: ids and positions agree in length, the
  // cache belongs to this model and has room (Error(kOutOfRange) otherwise, nothing appended).
  struct Step {
    int64_t n = 0;      // new tokens
    int64_t start = 0;  // cache slot of the first new token
    Tensor ids;         // [n] i32
    Tensor positions;   // [n] i64
    KVCache* cache = nullptr;
  };
  // *DecoderLayer.forward: pre-norm attention and MLP, each with a residual.
  Tensor decoder_layer(const Tensor& hidden_states, int64_t i, const Step& step);
  // LlamaAttention.forward: project (bias where the checkpoint has one), rotate q and k, attend
  // over the cache, project back. K and V are projected straight into the cache slots.
  virtual Tensor self_attn(const Tensor& hidden_states, int64_t i, const Step& step);

  Step begin_step(std::span<const int32_t> ids, std::span<const int64_t> positions,
                  KVCache& cache) const;
  // Records the step's tokens in the cache (after every layer wrote its K/V).
  void end_step(const Step& step) const;

  // hidden [n, hidden] f32 from token ids.
  Tensor embed_tokens(const Step& step) const;
  // RMSNorm over the last dim of x (weight's length): a new tensor, or in place.
  Tensor rms_norm(const Tensor& x, const Tensor& weight) const;
  void rms_norm_in_place(const Tensor& x, const Tensor& weight) const;
  // x @ weight^T + bias (bias may be undefined), a new [n, out] tensor.
  static Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
  // The same, written into `out` (e.g. the cache slots of the new tokens).
  static void linear_into(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const Tensor& out);
  // down_proj(silu(gate_proj(x)) * up_proj(x)): LlamaMLP / Qwen2MLP / Qwen3MLP.
  static Tensor gated_mlp(const Tensor& x, const LayerWeights& w);
  // In place on x [n, heads, head_dim] at the step's positions.
  void apply_rope(const Tensor& x, const Step& step) const;
  // Softmax(q k^T * scale) v over the cache's keys [0, start + n) that are at positions <= each
  // query's; q: [n, Hq, head_dim]; returns [n, Hq * head_dim].
  Tensor cache_attention(const Tensor& q, int64_t layer, const Step& step) const;
  // The new tokens' K or V slots of `layer`: [n, kv_size] views into the cache.
  Tensor cache_k_slots(int64_t layer, const Step& step) const;
  Tensor cache_v_slots(int64_t layer, const Step& step) const;
  // Final norm and lm_head over all rows of hidden, or the last one when last_only.
  Tensor final_logits(const Tensor& hidden, bool last_only) const;

  std::shared_ptr<const Checkpoint> checkpoint_;
  Tensor embed_tokens_;  // [vocab, hidden]
  std::vector<LayerWeights> layers_;
  Tensor norm_;                  // [hidden]
  Tensor lm_head_;               // [vocab, hidden]; embed_tokens_ when tied
  Tensor inv_freq_;              // [head_dim / 2] f32
  float attention_scale_ = 0.f;  // 1 / sqrt(head_dim)
};

}  // namespace longctx::models
