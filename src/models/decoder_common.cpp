#include "models/decoder_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loader/quantized_weights.h"
#include "models/weight_loader.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/gather_rows.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/qk_norm_rope.h"
#include "ops/quantized_linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/silu_and_mul.h"

namespace longctx::models {

namespace {

Tensor optional_weight(const Checkpoint& ck, const std::string& name) {
  return ck.has_weight(name) ? ck.dense_weight(name) : Tensor();
}

// Gemma's RMSNorm scales by (1 + w): the weight loaded as 1 + w, computed in fp32 as
// Gemma3RMSNorm does.
Tensor plus_one(const Tensor& w) {
  Tensor f = Tensor::empty(w.shape(), DType::kF32);  // never written into the checkpoint's mmap
  f.copy_from(w.dtype() == DType::kF32 ? w : w.to_dtype(DType::kF32));
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] += 1.0f;
  return f;
}

}  // namespace

DecoderModel::DecoderModel(std::shared_ptr<const Checkpoint> checkpoint,
                           const ModelBuildOptions& options)
    : checkpoint_(std::move(checkpoint)), comm_(options.communicator), device_(options.device) {
  LONGCTX_CHECK(checkpoint_ != nullptr, ErrorCode::kInvalidArgument,
                "create_model: null checkpoint");
  act_dtype_ = device_.is_cpu() ? DType::kF32 : options.activation_dtype;
  const ModelConfig& c = checkpoint_->config;
  config_ = c;
  shard_ = tp_shard(c, 0, 1);
  if (sharded()) {
    shard_ = tp_shard(c, comm_->rank(), comm_->size());
    config_ = tp_local_config(c, shard_);
  }
  const TpShard& s = shard_;
  const int64_t d = c.head_dim;
  // The rank's rows (column-parallel) or input columns (row-parallel) of a weight; biases of
  // row-parallel layers on rank 0 only (they are added once, before the all-reduce).
  auto rows = [](const Tensor& t, int64_t a, int64_t n) {
    return t.defined() ? t.slice(0, a, a + n) : t;
  };
  auto cols = [](const Tensor& t, int64_t a, int64_t n) {
    return t.size(1) == n ? t : t.slice(1, a, a + n).contiguous();
  };
  auto q_rows = [&](const Tensor& t) { return rows(t, s.q_head0 * d, s.num_q_heads * d); };
  auto kv_rows = [&](const Tensor& t) { return rows(t, s.kv_head0 * d, s.num_kv_heads * d); };
  auto mlp_rows = [&](const Tensor& t) { return rows(t, s.inter0, s.inter); };
  auto rank0 = [&](const Tensor& t) { return s.rank == 0 ? t : Tensor(); };
  const Checkpoint& w = *checkpoint_;
  WeightLoader load(device_, act_dtype_);
  // A quantized checkpoint's Linears stay packed on one unsharded device where
  // packs_quantized_linears() says so; a format that cannot
  // stack q/k/v or gate/up (per-tensor FP8 scales, ...) loads that projection dense. Dense
  // projections dequantize through dense_weight() one at a time: the model's fused copy (or its
  // upload) is the only one that stays.
  const bool want_packed =
      !sharded() && packs_quantized_linears(c.quantization, options, w.dir.empty());
  int64_t workspace_bytes = 0;
  // The Linear of checkpoint weights `names` stacked by rows; `dense_rows` makes the dense parts.
  auto linear_weight = [&](const std::vector<std::string>& names, auto dense_rows) {
    LinearWeight lw;
    bool all_packed = true;
    for (const std::string& n : names) all_packed = all_packed && w.quantized.count(n) > 0;
    if (all_packed && want_packed) {
      std::vector<QuantizedWeight> parts;
      for (const std::string& n : names) parts.push_back(w.quantized.at(n));
      QuantizedWeight stacked = stack_quantized(parts, c.quantization);
      if (stacked.method != QuantMethod::kNone) {
        lw.packed = load.load_packed(stacked);
        if (device_.is_cuda())
          workspace_bytes =
              std::max(workspace_bytes, ops::quantized_linear_workspace_bytes(
                                            ops::kQuantizedGemvMaxRows, lw.packed, act_dtype_));
        return lw;
      }
    }
    lw.dense = load.load_fused(dense_rows());
    return lw;
  };
  auto norm = [&](const Tensor& t) {
    return load.load(c.norm_plus_one && t.defined() ? plus_one(t) : t);
  };
  embed_tokens_ = load.load(rows(w.dense_weight("model.embed_tokens.weight"), s.vocab0, s.vocab));
  // A MoE layer's experts, fused per layer from either checkpoint spelling (weight_spec.h's
  // ExpertLayout) and sliced like the dense MLP when sharded (every rank holds every expert's
  // columns [moe_inter0, moe_inter0 + moe_inter): tensor_parallel.h says why). FP8 block experts
  // stay packed where the Linears do and the device's MoE op runs them (unsharded: a rank's
  // moe_inter slice would cut blocks, so sharded models dequantize them as before).
  const bool packed_experts = want_packed && c.quantization.method == QuantMethod::kFp8Block &&
                              ops::moe_runs_fp8_experts(device_);
  auto load_moe = [&](LayerWeights& l, const std::string& p) {
    const MoeConfig& m = c.moe;
    const int64_t e = m.num_experts, h = c.hidden_size, mi = m.moe_intermediate_size;
    l.router = load.load(w.dense_weight(p + "mlp.gate.weight"));
    const bool fused = w.has_weight(p + "mlp.experts.gate_up_proj");
    std::vector<QuantizedWeight> q_gate, q_up, q_down;
    for (int64_t x = 0; packed_experts && x < e; ++x) {
      const std::string q = fmt::format("{}mlp.experts.{}.", p, x);
      auto it_g = w.quantized.find(q + "gate_proj.weight");
      auto it_u = w.quantized.find(q + "up_proj.weight");
      auto it_d = w.quantized.find(q + "down_proj.weight");
      if (it_g == w.quantized.end() || it_u == w.quantized.end() || it_d == w.quantized.end())
        break;
      q_gate.push_back(it_g->second);
      q_up.push_back(it_u->second);
      q_down.push_back(it_d->second);
    }
    if (static_cast<int64_t>(q_gate.size()) == e) {
      Fp8Experts f = fuse_fp8_experts(q_gate, q_up, q_down, c.quantization, p);
      QuantizedWeight gate_up, down;  // on the device in their own dtypes
      gate_up.method = down.method = QuantMethod::kFp8Block;
      gate_up.qweight = f.gate_up;
      gate_up.scales = f.gate_up_scales;
      down.qweight = f.down;
      down.scales = f.down_scales;
      gate_up = load.load_packed(gate_up);
      down = load.load_packed(down);
      l.experts_gate_up = gate_up.qweight;
      l.experts_down = down.qweight;
      l.experts_fp8.gate_up = gate_up.scales;
      l.experts_fp8.down = down.scales;
      l.experts_fp8.block_out = c.quantization.block_out;
      l.experts_fp8.block_in = c.quantization.block_in;
    } else if (fused && !sharded()) {
      l.experts_gate_up = load.load(w.dense_weight(p + "mlp.experts.gate_up_proj"));
      l.experts_down = load.load(w.dense_weight(p + "mlp.experts.down_proj"));
    } else {
      std::vector<Tensor> gate_up, down;
      for (int64_t x = 0; x < e; ++x) {
        Tensor g, u, d;
        if (fused) {
          Tensor gu = w.dense_weight(p + "mlp.experts.gate_up_proj").select(0, x);  // [2 mi, h]
          g = gu.slice(0, 0, mi);
          u = gu.slice(0, mi, 2 * mi);
          d = w.dense_weight(p + "mlp.experts.down_proj").select(0, x);  // [h, mi]
        } else {
          const std::string q = fmt::format("{}mlp.experts.{}.", p, x);
          g = w.dense_weight(q + "gate_proj.weight");
          u = w.dense_weight(q + "up_proj.weight");
          d = w.dense_weight(q + "down_proj.weight");
        }
        gate_up.push_back(rows(g, s.moe_inter0, s.moe_inter));
        gate_up.push_back(rows(u, s.moe_inter0, s.moe_inter));
        down.push_back(cols(d, s.moe_inter0, s.moe_inter));
      }
      l.experts_gate_up = load.load_fused(gate_up).view({e, 2 * s.moe_inter, h});
      l.experts_down = load.load_fused(down).view({e, h, s.moe_inter});
    }
    if (m.shared_expert_intermediate_size > 0) {
      auto shared_rows = [&](const Tensor& t) { return rows(t, s.shared_inter0, s.shared_inter); };
      l.shared_gate_up.dense =
          load.load_fused({shared_rows(w.dense_weight(p + "mlp.shared_expert.gate_proj.weight")),
                           shared_rows(w.dense_weight(p + "mlp.shared_expert.up_proj.weight"))});
      l.shared_down.dense = load.load(cols(w.dense_weight(p + "mlp.shared_expert.down_proj.weight"),
                                           s.shared_inter0, s.shared_inter));
      l.shared_expert_gate = load.load(w.dense_weight(p + "mlp.shared_expert_gate.weight"));
    }
  };
  LONGCTX_CHECK(!sharded() || !c.attn_output_gate, ErrorCode::kUnsupported,
                "tensor parallelism does not shard attention output gates ({})", c.architecture);
  // With an output gate q_proj's rows are [q_h, gate_h] per head: the fused projection takes
  // every head's q rows first and their gate rows after v, so q, k and v keep their places and
  // the gates are one more slice.
  auto q_and_gate_rows = [&](const Tensor& q_proj) {
    std::vector<Tensor> q, gate;
    for (int64_t h = 0; h < c.num_attention_heads; ++h) {
      q.push_back(q_proj.slice(0, 2 * h * d, (2 * h + 1) * d));
      gate.push_back(q_proj.slice(0, (2 * h + 1) * d, (2 * h + 2) * d));
    }
    return std::pair{q, gate};
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    auto get = [&](const std::string& name) { return w.dense_weight(p + name); };
    auto opt = [&](const std::string& name) { return optional_weight(w, p + name); };
    LayerWeights l;
    l.input_layernorm = norm(get("input_layernorm.weight"));
    const bool attention_layer = c.layer_type(i) != LayerAttention::kLinear;
    if (attention_layer && c.attn_output_gate) {
      const Tensor q_proj = get("self_attn.q_proj.weight");
      auto [q, gate] = q_and_gate_rows(q_proj);
      LONGCTX_CHECK(q_proj.size(0) == 2 * c.q_size(), ErrorCode::kInvalidArgument,
                    "layer {}: self_attn.q_proj.weight {} must have 2 x {} rows (q and its gate)",
                    i, q_proj.str(), c.q_size());
      std::vector<Tensor> parts = q;
      parts.push_back(get("self_attn.k_proj.weight"));
      parts.push_back(get("self_attn.v_proj.weight"));
      parts.insert(parts.end(), gate.begin(), gate.end());
      l.qkv_proj.dense = load.load_fused(parts);
    } else if (attention_layer) {
      l.qkv_proj =
          linear_weight({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                         p + "self_attn.v_proj.weight"},
                        [&] {
                          return std::vector<Tensor>{q_rows(get("self_attn.q_proj.weight")),
                                                     kv_rows(get("self_attn.k_proj.weight")),
                                                     kv_rows(get("self_attn.v_proj.weight"))};
                        });
    }
    Tensor q_bias = opt("self_attn.q_proj.bias"), k_bias = opt("self_attn.k_proj.bias"),
           v_bias = opt("self_attn.v_proj.bias");
    LONGCTX_CHECK(
        !c.attn_output_gate || !(q_bias.defined() || k_bias.defined() || v_bias.defined()),
        ErrorCode::kUnsupported, "layer {}: q/k/v biases beside an output gate", i);
    if (q_bias.defined() || k_bias.defined() || v_bias.defined())
      l.qkv_bias = load.load_fused({q_rows(q_bias), kv_rows(k_bias), kv_rows(v_bias)});
    // A linear-attention layer's token mixer is the architecture's (it loads those weights).
    if (attention_layer) {
      l.o_proj = linear_weight({p + "self_attn.o_proj.weight"}, [&] {
        return std::vector<Tensor>{
            cols(get("self_attn.o_proj.weight"), s.q_head0 * d, s.num_q_heads * d)};
      });
      l.o_bias = load.load(rank0(opt("self_attn.o_proj.bias")));
      l.q_norm = norm(opt("self_attn.q_norm.weight"));
      l.k_norm = norm(opt("self_attn.k_norm.weight"));
    }
    l.post_attention_layernorm = norm(get("post_attention_layernorm.weight"));
    if (c.sandwich_norms) {
      l.pre_feedforward_layernorm = norm(get("pre_feedforward_layernorm.weight"));
      l.post_feedforward_layernorm = norm(get("post_feedforward_layernorm.weight"));
    }
    if (c.is_moe_layer(i)) {
      load_moe(l, p);
      layers_.push_back(std::move(l));
      continue;
    }
    l.gate_up_proj = linear_weight({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, [&] {
      return std::vector<Tensor>{mlp_rows(get("mlp.gate_proj.weight")),
                                 mlp_rows(get("mlp.up_proj.weight"))};
    });
    Tensor gate_bias = opt("mlp.gate_proj.bias"), up_bias = opt("mlp.up_proj.bias");
    if (gate_bias.defined() || up_bias.defined())
      l.gate_up_bias = load.load_fused({mlp_rows(gate_bias), mlp_rows(up_bias)});
    l.down_proj = linear_weight({p + "mlp.down_proj.weight"}, [&] {
      return std::vector<Tensor>{cols(get("mlp.down_proj.weight"), s.inter0, s.inter)};
    });
    l.down_bias = load.load(rank0(opt("mlp.down_proj.bias")));
    layers_.push_back(std::move(l));
  }
  norm_ = norm(w.dense_weight("model.norm.weight"));
  lm_head_ = c.tie_word_embeddings
                 ? embed_tokens_
                 : load.load(rows(w.dense_weight("lm_head.weight"), s.vocab0, s.vocab));
  // Rounded like transformers' inv_freq buffer in a model loaded at that dtype (see model.h).
  const DType inv_dtype = options.rope_inv_freq_dtype.value_or(DType::kF32);
  auto frequencies = [&](const RopeConfig& r, ops::RopeFrequencies& f, Tensor& inv) {
    f = ops::rope_frequencies_as_transformers(r, c.head_dim, inv_dtype);
    inv = Tensor::from_blob(f.inv_freq.data(), {f.tables(), f.rotary_dim / 2}, DType::kF32)
              .to(device_);
  };
  frequencies(c.rope, rope_, inv_freq_);
  if (c.has_local_rope) frequencies(c.local_rope, local_rope_, local_inv_freq_);
  load.finish();
  if (workspace_bytes > 0) quant_workspace_ = Tensor::empty({workspace_bytes}, DType::kU8, device_);
}

Tensor DecoderModel::act_empty(const Shape& shape) const {
  return Tensor::empty(shape, act_dtype_, device_);
}

StepInputs DecoderModel::upload_inputs(const ForwardBatch& batch) const {
  StepInputs in;
  in.num_tokens = batch.num_tokens();
  auto view = [&](const void* data, int64_t n, DType dtype) {
    Tensor host = Tensor::from_blob(const_cast<void*>(data), {n}, dtype);
    return device_.is_cpu() ? host : host.to(device_);
  };
  in.input_ids = view(batch.input_ids.data(), in.num_tokens, DType::kI32);
  in.positions = view(batch.positions.data(), in.num_tokens, DType::kI64);
  in.qo_indptr = batch.qo_indptr;
  in.logits_indices = view(batch.logits_indices.data(),
                           static_cast<int64_t>(batch.logits_indices.size()), DType::kI32);
  if (rope_.select != ops::RopeSelect::kFixed) {
    // transformers picks longrope's table / dynamic NTK's base once per forward from
    // max(position_ids) + 1; a step holds many sequences, so each picks by its own length.
    Tensor lens = Tensor::empty({in.num_tokens}, DType::kI64);
    int64_t* l = lens.data<int64_t>();
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const int32_t a = batch.qo_indptr[s], b = batch.qo_indptr[s + 1];
      int64_t len = 0;
      for (int32_t t = a; t < b; ++t) len = std::max(len, batch.positions[t] + 1);
      std::fill(l + a, l + b, len);
    }
    in.rope_lens = device_.is_cpu() ? lens : lens.to(device_);
  }
  return in;
}

namespace {

// The bytes of a Linear's weight (dense rows or the packed tensors): what its GEMV reads.
double weight_bytes(const LinearWeight& w) {
  if (!w.is_packed()) return w.dense.defined() ? double(w.dense.nbytes()) : 0.0;
  double b = 0;
  for (const Tensor* t : {&w.packed.qweight, &w.packed.scales, &w.packed.qzeros, &w.packed.g_idx})
    if (t->defined()) b += double(t->nbytes());
  return b;
}

}  // namespace

Tensor DecoderModel::rms_norm(const Tensor& x, const Tensor& weight) const {
  Tensor out = act_empty(x.shape());
  ops::rms_norm(x, weight, static_cast<float>(config().rms_norm_eps), out);
  return out;
}

Tensor DecoderModel::add_rms_norm(const Tensor& x, const Tensor& residual,
                                  const Tensor& weight) const {
  Tensor out = act_empty(x.shape());
  ops::add_rms_norm(x, residual, weight, static_cast<float>(config().rms_norm_eps), out);
  return out;
}

Tensor DecoderModel::linear(const Tensor& x, const Tensor& weight, const Tensor& bias) const {
  Tensor out = act_empty({x.size(0), weight.size(0)});
  ops::linear(x, weight, bias, out);
  return out;
}

Tensor DecoderModel::linear(const Tensor& x, const LinearWeight& weight, const Tensor& bias) const {
  if (!weight.is_packed()) return linear(x, weight.dense, bias);
  Tensor out = act_empty({x.size(0), weight.packed.out_features});
  ops::quantized_linear(x, weight.packed, config_.quantization, bias, out, quant_workspace_);
  return out;
}

DecoderModel::QKV DecoderModel::split_qkv(const Tensor& qkv) const {
  const ModelConfig& c = config();
  const int64_t d = c.head_dim, hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  QKV r;
  r.q = qkv.slice(1, 0, hq * d).unflatten(1, {hq, d});
  r.k = qkv.slice(1, hq * d, (hq + hkv) * d).unflatten(1, {hkv, d});
  r.v = qkv.slice(1, (hq + hkv) * d, (hq + 2 * hkv) * d).unflatten(1, {hkv, d});
  r.qk = qkv.slice(1, 0, (hq + hkv) * d).unflatten(1, {hq + hkv, d});
  return r;
}

Tensor DecoderModel::gated_mlp(const Tensor& x, const LayerWeights& w) const {
  if (w.router.defined()) return sparse_moe_block(x, w);
  return gated_mlp(x, w.gate_up_proj, w.gate_up_bias, w.down_proj, w.down_bias);
}

Tensor DecoderModel::gated_mlp(const Tensor& x, const LinearWeight& gate_up_proj,
                               const Tensor& gate_up_bias, const LinearWeight& down_proj,
                               const Tensor& down_bias, const MlpMarks& marks) const {
  Tensor gate_up = linear(x, gate_up_proj, gate_up_bias);  // [T, 2 intermediate]
  mark(marks.gate_up, weight_bytes(gate_up_proj));
  const int64_t inter = gate_up.size(1) / 2;
  Tensor act = act_empty({x.size(0), inter});
  if (config().hidden_act == HiddenAct::kGeluTanh)
    ops::gelu_tanh_and_mul(gate_up.slice(1, 0, inter), gate_up.slice(1, inter, 2 * inter), act);
  else
    ops::silu_and_mul(gate_up.slice(1, 0, inter), gate_up.slice(1, inter, 2 * inter), act);
  mark(marks.act);
  Tensor out = linear(act, down_proj, down_bias);
  mark(marks.down, weight_bytes(down_proj));
  return out;
}

Tensor DecoderModel::sparse_moe_block(const Tensor& x, const LayerWeights& w) const {
  const MoeConfig& m = config().moe;
  const int64_t t = x.size(0);
  // router_logits = gate(x); softmax in fp32, top-k, renormalized when norm_topk_prob
  Tensor logits = Tensor::empty({t, m.num_experts}, DType::kF32, device_);
  ops::linear(x, w.router, Tensor(), logits);
  mark("router", double(w.router.nbytes()));
  ops::MoeArgs a;
  a.x = x;
  a.topk_ids = Tensor::empty({t, m.num_experts_per_tok}, DType::kI32, device_);
  a.topk_weights = Tensor::empty({t, m.num_experts_per_tok}, DType::kF32, device_);
  a.gate_up = w.experts_gate_up;
  a.down = w.experts_down;
  a.gate_up_scales = w.experts_fp8.gate_up;
  a.down_scales = w.experts_fp8.down;
  a.block_out = w.experts_fp8.block_out;
  a.block_in = w.experts_fp8.block_in;
  if (w.shared_gate_up.defined()) {
    // Qwen2MoeSparseMoeBlock: + sigmoid(shared_expert_gate(x)) * shared_expert(x), added by the
    // experts' combine
    a.shared = gated_mlp(x, w.shared_gate_up, Tensor(), w.shared_down, Tensor(),
                         {"shared_gate_up", "shared_act_and_mul", "shared_down"});
    a.shared_gate = Tensor::empty({t, 1}, DType::kF32, device_);
    ops::linear(x, w.shared_expert_gate, Tensor(), a.shared_gate);
    mark("shared_expert_gate", double(w.shared_expert_gate.nbytes()));
  }
  a.out = act_empty({t, x.size(1)});
  ops::moe_forward(logits, m.norm_topk_prob, a);  // routes, then the experts (fused at decode)
  // The experts the step's tokens route to, expected under uniform routing: one token reads k of
  // E experts, T tokens 1 - (1 - k / E)^T of them.
  const double unrouted =
      std::pow(1.0 - double(m.num_experts_per_tok) / double(m.num_experts), double(t));
  mark("moe_experts",
       (1.0 - unrouted) * double(w.experts_gate_up.nbytes() + w.experts_down.nbytes() +
                                 (w.experts_fp8.defined()
                                      ? w.experts_fp8.gate_up.nbytes() + w.experts_fp8.down.nbytes()
                                      : 0)));
  return a.out;
}

ops::RopeArgs DecoderModel::rope_args(const StepInputs& in, int64_t i) const {
  if (config().has_local_rope && config().layer_type(i) == LayerAttention::kSliding)
    return ops::rope_args(local_rope_, local_inv_freq_, Tensor());
  return ops::rope_args(rope_, inv_freq_, in.rope_lens);
}

void DecoderModel::apply_rope(const Tensor& x, const StepInputs& in, int64_t i) const {
  ops::rope(x, in.positions, rope_args(in, i));
}

Tensor DecoderModel::forward(const ForwardBatch& batch, AttentionBackend& attention) {
  const ModelConfig& c = config();
  batch.validate(c.vocab_size, c.max_positions());
  attention.plan(batch);
  StepInputs in = upload_inputs(batch);
  Tensor logits = Tensor::empty({in.logits_indices.numel(), c.vocab_size}, DType::kF32, device_);
  run_layers(in, attention, logits);
  return logits;
}

void DecoderModel::forward_on_device(const Tensor& input_ids, const Tensor& positions,
                                     const Tensor& logits_indices, AttentionBackend& attention,
                                     const Tensor& logits) {
  const int64_t t = input_ids.numel(), r = logits_indices.numel();
  auto on_device = [&](const Tensor& x, DType dtype, int64_t n) {
    return x.defined() && x.device() == device_ && x.dtype() == dtype && x.rank() == 1 &&
           x.is_contiguous() && x.numel() == n;
  };
  LONGCTX_CHECK(t > 0 && on_device(input_ids, DType::kI32, t) &&
                    on_device(positions, DType::kI64, t) &&
                    on_device(logits_indices, DType::kI32, r),
                ErrorCode::kInvalidArgument,
                "forward_on_device: ids {}, positions {}, logits rows {} must be contiguous "
                "[T] i32, [T] i64, [R] i32 on {}",
                input_ids.str(), positions.str(), logits_indices.str(), device_.str());
  LONGCTX_CHECK(
      logits.defined() && logits.device() == device_ && logits.dtype() == DType::kF32 &&
          logits.rank() == 2 && logits.size(0) == r && logits.size(1) == config_.vocab_size,
      ErrorCode::kInvalidArgument, "forward_on_device: logits must be [{}, {}] f32 on {}, got {}",
      r, config_.vocab_size, device_.str(), logits.str());
  run_layers(StepInputs{t, input_ids, positions, logits_indices}, attention, logits);
}

void DecoderModel::run_layers(const StepInputs& in, AttentionBackend& attention,
                              const Tensor& logits) {
  const ModelConfig& c = config();
  mark("plan_and_inputs");  // forward()'s plan and uploads, from the caller's first event
  Tensor residual = Tensor::empty({in.num_tokens, c.hidden_size}, DType::kF32, device_);
  embed(in, residual);
  mark("embed");
  Tensor mlp_out;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    decoder_layer(i, residual, mlp_out, in, attention);
  final_logits(residual, mlp_out, in, logits);  // norm, lm_head
}

void DecoderModel::decoder_layer(int64_t i, Tensor& residual, Tensor& mlp_out, const StepInputs& in,
                                 AttentionBackend& attention) {
  const LayerWeights& w = layers_[i];
  // hidden_states = input_layernorm(residual + previous mlp output)
  Tensor h = mlp_out.defined() ? add_rms_norm(mlp_out, residual, w.input_layernorm)
                               : rms_norm(residual, w.input_layernorm);
  mark("input_norm");
  h = self_attn(h, i, in, attention);
  reduce(h);  // o_proj is row-parallel
  if (sharded()) mark("all_reduce");
  // hidden_states = post_attention_layernorm(residual + attention output)
  h = add_rms_norm(h, residual, w.post_attention_layernorm);
  mark("post_norm");
  mlp_out = gated_mlp(h, w);
  reduce(mlp_out);  // down_proj is row-parallel
  if (sharded()) mark("all_reduce");
}

void DecoderModel::embed(const StepInputs& in, const Tensor& residual) const {
  const float scale = static_cast<float>(config().embed_scale);
  if (!sharded()) {
    ops::embedding(in.input_ids, embed_tokens_, residual, scale);
    return;
  }
  // Vocab-parallel: the rank's rows, zeros for ids another rank holds, summed over the ranks.
  ops::embedding_shard(in.input_ids, embed_tokens_, shard_.vocab0, residual, scale);
  comm_->all_reduce_sum(residual);
}

void DecoderModel::reduce(const Tensor& x) const {
  if (sharded()) comm_->all_reduce_sum(x);
}

Tensor DecoderModel::self_attn(const Tensor& hidden_states, int64_t i, const StepInputs& in,
                               AttentionBackend& attention) {
  const LayerWeights& w = layers_[i];
  Tensor qkv = linear(hidden_states, w.qkv_proj, w.qkv_bias);
  mark("qkv_proj", weight_bytes(w.qkv_proj));
  QKV s = split_qkv(qkv);
  if (config().qk_norm) {
    // Qwen3, Gemma 3: RMSNorm over each head of q and k (q_norm, k_norm), then RoPE; one op
    ops::qk_norm_rope(s.qk, config().num_attention_heads, w.q_norm, w.k_norm,
                      static_cast<float>(config().rms_norm_eps), in.positions, rope_args(in, i));
    mark("qk_norm_rope");
  } else {
    apply_rope(s.qk, in, i);
    mark("rope");
  }
  attention.store_kv(i, s.k, s.v);
  mark("kv_store");
  Tensor attn_output = attention.attend(i, s.q);
  mark("attention");                // its KV bytes: the caller knows the lengths
  if (config().attn_output_gate) {  // Qwen3NextAttention: attn_output * sigmoid(gate)
    const int64_t gate0 = config().q_size() + 2 * config().kv_size();
    ops::sigmoid_and_mul(qkv.slice(1, gate0, gate0 + config().q_size()), attn_output, attn_output);
    mark("attn_gate");
  }
  Tensor out = linear(attn_output, w.o_proj, w.o_bias);
  mark("o_proj", weight_bytes(w.o_proj));
  return out;
}

void DecoderModel::final_logits(const Tensor& residual, const Tensor& mlp_out, const StepInputs& in,
                                const Tensor& logits) const {
  const int64_t rows = in.logits_indices.numel();
  if (rows == 0) return;  // a prefill chunk that ends before the prompt does
  Tensor res_rows = Tensor::empty({rows, residual.size(1)}, DType::kF32, device_);
  Tensor mlp_rows = act_empty({rows, mlp_out.size(1)});
  ops::gather_rows(residual, in.logits_indices, res_rows);
  ops::gather_rows(mlp_out, in.logits_indices, mlp_rows);
  Tensor h = add_rms_norm(mlp_rows, res_rows, norm_);
  mark("final_norm");
  if (!sharded()) {
    ops::linear(h, lm_head_, Tensor(), logits);
    mark("lm_head", double(lm_head_.nbytes()));
    return;
  }
  Tensor local = Tensor::empty({rows, shard_.vocab}, DType::kF32, device_);  // vocab-parallel
  if (shard_.vocab > 0) ops::linear(h, lm_head_, Tensor(), local);
  comm_->all_gather_columns(local, logits);
}

}  // namespace longctx::models
