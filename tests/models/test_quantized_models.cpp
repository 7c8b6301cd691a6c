// Quantized fixtures made by `longctx quantize`'s code run on the CPU engine: logits close to the
// dense model's (KL and top-1 printed and bounded) and greedy continuations mostly equal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "loader/quantize_checkpoint.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  QuantConfig q;
  // Bounds, measured on these fixtures with margin: mean KL(dense || quantized) per position and
  // the share of positions whose top-1 token agrees.
  double max_mean_kl;
  double min_top1;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  QuantConfig q;
  q.method = QuantMethod::kFp8Block;
  q.bits = 8;
  q.block_out = q.block_in = 128;
  v.push_back({"fp8_block", q, 2e-3, 0.95});
  q = QuantConfig();
  q.method = QuantMethod::kCompressedFp8;
  q.bits = 8;
  q.ignore = {"lm_head"};
  v.push_back({"ct_fp8_channel", q, 2e-3, 0.95});
  q = QuantConfig();
  q.method = QuantMethod::kAwq;
  q.bits = 4;
  q.group_size = 128;
  v.push_back({"awq", q, 5e-2, 0.8});
  q = QuantConfig();
  q.method = QuantMethod::kGptq;
  q.bits = 4;
  q.group_size = 128;
  q.symmetric = true;
  q.gptq_zero_minus_one = true;
  v.push_back({"gptq_sym", q, 5e-2, 0.8});
  q.symmetric = false;
  v.push_back({"gptq_asym", q, 5e-2, 0.8});
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
    const double mx = *std::max_element(x, x + v), my = *std::max_element(y, y + v);
    double zx = 0, zy = 0;
    for (int64_t i = 0; i < v; ++i) zx += std::exp(x[i] - mx), zy += std::exp(y[i] - my);
    double k = 0;
    for (int64_t i = 0; i < v; ++i) {
      const double lp = x[i] - mx - std::log(zx), lq = y[i] - my - std::log(zy);
      k += std::exp(lp) * (lp - lq);
    }
    kl += k;
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

TEST_P(QuantizedModel, RunsCloseToTheDenseModel) {
  for (const char* fixture : {"tiny-qwen3", "tiny-llama3"}) {
    Case c = GetParam();
    // tiny-llama3's MLP is 352 wide: groups of 32.
    if (c.q.group_size && std::string(fixture) == "tiny-llama3") c.q.group_size = 32;
    const fs::path dir =
        fs::temp_directory_path() / ("longctx_qmodel_" + std::to_string(getpid()) + "_" + c.name);
    fs::remove_all(dir);
    quantize_checkpoint(fixture_dir(fixture), dir.string(), c.q);
    ModelBuildOptions options;
    options.rope_inv_freq_dtype = DType::kF32;
    auto dense =
        create_model(std::make_shared<Checkpoint>(load_checkpoint(fixture_dir(fixture))), options);
    auto quant = create_model(std::make_shared<Checkpoint>(load_checkpoint(dir.string())), options);
    fs::remove_all(dir);

    double kl = 0, top1 = 0;
    int greedy_same = 0, greedy_total = 0;
    for (int64_t salt = 0; salt < 2; ++salt) {
      const auto ids = make_ids(96, salt + 3, dense->config().vocab_size);
      const auto [k, t] = kl_and_top1(full_forward(*dense, ids), full_forward(*quant, ids));
      kl += k / 2;
      top1 += t / 2;
      const auto a = greedy(*dense, ids, 16), b = greedy(*quant, ids, 16);
      // Tokens up to the first difference (after it the two continue from different text).
      int same = 0;
      while (same < 16 && a[same] == b[same]) ++same;
      greedy_same += same;
      greedy_total += 16;
    }
    std::cout << "[quantized] " << fixture << " " << c.name << ": mean KL " << kl << ", top-1 "
              << top1 << ", greedy prefix " << greedy_same << "/" << greedy_total << "\n";
    EXPECT_LE(kl, c.max_mean_kl) << fixture << " " << c.name;
    EXPECT_GE(top1, c.min_top1) << fixture << " " << c.name;
    EXPECT_GE(greedy_same, greedy_total / 2) << fixture << " " << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedModel, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace longctx::testing
