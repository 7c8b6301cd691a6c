// Tiny random mixture-of-experts checkpoints written from C++ in the Hugging Face layout
// (config.json, safetensors, optionally sharded with model.safetensors.index.json), with the
// routed experts spelled per expert (what Qwen ships) or fused (transformers 5's parameters).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"

namespace longctx::testing {

// Qwen3-MoE (8 experts, top 2, norm_topk_prob, layer 1 dense) or, with `shared_expert`, Qwen2-MoE
// (8 experts, top 2, no renormalization, a shared expert with its gate, q/k/v biases).
inline nlohmann::json tiny_moe_config_json(bool shared_expert) {
  nlohmann::json j = {
      {"architectures", {shared_expert ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM"}},
      {"model_type", shared_expert ? "qwen2_moe" : "qwen3_moe"},
      {"vocab_size", 320},
      {"hidden_size", 48},
      {"intermediate_size", 80},
      {"moe_intermediate_size", 24},
      {"num_experts", 8},
      {"num_experts_per_tok", 2},
      {"norm_topk_prob", !shared_expert},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", shared_expert ? nlohmann::json::array() : nlohmann::json::array({1})},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 16},
      {"max_position_embeddings", 2048},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 1e6},
      {"tie_word_embeddings", false},
      {"dtype", "float32"},
      {"bos_token_id", 1},
      {"eos_token_id", 2}};
  if (shared_expert) j["shared_expert_intermediate_size"] = 40;
  return j;
}

// The weights of `config` (fused expert spelling), uniform in +-0.1 (routers +-1, so routing is
// far from uniform; norms near 1), deterministic in `seed`.
inline std::map<std::string, Tensor> tiny_moe_weights(const ModelConfig& config, uint32_t seed) {
  Checkpoint ck = make_dummy_checkpoint(config, seed);  // the names and shapes
  std::map<std::string, Tensor> w;
  std::mt19937 rng(seed);
  for (const auto& [name, t0] : ck.weights.all()) {
    Tensor t = Tensor::empty(t0.shape(), DType::kF32);
    const bool norm = name.ends_with("norm.weight");
    const float scale = name.ends_with("mlp.gate.weight") ? 1.0f : 0.1f;
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = norm ? 1.0f + 0.1f * d(rng) : scale * d(rng);
    w.emplace(name, t);
  }
  return w;
}

// The same weights with each fused expert tensor split into per-expert ones.
inline std::map<std::string, Tensor> per_expert_weights(
    const std::map<std::string, Tensor>& fused) {
  std::map<std::string, Tensor> w;
  for (const auto& [name, t] : fused) {
    const std::string gu = "mlp.experts.gate_up_proj", dn = "mlp.experts.down_proj";
    if (name.ends_with(gu)) {
      const std::string p = name.substr(0, name.size() - std::strlen("gate_up_proj"));
      const int64_t n = t.size(1) / 2;
      for (int64_t e = 0; e < t.size(0); ++e) {
        Tensor x = t.select(0, e);
        w.emplace(p + std::to_string(e) + ".gate_proj.weight", x.slice(0, 0, n).contiguous());
        w.emplace(p + std::to_string(e) + ".up_proj.weight", x.slice(0, n, 2 * n).contiguous());
      }
    } else if (name.ends_with(dn)) {
      const std::string p = name.substr(0, name.size() - std::strlen("down_proj"));
      for (int64_t e = 0; e < t.size(0); ++e)
        w.emplace(p + std::to_string(e) + ".down_proj.weight", t.select(0, e).contiguous());
    } else {
      w.emplace(name, t);
    }
  }
  return w;
}

// Writes f32 or bf16 tensors as one safetensors file.
inline void write_safetensors_file(const std::filesystem::path& path,
                                   const std::vector<std::pair<std::string, Tensor>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LONGCTX_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16,
                  ErrorCode::kInvalidArgument, "write_safetensors_file: '{}' is not f32 or bf16",
                  name);
    header[name] = {{"dtype", t.dtype() == DType::kBF16 ? "BF16" : "F32"},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + static_cast<int64_t>(t.nbytes())}}};
    offset += static_cast<int64_t>(t.nbytes());
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
}

// A checkpoint folder: config.json and the weights in `shards` files (1: model.safetensors;
// more: model-0000i-of-0000n.safetensors and the index), tensors dealt round-robin.
inline void write_checkpoint_dir(const std::filesystem::path& dir, const nlohmann::json& config,
                                 const std::map<std::string, Tensor>& weights, int shards) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  std::vector<std::vector<std::pair<std::string, Tensor>>> files(shards);
  nlohmann::json map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, t] : weights) {
    const int s = i++ % shards;
    files[s].emplace_back(name, t);
    map[name] =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
  }
  if (shards == 1) {
    write_safetensors_file(dir / "model.safetensors", files[0]);
    return;
  }
  for (int s = 0; s < shards; ++s)
    write_safetensors_file(dir / ("model-0000" + std::to_string(s + 1) + "-of-0000" +
                                  std::to_string(shards) + ".safetensors"),
                           files[s]);
  std::ofstream(dir / "model.safetensors.index.json")
      << nlohmann::json({{"metadata", nlohmann::json::object()}, {"weight_map", map}}).dump(2);
}

}  // namespace longctx::testing
