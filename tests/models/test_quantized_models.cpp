// Quantized checkpoints made by `longctx quantize`'s code run on the CPU engine: logits close to
// the dense model's (KL and top-1 printed and bounded) and greedy continuations mostly equal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/moe_checkpoint.h"
#include "loader/quantize_checkpoint.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  QuantConfig q;
  // Bounds, measured on the needle model with margin (FP8: KL 0.013-0.017, top-1 0.95; int4:
  // KL 0.13-0.21, top-1 0.79-0.82): mean KL(dense || quantized) per position and the share of
  // positions whose top-1 token agrees.
  double max_mean_kl;
  double min_top1;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  QuantConfig q;
  q.method = QuantMethod::kFp8Block;
  q.bits = 8;
  q.block_out = q.block_in = 128;
  v.push_back({"fp8_block", q, 0.03, 0.92});
  q = QuantConfig();
  q.method = QuantMethod::kCompressedFp8;
  q.bits = 8;
  q.ignore = {"lm_head"};
  v.push_back({"ct_fp8_channel", q, 0.03, 0.92});
  q = QuantConfig();
  q.method = QuantMethod::kAwq;
  q.bits = 4;
  q.group_size = 128;
  v.push_back({"awq", q, 0.3, 0.75});
  q = QuantConfig();
  q.method = QuantMethod::kGptq;
  q.bits = 4;
  q.group_size = 128;
  q.symmetric = true;
  q.gptq_zero_minus_one = true;
  v.push_back({"gptq_sym", q, 0.3, 0.75});
  q.symmetric = false;
  v.push_back({"gptq_asym", q, 0.3, 0.75});
  return v;
}

// Mean over rows of KL(softmax(a) || softmax(b)), and the share of rows with the same argmax.
std::pair<double, double> kl_and_top1(const Tensor& a, const Tensor& b) {
  const int64_t rows = a.size(0), v = a.size(1);
  double kl = 0;
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data<float>() + r * v;
    const float* y = b.data<float>() + r * v;
    kl += kl_logits(x, y, v);
    same += argmax_row(a, r) == argmax_row(b, r);
  }
  return {kl / rows, double(same) / rows};
}

// `n` greedy tokens after `prompt`.
std::vector<int32_t> greedy(Model& model, const std::vector<int32_t>& prompt, int n) {
  const int64_t len = static_cast<int64_t>(prompt.size());
  auto cache = std::make_unique<KVCache>(model.config(), len + n);
  Tensor logits = reference_forward(model, prompt, iota_positions(0, len), *cache, true);
  std::vector<int32_t> out;
  for (int step = 0; step < n; ++step) {
    out.push_back(argmax_row(logits, 0));
    std::vector<int32_t> one = {out.back()};
    std::vector<int64_t> pos = {len + step};
    logits = reference_forward(model, one, pos, *cache, true);
  }
  return out;
}

class QuantizedModel : public ::testing::TestWithParam<Case> {};

// The needle model (models/needle: trained, so its distributions mean something; the tiny
// fixtures' random weights turn any perturbation into a different top-1) on its reference
// needle prompt: every position's logits, and the greedy continuation (the needle's answer).
TEST_P(QuantizedModel, RunsCloseToTheDenseModel) {
  const Case& c = GetParam();
  const std::string model_dir = test_data_dir() + "/../../models/needle";
  const fs::path dir =
      fs::temp_directory_path() / ("longctx_qmodel_" + std::to_string(getpid()) + "_" + c.name);
  fs::remove_all(dir);
  quantize_checkpoint(model_dir, dir.string(), c.q);
  ModelBuildOptions options;
  options.rope_inv_freq_dtype = DType::kF32;
  auto dense = create_model(std::make_shared<Checkpoint>(load_checkpoint(model_dir)), options);
  auto quant_ck = std::make_shared<Checkpoint>(load_checkpoint(dir.string()));
  auto quant = create_model(quant_ck, options);
  options.packed_weights = true;
  auto packed = create_model(quant_ck, options);
  fs::remove_all(dir);

  std::ifstream f(test_data_dir() + "/needle/reference.json");
  ASSERT_TRUE(f.good());
  const auto ids = nlohmann::json::parse(f).at("input_ids").get<std::vector<int32_t>>();
  // Logits over the prompt's first 384 positions (seconds, not tens of them); the greedy answer
  // after the whole prompt (the needle's value: a continuation the model is sure of, where free
  // text would part ways at the first near tie).
  const std::vector<int32_t> head(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 384));
  const Tensor quant_logits = full_forward(*quant, head);
  const auto [kl, top1] = kl_and_top1(full_forward(*dense, head), quant_logits);
  // The packed Linears (ops::quantized_linear, which dequantizes to f32 on the CPU) against the
  // checkpoint dequantized at load into config.dtype: the same weights but for that rounding.
  const auto [packed_kl, packed_top1] = kl_and_top1(quant_logits, full_forward(*packed, head));
  std::cout << "[quantized] needle " << c.name << ": packed vs dequantized at load: mean KL "
            << packed_kl << ", top-1 " << packed_top1 << "\n";
  EXPECT_LE(packed_kl, 1e-3) << c.name;
  EXPECT_GE(packed_top1, 0.98) << c.name;
  const auto a = greedy(*dense, ids, 16), b = greedy(*quant, ids, 16);
  int same = 0;
  for (int i = 0; i < 16; ++i) same += a[i] == b[i];
  std::cout << "[quantized] needle " << c.name << ": " << head.size() << " positions, mean KL "
            << kl << ", top-1 " << top1 << ", greedy " << same << "/16 equal\n";
  EXPECT_LE(kl, c.max_mean_kl) << c.name;
  EXPECT_GE(top1, c.min_top1) << c.name;
  EXPECT_GE(same, 11) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedModel, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Who runs packed by default: dummy weights always; a checkpoint on a GPU; never on the CPU; the
// option decides where set; an unquantized model never.
TEST(QuantizedCheckpoint, PackedByDefaultWhereThePackedGemvIsFaster) {
  auto q = [](QuantMethod m) {
    QuantConfig c;
    c.method = m;
    c.bits = m == QuantMethod::kAwq || m == QuantMethod::kGptq ? 4 : 8;
    return c;
  };
  ModelBuildOptions gpu, cpu;
  gpu.device = Device::cuda(0);
  for (QuantMethod m :
       {QuantMethod::kFp8Block, QuantMethod::kCompressedFp8, QuantMethod::kGptq, QuantMethod::kAwq})
    EXPECT_TRUE(packs_quantized_linears(q(m), gpu, false)) << quant_method_name(m);
  for (QuantMethod m : {QuantMethod::kFp8Block, QuantMethod::kAwq, QuantMethod::kGptq}) {
    EXPECT_FALSE(packs_quantized_linears(q(m), cpu, false)) << quant_method_name(m);
    EXPECT_TRUE(packs_quantized_linears(q(m), cpu, true)) << quant_method_name(m);
  }
  ModelBuildOptions asked_dense = gpu, asked_packed = cpu;
  asked_dense.packed_weights = false;
  asked_packed.packed_weights = true;
  EXPECT_FALSE(packs_quantized_linears(q(QuantMethod::kGptq), asked_dense, true));
  EXPECT_TRUE(packs_quantized_linears(q(QuantMethod::kAwq), asked_packed, false));
  EXPECT_FALSE(packs_quantized_linears(QuantConfig(), asked_packed, true));
}

// A quantized checkpoint folder keeps its Linears packed; a model built without packed_weights
// runs them dense, dequantized one projection at a time through dense_weight(): its logits are
// bit for bit those of a model built from a checkpoint holding every dense copy (what the loader
// made at load before), for plain, fused (Phi-3's qkv_proj / gate_up_proj), MoE (each expert)
// and linear-attention (Qwen3-Next's projections) checkpoints in every format. With
// packed_weights the packed projections (FP8 block experts included) are the same and those that
// stay dense (other formats' experts, output-gated and linear attention) read the same values:
// logits again bit for bit.
TEST(QuantizedCheckpoint, DenseModelEqualsTheEagerlyDequantizedOne) {
  const fs::path dir = fs::temp_directory_path() / ("longctx_qdense_" + std::to_string(getpid()));
  for (const char* model :
       {"tiny-qwen3", "tiny-phi3-longrope", "tiny-qwen3-moe", "tiny-qwen3-next"})
    for (const auto& [name, format] : quant_format_names()) {
      QuantFormatOptions f;
      f.format = format;
      f.group_size = 16;  // tiny-qwen3-moe's shared expert is 48 wide
      fs::remove_all(dir);
      quantize_checkpoint(fixture_dir(model), dir.string(), quant_config_for(f));
      auto ck = std::make_shared<Checkpoint>(load_checkpoint(dir.string()));
      ASSERT_FALSE(ck->quantized.empty()) << model << " " << name;
      // Every dense copy beside the packed tensors, as the loader used to keep them.
      auto eager = std::make_shared<Checkpoint>(*ck);
      for (const auto& [n, w] : ck->quantized) eager->weights.add(n, ck->dense_weight(n));
      auto dense_only = std::make_shared<Checkpoint>(*eager);
      dense_only->quantized.clear();
      dense_only->config.quantization = QuantConfig();
      ModelBuildOptions o;
      o.rope_inv_freq_dtype = DType::kF32;
      const std::vector<int32_t> ids = make_ids(24, 3, ck->config.vocab_size);
      auto same = [&](const Tensor& a, const Tensor& b) {
        return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
      };
      const Tensor dense = full_forward(*create_model(ck, o), ids);
      EXPECT_TRUE(same(dense, full_forward(*create_model(dense_only, o), ids)))
          << model << " " << name;
      o.packed_weights = true;
      const Tensor packed = full_forward(*create_model(ck, o), ids);
      EXPECT_TRUE(same(packed, full_forward(*create_model(eager, o), ids))) << model << " " << name;
      // The packed path ran: its f32 dequantization differs from the bf16 weights somewhere.
      EXPECT_FALSE(same(dense, packed)) << model << " " << name;
    }
  fs::remove_all(dir);
}

// A block-wise FP8 MoE checkpoint (per-expert gate/up/down, as Qwen3-30B-A3B-FP8 publishes them)
// keeps its experts packed with packed_weights: fused per layer as FP8 codes and block scales
// (the op-timer's expert bytes are a byte a weight, not f32's four), run by ops::moe_forward,
// which dequantizes each row in f32. Its logits are bit for bit those of the same checkpoint with
// the experts dequantized to f32 at load, for blocks that divide the experts and blocks wider
// than them; greedy decoding gives the same tokens.
TEST(QuantizedCheckpoint, Fp8ExpertsStayPackedAndEqualTheirDequantization) {
  const fs::path dir = fs::temp_directory_path() / ("longctx_qmoe_" + std::to_string(getpid()));
  for (const char* model : {"tiny-qwen3-moe", "tiny-qwen3-next"})
    for (int64_t block : {16, 128}) {
      QuantFormatOptions f;
      f.format = QuantFormat::kFp8Block;
      f.block_size = block;
      fs::remove_all(dir);
      quantize_checkpoint(fixture_dir(model), dir.string(), quant_config_for(f));
      auto packed_ck = std::make_shared<Checkpoint>(load_checkpoint(dir.string()));
      packed_ck->config.dtype = DType::kF32;  // dense_weight() dequantizes to f32
      auto dense_ck = std::make_shared<Checkpoint>(*packed_ck);
      int64_t experts = 0;
      for (const auto& [n, w] : packed_ck->quantized)
        if (n.find(".mlp.experts.") != std::string::npos) {
          dense_ck->weights.add(n, packed_ck->dense_weight(n));
          dense_ck->quantized.erase(n);
          ++experts;
        }
      const ModelConfig& c = packed_ck->config;
      ASSERT_GT(experts, 0) << model;
      ASSERT_EQ(experts % (3 * c.moe.num_experts), 0) << model;
      ModelBuildOptions o;
      o.rope_inv_freq_dtype = DType::kF32;
      o.packed_weights = true;
      auto packed = create_model(packed_ck, o);
      auto dense = create_model(dense_ck, o);
      const std::vector<int32_t> ids = make_ids(20, 5, c.vocab_size);
      RecordingTimer packed_timer, dense_timer;
      packed->set_op_timer(&packed_timer);
      dense->set_op_timer(&dense_timer);
      const Tensor a = full_forward(*packed, ids), b = full_forward(*dense, ids);
      packed->set_op_timer(nullptr);
      dense->set_op_timer(nullptr);
      ASSERT_EQ(a.numel(), b.numel());
      EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << model << " " << block;
      EXPECT_GT(packed_timer.bytes["moe_experts"], 0.0) << model;
      EXPECT_LT(packed_timer.bytes["moe_experts"], dense_timer.bytes["moe_experts"] / 3)
          << model << " " << block << ": the experts did not stay packed";
      EXPECT_EQ(greedy(*packed, ids, 6), greedy(*dense, ids, 6)) << model << " " << block;
    }
  fs::remove_all(dir);
}

// `longctx quantize` of a fused-expert checkpoint (transformers 5's mlp.experts.gate_up_proj)
// writes each expert's gate, up and down as its own FP8 Linear: the same packed tensors, bit for
// bit, as quantizing the per-expert spelling of the same weights, and the same logits.
TEST(QuantizedCheckpoint, FusedExpertsAreQuantizedPerExpert) {
  const fs::path dir = fs::temp_directory_path() / ("longctx_qfused_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const nlohmann::json config = tiny_moe_config_json(false);
  const auto fused = tiny_moe_weights(parse_model_config(config, "tiny-moe"), 9);
  write_checkpoint_dir(dir / "fused", config, fused, 1);
  write_checkpoint_dir(dir / "per_expert", config, per_expert_weights(fused), 1);
  QuantFormatOptions f;
  f.block_size = 8;
  for (const char* src : {"fused", "per_expert"})
    quantize_checkpoint((dir / src).string(), (dir / (std::string(src) + "_fp8")).string(),
                        quant_config_for(f));
  auto a = std::make_shared<Checkpoint>(load_checkpoint((dir / "fused_fp8").string()));
  auto b = std::make_shared<Checkpoint>(load_checkpoint((dir / "per_expert_fp8").string()));
  EXPECT_FALSE(a->weights.has("model.layers.0.mlp.experts.gate_up_proj"));
  ASSERT_TRUE(a->quantized.count("model.layers.0.mlp.experts.7.up_proj.weight"));
  ASSERT_EQ(a->quantized.size(), b->quantized.size());
  for (const auto& [n, w] : b->quantized) {
    ASSERT_TRUE(a->quantized.count(n)) << n;
    const QuantizedWeight& v = a->quantized.at(n);
    for (auto [x, y] : {std::pair{&v.qweight, &w.qweight}, {&v.scales, &w.scales}})
      EXPECT_EQ(std::memcmp(x->contiguous().data_ptr(), y->contiguous().data_ptr(), y->nbytes()), 0)
          << n;
  }
  ModelBuildOptions o;
  o.packed_weights = true;
  const std::vector<int32_t> ids = make_ids(12, 2, a->config.vocab_size);
  const Tensor la = full_forward(*create_model(a, o), ids);
  const Tensor lb = full_forward(*create_model(b, o), ids);
  EXPECT_EQ(std::memcmp(la.data_ptr(), lb.data_ptr(), la.nbytes()), 0);
  fs::remove_all(dir);
}

// A dummy quantized checkpoint (--load-format dummy --quantization F) holds only the packed
// Linears. The CPU model runs them packed where the format stacks q/k/v and gate/up, and
// dequantizes the rest through Checkpoint::dense_weight (FP8 blocks that a 64-row q_proj ends
// inside); in f32 its logits are those of a model built from the dequantized copies, bit for bit.
TEST(DummyQuantized, PackedOnlyCheckpointEqualsItsDequantizedCopy) {
  for (const auto& [name, format] : quant_format_names()) {
    ModelConfig c = dummy_preset_config("tiny-llama");
    c.dtype = DType::kF32;
    QuantFormatOptions f;
    f.format = format;
    f.group_size = 32;  // hidden 64
    c.quantization = quant_config_for(f);
    auto packed_ck = std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 7));
    ASSERT_EQ(packed_ck->quantized.size(), 2u * 7u) << name;  // q k v o gate up down, 2 layers
    EXPECT_FALSE(packed_ck->weights.has("model.layers.0.mlp.down_proj.weight")) << name;
    auto dense_ck = std::make_shared<Checkpoint>(*packed_ck);
    for (const auto& [n, w] : packed_ck->quantized)
      dense_ck->weights.add(n, packed_ck->dense_weight(n));
    dense_ck->quantized.clear();
    dense_ck->config.quantization = QuantConfig();
    ModelBuildOptions o;
    o.rope_inv_freq_dtype = DType::kF32;
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 5) % 512);
    const Tensor a = full_forward(*create_model(packed_ck, o), ids);
    const Tensor b = full_forward(*create_model(dense_ck, o), ids);
    ASSERT_EQ(a.numel(), b.numel());
    float worst = 0, largest = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(a.data<float>()[i])) << name;
      worst = std::max(worst, std::abs(a.data<float>()[i] - b.data<float>()[i]));
      largest = std::max(largest, std::abs(b.data<float>()[i]));
    }
    std::cout << "[quantized] dummy tiny-llama " << name << ": max |logit| " << largest
              << ", packed vs dequantized copy " << worst << "\n";
    EXPECT_GT(largest, 0.f) << name;
    EXPECT_EQ(worst, 0.f) << name;
  }
}

// Dummy FP8 MoE weights (--load-format dummy --quantization fp8 on a MoE preset) spell the experts
// per expert and quantize them like the other Linears (not fused bf16: what the FP8 checkpoints
// ship and the MoE op runs packed); in f32 the packed model's logits are those of its dequantized
// copy, bit for bit.
TEST(DummyQuantized, Fp8MoeExpertsArePackedPerExpert) {
  ModelConfig c = parse_model_config(tiny_moe_config_json(true), "tiny-moe");
  c.quantization = quant_config_for(QuantFormatOptions{.block_size = 8});
  auto packed_ck = std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 3));
  for (const char* n : {"model.layers.0.mlp.experts.0.gate_proj.weight",
                        "model.layers.2.mlp.experts.7.down_proj.weight"})
    EXPECT_TRUE(packed_ck->quantized.count(n)) << n;
  EXPECT_FALSE(packed_ck->weights.has("model.layers.0.mlp.experts.gate_up_proj"));
  auto dense_ck = std::make_shared<Checkpoint>(*packed_ck);
  for (const auto& [n, w] : packed_ck->quantized)
    dense_ck->weights.add(n, packed_ck->dense_weight(n));
  dense_ck->quantized.clear();
  dense_ck->config.quantization = QuantConfig();
  const std::vector<int32_t> ids = make_ids(16, 4, c.vocab_size);
  const Tensor a = full_forward(*create_model(packed_ck, {}), ids);
  const Tensor b = full_forward(*create_model(dense_ck, {}), ids);
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
}

}  // namespace

}  // namespace longctx::testing
