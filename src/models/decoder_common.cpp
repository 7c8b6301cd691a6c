#include "models/decoder_common.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "ops/add.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/silu_and_mul.h"

namespace longctx::models {

namespace {

Tensor optional_weight(const WeightStore& w, const std::string& name) {
  return w.has(name) ? w.get(name) : Tensor();
}

}  // namespace

DecoderModel::DecoderModel(std::shared_ptr<const Checkpoint> checkpoint,
                           const ModelBuildOptions& options)
    : checkpoint_(std::move(checkpoint)) {
  LONGCTX_CHECK(checkpoint_ != nullptr, ErrorCode::kInvalidArgument,
                "create_model: null checkpoint");
  const ModelConfig& c = checkpoint_->config;
  const WeightStore& w = checkpoint_->weights;
  embed_tokens_ = w.get("model.embed_tokens.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    LayerWeights l;
    l.input_layernorm = w.get(p + "input_layernorm.weight");
    l.q_proj = w.get(p + "self_attn.q_proj.weight");
    l.k_proj = w.get(p + "self_attn.k_proj.weight");
    l.v_proj = w.get(p + "self_attn.v_proj.weight");
    l.o_proj = w.get(p + "self_attn.o_proj.weight");
    l.q_bias = optional_weight(w, p + "self_attn.q_proj.bias");
    l.k_bias = optional_weight(w, p + "self_attn.k_proj.bias");
    l.v_bias = optional_weight(w, p + "self_attn.v_proj.bias");
    l.o_bias = optional_weight(w, p + "self_attn.o_proj.bias");
    l.q_norm = optional_weight(w, p + "self_attn.q_norm.weight");
    l.k_norm = optional_weight(w, p + "self_attn.k_norm.weight");
    l.post_attention_layernorm = w.get(p + "post_attention_layernorm.weight");
    l.gate_proj = w.get(p + "mlp.gate_proj.weight");
    l.up_proj = w.get(p + "mlp.up_proj.weight");
    l.down_proj = w.get(p + "mlp.down_proj.weight");
    l.gate_bias = optional_weight(w, p + "mlp.gate_proj.bias");
    l.up_bias = optional_weight(w, p + "mlp.up_proj.bias");
    l.down_bias = optional_weight(w, p + "mlp.down_proj.bias");
    layers_.push_back(std::move(l));
  }
  norm_ = w.get("model.norm.weight");
  lm_head_ = c.tie_word_embeddings ? embed_tokens_ : w.get("lm_head.weight");
  // Rounded like transformers' inv_freq buffer in a model loaded at that dtype (see model.h).
  std::vector<float> inv = ops::rope_inv_freq_as_transformers(
      c.rope, c.head_dim, options.rope_inv_freq_dtype.value_or(DType::kF32));
  inv_freq_ = Tensor::empty({int64_t(inv.size())}, DType::kF32);
  std::memcpy(inv_freq_.data_ptr(), inv.data(), inv.size() * sizeof(float));
  attention_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
}

DecoderModel::Step DecoderModel::begin_step(std::span<const int32_t> ids,
                                            std::span<const int64_t> positions,
                                            KVCache& cache) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(ids.size());
  LONGCTX_CHECK(n > 0, ErrorCode::kInvalidArgument, "forward: no input tokens");
  LONGCTX_CHECK(positions.size() == ids.size(), ErrorCode::kInvalidArgument,
                "forward: {} ids but {} positions", ids.size(), positions.size());
  LONGCTX_CHECK(cache.num_layers() == c.num_hidden_layers &&
                    cache.k(0).size(1) == c.num_key_value_heads && cache.k(0).size(2) == c.head_dim,
                ErrorCode::kInvalidArgument,
                "forward: the KV cache ({} layers of {}) was not made for this model",
                cache.num_layers(), cache.k(0).str());
  LONGCTX_CHECK(cache.length() + n <= cache.capacity(), ErrorCode::kOutOfRange,
                "forward: {} new tokens do not fit the KV cache ({} of {} slots used)", n,
                cache.length(), cache.capacity());
  Step s;
  s.n = n;
  s.start = cache.length();
  s.cache = &cache;
  s.ids = Tensor::from_blob(const_cast<int32_t*>(ids.data()), {n}, DType::kI32);
  s.positions = Tensor::from_blob(const_cast<int64_t*>(positions.data()), {n}, DType::kI64);
  // Slots past length() are free, so writing the new tokens' positions appends nothing yet.
  std::memcpy(cache.positions().data<int64_t>() + s.start, positions.data(), n * sizeof(int64_t));
  return s;
}

void DecoderModel::end_step(const Step& step) const { step.cache->advance(step.n); }

Tensor DecoderModel::embed_tokens(const Step& step) const {
  Tensor h = Tensor::empty({step.n, config().hidden_size}, DType::kF32);
  ops::embedding(step.ids, embed_tokens_, h);
  return h;
}

Tensor DecoderModel::rms_norm(const Tensor& x, const Tensor& weight) const {
  Tensor out = Tensor::empty(x.shape(), DType::kF32);
  const int64_t d = weight.size(0);
  ops::rms_norm(x.view({-1, d}), weight, static_cast<float>(config().rms_norm_eps),
                out.view({-1, d}));
  return out;
}

void DecoderModel::rms_norm_in_place(const Tensor& x, const Tensor& weight) const {
  const int64_t d = weight.size(0);
  ops::rms_norm(x.view({-1, d}), weight, static_cast<float>(config().rms_norm_eps),
                x.view({-1, d}));
}

Tensor DecoderModel::linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = Tensor::empty({x.size(0), weight.size(0)}, DType::kF32);
  ops::linear(x, weight, bias, out);
  return out;
}

void DecoderModel::linear_into(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               const Tensor& out) {
  ops::linear(x, weight, bias, out);
}

Tensor DecoderModel::gated_mlp(const Tensor& x, const LayerWeights& w) {
  Tensor gate = linear(x, w.gate_proj, w.gate_bias);
  Tensor up = linear(x, w.up_proj, w.up_bias);
  ops::silu_and_mul(gate, up, gate);
  return linear(gate, w.down_proj, w.down_bias);
}

void DecoderModel::apply_rope(const Tensor& x, const Step& step) const {
  ops::rope(x, step.positions, inv_freq_);
}

Tensor DecoderModel::cache_k_slots(int64_t layer, const Step& step) const {
  return step.cache->k(layer).slice(0, step.start, step.start + step.n).view({step.n, -1});
}

Tensor DecoderModel::cache_v_slots(int64_t layer, const Step& step) const {
  return step.cache->v(layer).slice(0, step.start, step.start + step.n).view({step.n, -1});
}

Tensor DecoderModel::cache_attention(const Tensor& q, int64_t layer, const Step& step) const {
  ops::AttentionArgs a;
  a.q = q;
  a.k = step.cache->k(layer);
  a.v = step.cache->v(layer);
  a.q_positions = step.positions;
  a.k_positions = step.cache->positions();
  a.kv_len = step.start + step.n;
  a.scale = attention_scale_;
  a.out = Tensor::empty(q.shape(), DType::kF32);
  ops::attention(a);
  return a.out.view({step.n, -1});
}

Tensor DecoderModel::forward(std::span<const int32_t> ids, std::span<const int64_t> positions,
                             KVCache& cache, bool last_only) {
  Step step = begin_step(ids, positions, cache);
  Tensor hidden_states = embed_tokens(step);
  for (int64_t i = 0; i < config().num_hidden_layers; ++i)
    hidden_states = decoder_layer(hidden_states, i, step);
  Tensor logits = final_logits(hidden_states, last_only);  // norm, lm_head
  end_step(step);
  return logits;
}

Tensor DecoderModel::decoder_layer(const Tensor& hidden_states, int64_t i, const Step& step) {
  const LayerWeights& w = layers_[i];
  Tensor residual = hidden_states;
  Tensor h = rms_norm(hidden_states, w.input_layernorm);
  h = self_attn(h, i, step);
  ops::add(residual, h, h);
  residual = h;
  h = rms_norm(h, w.post_attention_layernorm);
  h = gated_mlp(h, w);
  ops::add(residual, h, h);
  return h;
}

Tensor DecoderModel::self_attn(const Tensor& hidden_states, int64_t i, const Step& step) {
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

Tensor DecoderModel::final_logits(const Tensor& hidden, bool last_only) const {
  const int64_t n = hidden.size(0);
  Tensor rows = last_only ? hidden.slice(0, n - 1, n) : hidden;
  return linear(rms_norm(rows, norm_), lm_head_, Tensor());
}

}  // namespace longctx::models
