#include "loader/weight_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "loader/quantized_weights.h"
#include "longctx/core/error.h"

namespace longctx {

ExpertLayout detect_expert_layout(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (n.ends_with(".mlp.experts.gate_up_proj")) return ExpertLayout::kFused;
  return ExpertLayout::kPerExpert;
}

ExpertLayout quantized_expert_layout(const QuantConfig& q) {
  return q.method == QuantMethod::kFp8Block ? ExpertLayout::kPerExpert : ExpertLayout::kFused;
}

std::map<std::string, Shape> expected_weights(const ModelConfig& c, ExpertLayout experts) {
  std::map<std::string, Shape> w;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  w["model.embed_tokens.weight"] = {c.vocab_size, h};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    w[l + "input_layernorm.weight"] = {h};
    w[l + "post_attention_layernorm.weight"] = {h};
    if (c.layer_type(i) == LayerAttention::kLinear) {
      // Qwen3NextGatedDeltaNet: in projections (q, k, v, z and b, a), the depthwise conv over
      // q, k, v, the decay's A_log and dt_bias, the gated norm, out_proj. Qwen3-Next stores the
      // projections in two, rows grouped per key head; Qwen3.5 in four, head-major.
      const LinearAttentionConfig& a = c.linear;
      const int64_t key_dim = a.num_key_heads * a.key_head_dim;
      const int64_t value_dim = a.num_value_heads * a.value_head_dim;
      const std::string p = l + "linear_attn.";
      switch (a.projections) {
        case LinearProjLayout::kGroupedByKeyHead:
          w[p + "in_proj_qkvz.weight"] = {2 * key_dim + 2 * value_dim, h};
          w[p + "in_proj_ba.weight"] = {2 * a.num_value_heads, h};
          break;
        case LinearProjLayout::kSplit:
          w[p + "in_proj_qkv.weight"] = {2 * key_dim + value_dim, h};
          w[p + "in_proj_z.weight"] = {value_dim, h};
          w[p + "in_proj_b.weight"] = {a.num_value_heads, h};
          w[p + "in_proj_a.weight"] = {a.num_value_heads, h};
          break;
      }
      w[p + "conv1d.weight"] = {2 * key_dim + value_dim, 1, a.conv_kernel_dim};
      w[p + "A_log"] = {a.num_value_heads};
      w[p + "dt_bias"] = {a.num_value_heads};
      w[p + "norm.weight"] = {a.value_head_dim};
      w[p + "out_proj.weight"] = {h, value_dim};
    } else {
      // With an output gate q_proj emits q and the gate.
      w[l + "self_attn.q_proj.weight"] = {c.attn_output_gate ? 2 * q : q, h};
      w[l + "self_attn.k_proj.weight"] = {kv, h};
      w[l + "self_attn.v_proj.weight"] = {kv, h};
      w[l + "self_attn.o_proj.weight"] = {h, q};
      if (c.qk_norm) {
        w[l + "self_attn.q_norm.weight"] = {c.head_dim};
        w[l + "self_attn.k_norm.weight"] = {c.head_dim};
      }
    }
    if (c.attention_bias) {
      w[l + "self_attn.q_proj.bias"] = {q};
      w[l + "self_attn.k_proj.bias"] = {kv};
      w[l + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.o_proj_bias) w[l + "self_attn.o_proj.bias"] = {h};
    if (c.sandwich_norms) {
      w[l + "pre_feedforward_layernorm.weight"] = {h};
      w[l + "post_feedforward_layernorm.weight"] = {h};
    }
    if (c.is_moe_layer(i)) {
      const MoeConfig& m = c.moe;
      const int64_t e = m.num_experts, mi = m.moe_intermediate_size;
      w[l + "mlp.gate.weight"] = {e, h};  // the router
      if (experts == ExpertLayout::kFused) {
        w[l + "mlp.experts.gate_up_proj"] = {e, 2 * mi, h};
        w[l + "mlp.experts.down_proj"] = {e, h, mi};
      } else {
        for (int64_t x = 0; x < e; ++x) {
          const std::string p = fmt::format("{}mlp.experts.{}.", l, x);
          w[p + "gate_proj.weight"] = {mi, h};
          w[p + "up_proj.weight"] = {mi, h};
          w[p + "down_proj.weight"] = {h, mi};
        }
      }
      if (const int64_t si = m.shared_expert_intermediate_size; si > 0) {
        w[l + "mlp.shared_expert.gate_proj.weight"] = {si, h};
        w[l + "mlp.shared_expert.up_proj.weight"] = {si, h};
        w[l + "mlp.shared_expert.down_proj.weight"] = {h, si};
        w[l + "mlp.shared_expert_gate.weight"] = {1, h};
      }
      continue;
    }
    w[l + "mlp.gate_proj.weight"] = {inter, h};
    w[l + "mlp.up_proj.weight"] = {inter, h};
    w[l + "mlp.down_proj.weight"] = {h, inter};
    if (c.mlp_bias) {
      w[l + "mlp.gate_proj.bias"] = {inter};
      w[l + "mlp.up_proj.bias"] = {inter};
      w[l + "mlp.down_proj.bias"] = {h};
    }
  }
  w["model.norm.weight"] = {h};
  if (!c.tie_word_embeddings) w["lm_head.weight"] = {c.vocab_size, h};
  return w;
}

bool is_ignorable_weight(const std::string& name, const ModelConfig& c) {
  if (name.ends_with(".rotary_emb.inv_freq")) return true;
  // A multimodal wrapper's vision tower, a multi-token-prediction head: only the text model runs.
  for (const std::string& p : c.unused_weight_prefixes)
    if (name.starts_with(p)) return true;
  return c.tie_word_embeddings && name == "lm_head.weight";
}

namespace {

// A checkpoint name under the name expected_weights() uses (a multimodal checkpoint's text model
// under model.* / lm_head.*).
std::string canonical_name(const std::string& raw_name) {
  for (auto [from, to] : {std::pair{"model.language_model.", "model."},
                          {"language_model.model.", "model."},
                          {"language_model.lm_head.", "lm_head."}})
    if (raw_name.starts_with(from)) return to + raw_name.substr(std::string(from).size());
  return raw_name;
}

// The parts (name, rows) of fused Linear `name` (canonical), or none when it is not fused.
std::vector<std::pair<std::string, int64_t>> fused_parts(const std::string& name,
                                                         const ModelConfig& c) {
  auto prefix = [&](const char* tail) { return name.substr(0, name.size() - std::strlen(tail)); };
  if (name.ends_with(".self_attn.qkv_proj.weight")) {
    const std::string p = prefix("qkv_proj.weight");
    return {{p + "q_proj.weight", c.q_size()},
            {p + "k_proj.weight", c.kv_size()},
            {p + "v_proj.weight", c.kv_size()}};
  }
  if (name.ends_with(".mlp.gate_up_proj.weight")) {
    const std::string p = prefix("gate_up_proj.weight");
    return {{p + "gate_proj.weight", c.intermediate_size},
            {p + "up_proj.weight", c.intermediate_size}};
  }
  return {};
}

void check_fused_rows(const std::string& name, const Shape& shape,
                      const std::vector<std::pair<std::string, int64_t>>& parts) {
  int64_t total = 0;
  for (const auto& [n, r] : parts) total += r;
  LONGCTX_CHECK(shape.size() == 2 && shape[0] == total, ErrorCode::kInvalidArgument,
                "tensor '{}' has shape {}, but the config implies [{}, hidden] (fused {})", name,
                shape_to_string(shape), total, parts.size() == 3 ? "q, k, v" : "gate, up");
}

// Rows of fused `t` split at `rows` (each part a view of the same bytes) under `names`.
void split_rows(WeightStore& out, const std::string& name, const Tensor& t,
                const std::vector<std::pair<std::string, int64_t>>& parts) {
  check_fused_rows(name, t.shape(), parts);
  int64_t row = 0;
  for (const auto& [n, r] : parts) {
    out.add(n, t.slice(0, row, row + r));
    row += r;
  }
}

}  // namespace

WeightStore canonical_weights(const WeightStore& raw, const ModelConfig& c) {
  WeightStore out;
  for (const auto& [raw_name, t] : raw.all()) {
    const std::string name = canonical_name(raw_name);
    if (auto parts = fused_parts(name, c); !parts.empty())
      split_rows(out, raw_name, t, parts);
    else
      out.add(name, t);  // throws if two spellings of one tensor are both present
  }
  return out;
}

std::map<std::string, QuantizedWeight> canonical_quantized(
    const std::map<std::string, QuantizedWeight>& raw, const ModelConfig& c, WeightStore& dense) {
  std::map<std::string, QuantizedWeight> out;
  auto add = [&](const std::string& name, QuantizedWeight w) {
    LONGCTX_CHECK(out.emplace(name, std::move(w)).second, ErrorCode::kInvalidArgument,
                  "quantized weight '{}' given twice (under two spellings)", name);
  };
  for (const auto& [raw_name, w] : raw) {
    const std::string name = canonical_name(raw_name);
    const auto parts = fused_parts(name, c);
    if (parts.empty()) {
      add(name, w);
      continue;
    }
    check_fused_rows(raw_name, {w.out_features, w.in_features}, parts);
    std::vector<QuantizedWeight> split;
    int64_t row = 0;
    for (const auto& [n, r] : parts) {
      split.push_back(slice_quantized(w, c.quantization, row, r));
      row += r;
    }
    if (std::all_of(split.begin(), split.end(),
                    [](const QuantizedWeight& p) { return p.method != QuantMethod::kNone; })) {
      for (size_t i = 0; i < parts.size(); ++i) add(parts[i].first, std::move(split[i]));
      continue;
    }
    // A split the format cannot make (an FP8 scale block that a part ends inside): the parts
    // are row views of the whole projection dequantized, the only dense copy a quantized
    // checkpoint keeps.
    split_rows(dense, raw_name, dequantize(w, c.quantization, c.dtype), parts);
  }
  return out;
}

}  // namespace longctx
