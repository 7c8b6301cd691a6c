// The quantized Linear's formats, odd shapes and bad inputs, shared by the CPU test (tests/ops:
// the CPU twin against a dense linear over the dequantized weight) and the GPU test
// (tests/gpu_ops: the CUDA twin against the CPU twin). Weights come from the loader's
// quantize_rtn, so each format's packing (AWQ's nibble order, GPTQ v1's z - 1, FP8 block edges)
// is the one the loader reads.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "loader/quantized_weights.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/loader/quantization.h"

namespace longctx::quant_cases {

struct Format {
  std::string name;
  QuantConfig q;
};

inline QuantConfig int4_config(QuantMethod m, int64_t group, bool symmetric, bool v1) {
  QuantConfig q;
  q.method = m;
  q.bits = 4;
  q.group_size = group;
  q.symmetric = symmetric;
  q.gptq_zero_minus_one = v1;
  return q;
}

// Every format and option the op takes: AWQ and GPTQ (v1 and v2, symmetric and not) at groups
// 32, 64, 128 and one group per row (GPTQ's -1), FP8 block-wise (128x128 and a non-square block
// whose edges fall inside rows), compressed-tensors FP8 per channel and per tensor.
inline std::vector<Format> formats() {
  std::vector<Format> v;
  for (int64_t g : {32, 64, 128})
    v.push_back({"awq g" + std::to_string(g), int4_config(QuantMethod::kAwq, g, false, false)});
  v.push_back({"gptq v1 sym g128", int4_config(QuantMethod::kGptq, 128, true, true)});
  v.push_back({"gptq v1 asym g64", int4_config(QuantMethod::kGptq, 64, false, true)});
  v.push_back({"gptq v2 sym g32", int4_config(QuantMethod::kGptq, 32, true, false)});
  v.push_back({"gptq v2 asym g128", int4_config(QuantMethod::kGptq, 128, false, false)});
  v.push_back({"gptq v1 asym g-1", int4_config(QuantMethod::kGptq, 0, false, true)});
  QuantConfig fp8;
  fp8.method = QuantMethod::kFp8Block;
  fp8.bits = 8;
  fp8.block_out = fp8.block_in = 128;
  v.push_back({"fp8 block 128x128", fp8});
  fp8.block_out = 48;
  fp8.block_in = 80;
  v.push_back({"fp8 block 48x80", fp8});
  QuantConfig ct;
  ct.method = QuantMethod::kCompressedFp8;
  ct.bits = 8;
  ct.fp8_strategy = Fp8ScaleStrategy::kChannel;
  v.push_back({"ct-fp8 channel", ct});
  ct.fp8_strategy = Fp8ScaleStrategy::kTensor;
  v.push_back({"ct-fp8 tensor", ct});
  return v;
}

inline bool is_int4(const QuantConfig& q) {
  return q.method == QuantMethod::kAwq || q.method == QuantMethod::kGptq;
}

// Odd [out, in] shapes of a format: out a multiple of 8 but not of the GEMV tiles, in a multiple
// of the group (int4); FP8 also takes widths that are not multiples of 16 or of the block.
inline std::vector<std::pair<int64_t, int64_t>> odd_shapes(const QuantConfig& q, bool large) {
  std::vector<std::pair<int64_t, int64_t>> v;
  if (is_int4(q)) {
    const int64_t g = q.group_size > 0 ? q.group_size : 96;
    // 160 and 1056 are multiples of 32 (AWQ's 16- and 8-byte GEMV loads at n = 1 and 2).
    v = {{8, g}, {136, 3 * g}, {264, 2 * g}, {160, 4 * g}};
    if (large) v.push_back({1032, 20 * g}), v.push_back({1056, 12 * g});
  } else {
    v = {{8, 16}, {136, 200}, {72, 131}};
    if (large) v.push_back({1032, 2560});
  }
  return v;
}

// A random dense [out, in] f32 weight: uniform in +-2/sqrt(in), every 97th value an exact zero,
// and a large outlier every 7th row, so groups' ranges and scales differ.
inline Tensor random_dense(int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  const float a = 2.0f / std::sqrt(float(in));
  std::uniform_real_distribution<float> dist(-a, a);
  Tensor w = Tensor::empty({out, in}, DType::kF32);
  float* p = w.data<float>();
  for (int64_t i = 0; i < out * in; ++i) p[i] = dist(rng);
  for (int64_t i = 0; i < out * in; i += 97) p[i] = 0.0f;
  for (int64_t r = 0; r < out; r += 7) p[r * in + (r * 13) % in] = 8 * a;
  return w;
}

// random_dense quantized by round-to-nearest in q's format.
inline QuantizedWeight random_quantized(int64_t out, int64_t in, const QuantConfig& q,
                                        uint32_t seed) {
  return quantize_rtn(random_dense(out, in, seed), q, "test.weight");
}

// A QuantizedWeight's tensors copied to `device`.
inline QuantizedWeight to_device(const QuantizedWeight& w, Device device) {
  QuantizedWeight d = w;
  for (Tensor* t : {&d.qweight, &d.scales, &d.qzeros, &d.g_idx})
    if (t->defined()) *t = t->to(device);
  return d;
}

// Bad inputs, each a clear Error(kInvalidArgument) naming what is wrong, through `op` (a twin or
// the dispatcher) on `device`, with x and out in `act` (the twin's activation dtype): a scale
// tensor of the wrong shape, a group size that does not divide in_features, x of the wrong
// width, a weight whose method is not the config's, a missing zero-point tensor.
using Op = std::function<void(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                              const Tensor& out)>;
inline void expect_bad_inputs_rejected(const Op& op, Device device, DType act) {
  auto message_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  };
  const QuantConfig awq = int4_config(QuantMethod::kAwq, 64, false, false);
  const QuantizedWeight good = to_device(random_quantized(16, 128, awq, 1), device);
  const Tensor x = Tensor::zeros({2, 128}, act).to(device);
  const Tensor out = Tensor::zeros({2, 16}, act).to(device);

  QuantizedWeight w = good;
  w.scales = Tensor::zeros({3, 16}, DType::kF16).to(device);
  EXPECT_NE(
      message_of([&] { op(x, w, awq, out); }).find("scales has shape [3, 16], expected [2, 16]"),
      std::string::npos);

  QuantConfig g48 = awq;
  g48.group_size = 48;
  EXPECT_NE(message_of([&] { op(x, good, g48, out); }).find("group_size 48 does not divide"),
            std::string::npos);

  const Tensor x_wide = Tensor::zeros({2, 136}, act).to(device);
  EXPECT_NE(message_of([&] { op(x_wide, good, awq, out); }).find("in_features 128"),
            std::string::npos);

  QuantConfig gptq = awq;
  gptq.method = QuantMethod::kGptq;
  EXPECT_NE(message_of([&] { op(x, good, gptq, out); }).find("quantized as 'awq'"),
            std::string::npos);

  w = good;
  w.qzeros = Tensor();
  EXPECT_NE(message_of([&] { op(x, w, awq, out); }).find("qzeros is missing"), std::string::npos);

  QuantConfig fp8;
  fp8.method = QuantMethod::kFp8Block;
  fp8.block_out = fp8.block_in = 128;
  QuantizedWeight f = to_device(random_quantized(16, 128, fp8, 2), device);
  f.scales = Tensor::zeros({1, 2}, DType::kF32).to(device);
  EXPECT_NE(message_of([&] {
              op(x, f, fp8, out);
            }).find("weight_scale_inv has shape [1, 2], expected [1, 1]"),
            std::string::npos);
}

}  // namespace longctx::quant_cases
