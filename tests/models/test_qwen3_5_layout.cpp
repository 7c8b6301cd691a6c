// Qwen3.5's checkpoint layouts without transformers: tiny-qwen3-next's weights rewritten as
// Qwen3.5 stores them (common/qwen3_5_layout.h: Qwen3_5GatedDeltaNet's in_proj_qkv, in_proj_z,
// in_proj_b, in_proj_a, head-major, in place of Qwen3-Next's in_proj_qkvz / in_proj_ba
// grouped per key head) compute the same model, so loaded as Qwen3_5MoeForCausalLM, and as the text
// model of Qwen3_5MoeForConditionalGeneration (config under text_config, weights under
// model.language_model.*, a vision tower and an MTP head beside them), they must give
// tiny-qwen3-next's logits bit for bit and transformers' within the fixture tolerance. A wrong
// un-interleaving (the value heads' order, b and a swapped) moves the logits by whole units.
// Checkpoints that disagree with the config are refused naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/qwen3_5_layout.h"
#include "longctx/core/error.h"
#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kNext = "tiny-qwen3-next";

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
