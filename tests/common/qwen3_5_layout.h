// tiny-qwen3-next's checkpoint rewritten in Qwen3.5's layouts, the same model under Qwen3.5's
// names: Qwen3_5GatedDeltaNet's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (head-major) in
// place of Qwen3-Next's in_proj_qkvz / in_proj_ba (rows grouped per key head), the config as
// Qwen3_5MoeTextConfig writes it, and optionally the multimodal wrapper's (text_config nested,
// weights under model.language_model.*, a vision tower's and an MTP head's tensors beside them).
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/moe_checkpoint.h"
#include "common/test_data.h"
#include "longctx/loader/checkpoint.h"

namespace longctx::testing {

// Rows [begin, end) of each range of `t` [rows, cols], stacked in order into a new tensor.
inline Tensor gather_rows(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t rows = 0;
  for (auto [b, e] : ranges) rows += e - b;
  Tensor out = Tensor::empty({rows, t.size(1)}, t.dtype());
  int64_t at = 0;
  for (auto [b, e] : ranges) {
    out.slice(0, at, at + e - b).copy_from(t.slice(0, b, e));
    at += e - b;
  }
  return out;
}

// tiny-qwen3-next's tensors under Qwen3.5's names: each linear layer's in_proj_qkvz rows, grouped
// per key head g as [q_g, k_g, v_g, z_g], regrouped into in_proj_qkv = [q, k, v] and
// in_proj_z = z (head-major); in_proj_ba's [b_g, a_g] into in_proj_b and in_proj_a.
inline std::map<std::string, Tensor> qwen3_5_weights(const Checkpoint& next) {
  const ModelConfig& c = next.config;
  const LinearAttentionConfig& l = c.linear;
  const int64_t hk = l.num_key_heads, dk = l.key_head_dim, r = l.num_value_heads / hk,
                dv = l.value_head_dim, group = 2 * dk + 2 * r * dv;
  std::map<std::string, Tensor> w;
  for (const auto& [name, t] : next.weights.all()) {
    const std::string qkvz = "linear_attn.in_proj_qkvz.weight",
                      ba = "linear_attn.in_proj_ba.weight";
    if (name.ends_with(qkvz)) {
      const std::string p = name.substr(0, name.size() - qkvz.size()) + "linear_attn.";
      // Per key head: q at [0, dk), k at [dk, 2 dk), v at [2 dk, 2 dk + r dv), z after v.
      auto part = [&](int64_t off, int64_t n) {
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (int64_t g = 0; g < hk; ++g) ranges.push_back({g * group + off, g * group + off + n});
        return ranges;
      };
      std::vector<std::pair<int64_t, int64_t>> qkv = part(0, dk);
      for (auto range : part(dk, dk)) qkv.push_back(range);
      for (auto range : part(2 * dk, r * dv)) qkv.push_back(range);
      w[p + "in_proj_qkv.weight"] = gather_rows(t, qkv);
      w[p + "in_proj_z.weight"] = gather_rows(t, part(2 * dk + r * dv, r * dv));
    } else if (name.ends_with(ba)) {
      const std::string p = name.substr(0, name.size() - ba.size()) + "linear_attn.";
      std::vector<std::pair<int64_t, int64_t>> b, a;
      for (int64_t g = 0; g < hk; ++g) {
        b.push_back({g * 2 * r, g * 2 * r + r});
        a.push_back({g * 2 * r + r, g * 2 * r + 2 * r});
      }
      w[p + "in_proj_b.weight"] = gather_rows(t, b);
      w[p + "in_proj_a.weight"] = gather_rows(t, a);
    } else {
      w[name] = t;
    }
  }
  return w;
}

// tiny-qwen3-next's config.json as Qwen3_5MoeTextConfig writes it: no intermediate_size,
// norm_topk_prob, decoder_sparse_step or mlp_only_layers (the class deletes them), the rope
// parameters with Qwen3-VL's multimodal sections.
inline nlohmann::json qwen3_5_moe_text_config() {
  std::ifstream f(test_data_dir() + "/fixtures/tiny-qwen3-next/config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  j["architectures"] = {"Qwen3_5MoeForCausalLM"};
  j["model_type"] = "qwen3_5_moe_text";
  for (const char* key :
       {"intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
    j.erase(key);
  j["rope_parameters"]["mrope_section"] = {2, 1, 1};
  j["rope_parameters"]["mrope_interleaved"] = true;
  return j;
}

// The multimodal wrapper around `text`: text_config nested (dtype and token ids at the top, as
// the Hub's files have them), the text model's weights under model.language_model.*, lm_head at
// the top, plus a vision tower's and an MTP head's tensors the text model must not need.
inline std::pair<nlohmann::json, std::map<std::string, Tensor>> as_multimodal(
    nlohmann::json text, const std::map<std::string, Tensor>& w) {
  nlohmann::json top = {
      {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
      {"model_type", "qwen3_5_moe"},
      {"dtype", text["dtype"]},
      {"tie_word_embeddings", false},
      {"image_token_id", 248056},
      {"vision_config", {{"depth", 1}, {"hidden_size", 32}, {"out_hidden_size", 64}}}};
  for (const char* key : {"dtype", "architectures", "tie_word_embeddings"}) text.erase(key);
  top["text_config"] = text;
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : w)
    out[name.starts_with("model.") ? "model.language_model." + name.substr(6) : name] = t;
  out["model.visual.patch_embed.proj.weight"] = Tensor::zeros({32, 3, 2, 4, 4}, DType::kBF16);
  out["model.visual.merger.linear_fc2.weight"] = Tensor::zeros({64, 128}, DType::kBF16);
  out["mtp.fc.weight"] = Tensor::zeros({64, 128}, DType::kBF16);
  return {top, out};
}

// tiny-qwen3-next (`next`, loaded) written to `dir` as Qwen3_5MoeForCausalLM or, with
// `multimodal`, as Qwen3_5MoeForConditionalGeneration.
inline void write_qwen3_5_checkpoint(const std::filesystem::path& dir, const Checkpoint& next,
                                     bool multimodal) {
  if (!multimodal) {
    write_checkpoint_dir(dir, qwen3_5_moe_text_config(), qwen3_5_weights(next), 1);
    return;
  }
  auto [config, weights] = as_multimodal(qwen3_5_moe_text_config(), qwen3_5_weights(next));
  write_checkpoint_dir(dir, config, weights, 1);
}

}  // namespace longctx::testing
