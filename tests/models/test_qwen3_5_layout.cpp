// Qwen3.5's checkpoint layouts without transformers: tiny-qwen3-next's weights rewritten as
// Qwen3.5 stores them (Qwen3_5GatedDeltaNet's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, head-
// major, in place of Qwen3-Next's in_proj_qkvz / in_proj_ba grouped per key head) compute the
// same model, so loaded as Qwen3_5MoeForCausalLM, and as the text model of
// Qwen3_5MoeForConditionalGeneration (config under text_config, weights under
// model.language_model.*, a vision tower and an MTP head beside them), they must give
// tiny-qwen3-next's logits bit for bit and transformers' within the fixture tolerance. A wrong
// un-interleaving (the value heads' order, b and a swapped) moves the logits by whole units.
// Checkpoints that disagree with the config are refused naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/moe_checkpoint.h"
#include "longctx/core/error.h"
#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kNext = "tiny-qwen3-next";

// Rows [begin, end) of each range of `t` [rows, cols], stacked in order into a new tensor.
Tensor gather_rows(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
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
std::map<std::string, Tensor> qwen3_5_weights(const Checkpoint& next) {
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
json qwen3_5_moe_text_config() {
  std::ifstream f(fixture_dir(kNext) + "/config.json");
  json j = json::parse(f);
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
std::pair<json, std::map<std::string, Tensor>> as_multimodal(
    json text, const std::map<std::string, Tensor>& w) {
  json top = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
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

class Qwen3_5Layout : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("longctx_qwen3_5_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    next_ = std::make_shared<Checkpoint>(load_checkpoint(fixture_dir(kNext)));
    weights_ = qwen3_5_weights(*next_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The fixture's reference was made with float32 inv_freq (reference.json): so are these.
  static ModelBuildOptions options() {
    ModelBuildOptions o;
    o.rope_inv_freq_dtype = DType::kF32;
    return o;
  }

  std::string write(const std::string& name, const json& config,
                    const std::map<std::string, Tensor>& weights) {
    const fs::path d = dir_ / name;
    write_checkpoint_dir(d, config, weights, 1);
    return d.string();
  }

  // Equal to tiny-qwen3-next's logits bit for bit (the same rows fused in the same order), and
  // so to transformers' within the fixture tolerance, at every case length; the greedy
  // continuations transformers made.
  void expect_same_model(const std::string& dir) {
    auto ours = create_model(std::make_shared<Checkpoint>(load_checkpoint(dir)), options());
    auto next = create_model(next_, options());
    for (int64_t len : {1, 7, 64, 515}) {
      ReferenceCase ref = reference_case(kNext, len);
      Tensor a = full_forward(*ours, ref.input_ids), b = full_forward(*next, ref.input_ids);
      ASSERT_EQ(a.shape(), b.shape());
      EXPECT_EQ(max_abs_diff(a.data<float>(), b.data<float>(), a.numel()), 0.0) << len;
      EXPECT_LE(max_logit_error(a, ref), 1e-3) << len;
    }
    expect_greedy_matches(*ours, kNext, 7);
  }

  fs::path dir_;
  std::shared_ptr<const Checkpoint> next_;
  std::map<std::string, Tensor> weights_;
};

TEST_F(Qwen3_5Layout, TextModelComputesTinyQwen3Next) {
  const std::string d = write("text", qwen3_5_moe_text_config(), weights_);
  const ModelConfig c = load_checkpoint(d).config;
  EXPECT_EQ(c.linear.projections, LinearProjLayout::kSplit);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  expect_same_model(d);
}

TEST_F(Qwen3_5Layout, MultimodalWrapperRunsItsTextModel) {
  auto [config, weights] = as_multimodal(qwen3_5_moe_text_config(), weights_);
  const std::string d = write("vl", config, weights);
  const ModelConfig c = load_checkpoint(d).config;
  EXPECT_EQ(c.architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(c.dtype, DType::kBF16);  // from the top level
  expect_same_model(d);
}

TEST_F(Qwen3_5Layout, TheOtherLayoutsNamesAreRefused) {
  // Qwen3-Next's fused projections under a Qwen3.5 config: the four tensors are missing and the
  // two are unexpected, each named.
  std::map<std::string, Tensor> w;
  for (const auto& [name, t] : next_->weights.all()) w[name] = t;
  const std::string d = write("next-names", qwen3_5_moe_text_config(), w);
  try {
    load_checkpoint(d);
    FAIL() << "loaded Qwen3-Next's projections as Qwen3.5's";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.linear_attn.in_proj_qkv.weight"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Qwen3_5Layout, MissingOrMisshapenProjectionIsNamed) {
  std::map<std::string, Tensor> w = weights_;
  w.erase("model.layers.1.linear_attn.in_proj_z.weight");
  std::string d = write("no-z", qwen3_5_moe_text_config(), w);
  try {
    load_checkpoint(d);
    FAIL() << "loaded without in_proj_z";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.layers.1.linear_attn.in_proj_z.weight"),
              std::string::npos)
        << e.what();
  }
  // One value head short: [48, 64] where the config implies [64, 64].
  w = weights_;
  w["model.layers.1.linear_attn.in_proj_z.weight"] =
      weights_.at("model.layers.1.linear_attn.in_proj_z.weight").slice(0, 0, 48).contiguous();
  d = write("short-z", qwen3_5_moe_text_config(), w);
  try {
    load_checkpoint(d);
    FAIL() << "loaded a short in_proj_z";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.layers.1.linear_attn.in_proj_z.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[48, 64]"), std::string::npos) << m;
    EXPECT_NE(m.find("[64, 64]"), std::string::npos) << m;
  }
}

}  // namespace
