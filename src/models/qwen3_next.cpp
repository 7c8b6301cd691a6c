// Qwen3NextForCausalLM, following transformers/models/qwen3_next/modeling_qwen3_next.py: three
// Gated DeltaNet (linear attention) layers to one gated full-attention layer (config
// layer_types), every MLP the MoE block with a shared expert (Qwen2-MoE's: sparse_moe_block).
// Qwen3.5's text models (transformers/models/qwen3_5{,_moe}: Qwen3_5[Moe]ForCausalLM, the text
// model of Qwen3_5[Moe]ForConditionalGeneration) are this model: Qwen3_5GatedDeltaNet computes
// what Qwen3NextGatedDeltaNet does from projections stored apart (LinearProjLayout::kSplit); the
// dense models' MLPs are DecoderModel's dense MLP (config.moe.num_experts 0); the multimodal
// RoPE is the plain partial RoPE on text positions (loader/text_config.cpp).
// What differs from the decoders of decoder_common, each handled once:
// - Qwen3NextRMSNorm scales by (1 + w) (config.norm_plus_one: loaded as 1 + w), the gated norm
//   of the linear layers does not;
// - Qwen3NextAttention: q_proj emits q and an output gate per head (config.attn_output_gate:
//   the fused projection's gate rows, o = attn * sigmoid(gate) in DecoderModel::self_attn), q/k
//   norms, partial RoPE (rope.partial_rotary_factor);
// - Qwen3NextGatedDeltaNet (linear_attn below) in place of self_attn on linear layers, its
//   recurrent and conv states per sequence kept by the attention backend (a kState KV group).
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "models/architectures.h"
#include "models/decoder_common.h"
#include "models/weight_loader.h"
#include "ops/linear.h"
#include "ops/linear_attention.h"

namespace longctx::models {

namespace {

// One Gated DeltaNet layer's weights, Qwen3-Next's per-key-head interleaving undone (Qwen3.5's
// separate projections fused) at load time, see the constructor, so q, k, v, z and b, a are
// contiguous column ranges.
struct LinearAttnWeights {
  Tensor in_proj_qkvz;  // [2 key_dim + 2 value_dim, hidden]: rows q, k, v, z (each head-major)
  Tensor in_proj_ba;    // [2 Hv, hidden]: rows b, a
  Tensor conv1d;        // [conv_dim, kernel] f32 (Conv1d's [conv_dim, 1, kernel])
  Tensor a_neg;         // [Hv] f32: -exp(A_log)
  Tensor dt_bias;       // [Hv] f32
  Tensor norm;          // [value_head_dim] f32 (Qwen3NextRMSNormGated, not zero-centred)
  Tensor out_proj;      // [hidden, value_dim]
};

class Qwen3NextForCausalLM : public DecoderModel {
 public:
  Qwen3NextForCausalLM(std::shared_ptr<const Checkpoint> checkpoint,
                       const ModelBuildOptions& options)
      : DecoderModel(std::move(checkpoint), options) {
    const ModelConfig& c = config();
    LONGCTX_CHECK(!sharded(), ErrorCode::kUnsupported,
                  "Qwen3-Next: tensor parallelism does not shard linear-attention layers");
    const LinearAttentionConfig& l = c.linear;
    const int64_t hk = l.num_key_heads, hv = l.num_value_heads, dk = l.key_head_dim,
                  dv = l.value_head_dim, r = hv / std::max<int64_t>(hk, 1);
    const Checkpoint& w = *checkpoint_;
    WeightLoader load(device_, act_dtype_);
    // An f32 host copy (never a view of the checkpoint's read-only mmap: a_neg is written
    // below); on_device() moves the finished one to the model's device.
    auto f32 = [](const Tensor& t) {
      Tensor f = Tensor::empty(t.shape(), DType::kF32);
      f.copy_from(t.dtype() == DType::kF32 ? t : t.to_dtype(DType::kF32));
      return f;
    };
    auto on_device = [&](const Tensor& t) { return device_.is_cpu() ? t : t.to(device_); };
    linear_.resize(c.num_hidden_layers);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (c.layer_type(i) != LayerAttention::kLinear) {
        LONGCTX_CHECK(layers_[i].q_norm.defined() && layers_[i].k_norm.defined(),
                      ErrorCode::kNotFound, "Qwen3-Next: layer {} lacks self_attn.q_norm/k_norm",
                      i);
        continue;
      }
      const std::string p = fmt::format("model.layers.{}.linear_attn.", i);
      // (The projections of a quantized checkpoint dequantized here: they load dense.)
      auto get = [&](const std::string& name, const Shape& shape) {
        Tensor t = w.dense_weight(p + name);
        LONGCTX_CHECK(t.shape() == shape, ErrorCode::kInvalidArgument,
                      "Qwen3-Next: {}{} is {}, the config makes it {}", p, name, t.shape_str(),
                      Tensor::empty(shape, DType::kF32).shape_str());
        return t;
      };
      LinearAttnWeights& lw = linear_[i];
      const int64_t conv_dim = 2 * hk * dk + hv * dv;
      switch (l.projections) {
        case LinearProjLayout::kGroupedByKeyHead: {
          // in_proj_qkvz rows are grouped by key head g: [q_g (dk), k_g (dk), v_g (r dv),
          // z_g (r dv)] (fix_query_key_value_ordering); value head g r + j is the j-th of
          // group g.
          const int64_t group = 2 * dk + 2 * r * dv;
          Tensor qkvz = get("in_proj_qkvz.weight", {hk * group, c.hidden_size});
          std::vector<Tensor> parts;
          for (int64_t part : {0, 1, 2, 3}) {
            const int64_t off = part < 2 ? part * dk : 2 * dk + (part - 2) * r * dv;
            const int64_t n = part < 2 ? dk : r * dv;
            for (int64_t g = 0; g < hk; ++g)
              parts.push_back(qkvz.slice(0, g * group + off, g * group + off + n));
          }
          lw.in_proj_qkvz = load.load_fused(parts);
          // in_proj_ba rows per key head: [b_g (r), a_g (r)].
          Tensor ba = get("in_proj_ba.weight", {2 * hv, c.hidden_size});
          parts.clear();
          for (int64_t part : {0, 1})
            for (int64_t g = 0; g < hk; ++g)
              parts.push_back(ba.slice(0, g * 2 * r + part * r, g * 2 * r + (part + 1) * r));
          lw.in_proj_ba = load.load_fused(parts);
          break;
        }
        case LinearProjLayout::kSplit:
          // Qwen3_5GatedDeltaNet: in_proj_qkv rows q (every key head), k, v, each head-major, as
          // the conv reads them; value head h reads key head h / r (repeat_interleave), the
          // grouping above. Only the fusion with z and with a is left.
          lw.in_proj_qkvz = load.load_fused({get("in_proj_qkv.weight", {conv_dim, c.hidden_size}),
                                             get("in_proj_z.weight", {hv * dv, c.hidden_size})});
          lw.in_proj_ba = load.load_fused({get("in_proj_b.weight", {hv, c.hidden_size}),
                                           get("in_proj_a.weight", {hv, c.hidden_size})});
          break;
      }
      lw.conv1d = on_device(f32(get("conv1d.weight", {conv_dim, 1, l.conv_kernel_dim}))
                                .view({conv_dim, l.conv_kernel_dim}));
      // g = -exp(A_log) * softplus(a + dt_bias), A_log.float().exp() as transformers computes it
      Tensor a_neg = f32(get("A_log", {hv}));
      for (int64_t h = 0; h < hv; ++h) a_neg.data<float>()[h] = -std::exp(a_neg.data<float>()[h]);
      lw.a_neg = on_device(a_neg);
      lw.dt_bias = on_device(f32(get("dt_bias", {hv})));
      lw.norm = on_device(f32(get("norm.weight", {dv})));
      lw.out_proj = load.load(get("out_proj.weight", {c.hidden_size, hv * dv}));
    }
    load.finish();
  }

 protected:
  // Qwen3NextDecoderLayer's token mixer: linear_attn on linear layers, else the gated attention.
  Tensor self_attn(const Tensor& hidden_states, int64_t i, const StepInputs& in,
                   AttentionBackend& attention) override {
    if (config().layer_type(i) != LayerAttention::kLinear)
      return DecoderModel::self_attn(hidden_states, i, in, attention);
    return linear_attn(hidden_states, i, in, attention);
  }

 private:
  // Qwen3NextGatedDeltaNet.forward over every sequence of the step, each from its own state:
  //   q, k, v, z, b, a = in_proj(x); q, k, v = silu(causal_conv1d(q, k, v)) (conv state)
  //   beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias)
  //   o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta) (recurrent state)
  //   out_proj(norm(o) * w * silu(z))
  Tensor linear_attn(const Tensor& x, int64_t i, const StepInputs& in,
                     AttentionBackend& attention) {
    const LinearAttentionConfig& l = config().linear;
    const LinearAttnWeights& w = linear_[i];
    const int64_t t = x.size(0), hk = l.num_key_heads, hv = l.num_value_heads, dk = l.key_head_dim,
                  dv = l.value_head_dim;
    const int64_t key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;
    Tensor qkvz = linear(x, w.in_proj_qkvz, Tensor());  // [T, conv_dim + value_dim]
    mark("in_proj_qkvz", double(w.in_proj_qkvz.nbytes()));
    Tensor ba = linear(x, w.in_proj_ba, Tensor());  // [T, 2 Hv]
    mark("in_proj_ba", double(w.in_proj_ba.nbytes()));
    LinearLayerStates states = attention.linear_states(i);
    // The backend's device arrays (the CUDA paged backend: what a decode graph replays), else
    // the step's host qo_indptr with the states' tensors.
    const bool on_device = states.device_qo_indptr != nullptr;
    LONGCTX_CHECK(on_device || in.qo_indptr.size() >= 2, ErrorCode::kUnsupported,
                  "Qwen3-Next: linear attention needs the step's sequences (forward(), or a "
                  "backend with device sequence arrays on the device-only path)");
    const int64_t num_seqs =
        on_device ? states.num_seqs : static_cast<int64_t>(in.qo_indptr.size()) - 1;
    auto seqs = [&](float* const* device_states) {
      ops::SeqDeviceArrays d;
      if (on_device) d = {states.device_qo_indptr, device_states, states.num_seqs};
      return d;
    };

    Tensor mixed = act_empty({t, conv_dim});
    ops::CausalConv1dArgs conv;
    conv.x = qkvz.slice(1, 0, conv_dim);
    conv.weight = w.conv1d;
    conv.out = mixed;
    if (on_device) {
      conv.device = seqs(states.device_conv);
    } else {
      conv.qo_indptr = in.qo_indptr;
      conv.states = states.conv;
    }
    ops::causal_conv1d(conv);
    // The floors the profile holds these ops to: the conv's weight and each sequence's conv state
    // read and written, the recurrent state [Hv, k_dim, v_dim] f32 read and written once per
    // sequence (a decode step's whole traffic; the chunked prefill's per call).
    const double conv_state = double(l.conv_kernel_dim - 1) * double(conv_dim) * sizeof(float);
    mark("conv1d", double(w.conv1d.nbytes()) + 2.0 * double(num_seqs) * conv_state);

    Tensor g = Tensor::empty({t, hv}, DType::kF32, device_);
    Tensor beta = Tensor::empty({t, hv}, DType::kF32, device_);
    ops::delta_rule_gates(ba.slice(1, 0, hv), ba.slice(1, hv, 2 * hv), w.a_neg, w.dt_bias, g, beta);
    mark("delta_rule_gates");

    Tensor core = act_empty({t, hv, dv});
    ops::GatedDeltaRuleArgs d;
    d.q = mixed.slice(1, 0, key_dim).unflatten(1, {hk, dk});
    d.k = mixed.slice(1, key_dim, 2 * key_dim).unflatten(1, {hk, dk});
    d.v = mixed.slice(1, 2 * key_dim, conv_dim).unflatten(1, {hv, dv});
    d.g = g;
    d.beta = beta;
    d.out = core;
    if (on_device) {
      d.device = seqs(states.device_recurrent);
    } else {
      d.qo_indptr = in.qo_indptr;
      d.states = states.recurrent;
    }
    // The chunked form for prefill; a decode-only step is one token per sequence, where a chunk
    // of one is the recurrence itself.
    d.form = t == num_seqs ? ops::DeltaRuleForm::kRecurrent : ops::DeltaRuleForm::kChunked;
    ops::gated_delta_rule(d);
    const double state = double(hv) * double(dk) * double(dv) * sizeof(float);
    mark("delta_rule", 2.0 * double(num_seqs) * state);

    // norm(core_attn_out, z) per value head, then out_proj.
    Tensor rows = core.view({t * hv, dv});
    Tensor z = qkvz.slice(1, conv_dim, conv_dim + value_dim).contiguous().view({t * hv, dv});
    ops::rms_norm_gated(rows, z, w.norm, static_cast<float>(config().rms_norm_eps), rows);
    mark("gated_norm");  // z's copy and the norm
    Tensor out = linear(core.view({t, value_dim}), w.out_proj, Tensor());
    mark("out_proj", double(w.out_proj.nbytes()));
    return out;
  }

  std::vector<LinearAttnWeights> linear_;  // [layers]; defined on linear-attention layers
};

}  // namespace

std::unique_ptr<Model> make_qwen3_next(std::shared_ptr<const Checkpoint> checkpoint,
                                       const ModelBuildOptions& options) {
  return std::make_unique<Qwen3NextForCausalLM>(std::move(checkpoint), options);
}

}  // namespace longctx::models
