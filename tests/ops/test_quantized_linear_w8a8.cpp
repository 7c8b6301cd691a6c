// The W8A8 path on the CPU: the activation quantization (kernels/fp8_act_quant.h: codes and
// scales against their definition and the rounding bound, zero groups, NaN and Inf), the CUDA
// twin's path planner (quantized_linear_schedule, the workspace's chunks), and the CPU twin's
// kW8a8 product against the W8A16 reference within the bound of tests/common/w8a8_cases.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/w8a8_cases.h"
#include "kernels/cpu/fp8_act_quant_cpu.h"
#include "kernels/fp8_act_quant.h"
#include "longctx/core/dtype.h"
#include "ops/quantized_linear.h"

namespace longctx {
namespace {

using ops::QuantizedLinearPath;

// Rows of x with varied ranges (a row's groups differ by up to 2^12), a zero group, tiny values.
std::vector<float> activations(int64_t n, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(size_t(n * in));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < in; ++k)
      x[j * in + k] = u(rng) * std::ldexp(1.f, int((j * 5 + k / 128 * 3) % 13) - 6);
  return x;
}

TEST(Fp8ActQuant, CodesAndScalesFollowTheDefinition) {
  for (auto [in, group] : {std::pair<int64_t, int64_t>{336, 128}, {4096, 128}, {208, 208}}) {
    const int64_t n = 7, groups = (in + group - 1) / group;
    std::vector<float> x = activations(n, in, uint32_t(in));
    for (int64_t k = 0; k < std::min<int64_t>(group, in); ++k) x[2 * in + k] = 0.f;  // zero group
    x[3 * in + 5] = 1e-30f;  // far below the group's range: a zero code
    std::vector<uint8_t> codes(size_t(n * in));
    std::vector<float> scales(size_t(n * groups));
    kernels::fp8_quantize_rows_cpu(x.data(), n, in, in, group, codes.data(), scales.data());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t k0 = g * group, k1 = std::min(in, k0 + group);
        float amax = 0.f;
        for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::abs(x[j * in + k]));
        const float s = scales[j * groups + g];
        ASSERT_EQ(s, std::max(amax, kernels::kFp8ActEps) / 448.f) << "row " << j << " group " << g;
        for (int64_t k = k0; k < k1; ++k) {
          const float v = x[j * in + k];
          ASSERT_EQ(codes[j * in + k], f32_to_fp8e4m3(v / s)) << "row " << j << " input " << k;
          // The rounding bound the W8A8 bound is built on.
          const float back = fp8e4m3_to_f32(codes[j * in + k]) * s;
          const double allowed =
              std::max(std::ldexp(std::abs(double(v)), -4), std::ldexp(double(s), -10)) *
              (1 + 1e-6);
          ASSERT_LE(std::abs(double(back) - v), allowed) << "row " << j << " input " << k;
        }
        if (amax > 0) {  // the group's largest input maps to +-448, the format's edge
          int64_t top = k0;
          for (int64_t k = k0; k < k1; ++k)
            if (std::abs(x[j * in + k]) == amax) top = k;
          EXPECT_EQ(fp8e4m3_to_f32(codes[j * in + top]), std::copysign(448.f, x[j * in + top]));
        }
      }
    for (int64_t k = 0; k < std::min<int64_t>(group, in); ++k) EXPECT_EQ(codes[2 * in + k], 0);
    EXPECT_EQ(scales[2 * groups], kernels::kFp8ActEps / 448.f);
    EXPECT_EQ(codes[3 * in + 5], 0);
  }
}

// A NaN is left out of its group's amax and becomes a NaN code; an Inf makes its group's scale
// Inf, its own code NaN (Inf / Inf) and the other codes zero: either way the row's outputs are
// NaN downstream, never finite garbage. Other groups are untouched.
TEST(Fp8ActQuant, NanAndInfPoisonTheirGroupOnly) {
  const int64_t in = 256, group = 128;
  std::vector<float> x = activations(2, in, 3);
  std::vector<float> clean = x;
  x[10] = -std::numeric_limits<float>::quiet_NaN();
  x[in + 130] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> codes(2 * in), ref_codes(2 * in);
  std::vector<float> scales(4), ref_scales(4);
  kernels::fp8_quantize_rows_cpu(x.data(), 2, in, in, group, codes.data(), scales.data());
  kernels::fp8_quantize_rows_cpu(clean.data(), 2, in, in, group, ref_codes.data(),
                                 ref_scales.data());
  EXPECT_EQ(codes[10], 0x7f);  // NaN codes are the positive one (kernels/fp8_act_quant.h)
  EXPECT_TRUE(std::isfinite(scales[0]));
  EXPECT_TRUE(std::isinf(scales[3]));
  EXPECT_EQ(codes[in + 130], 0x7f);  // Inf / Inf
  for (int64_t k = in + 128; k < 2 * in; ++k)
    if (k != in + 130) EXPECT_EQ(codes[k] & 0x7f, 0) << k;
  EXPECT_EQ(scales[1], ref_scales[1]);
  EXPECT_EQ(scales[2], ref_scales[2]);
  for (int64_t k = 128; k < in + 128; ++k) EXPECT_EQ(codes[k], ref_codes[k]) << k;
}

QuantizedWeight weight_of(const quant_cases::Format& f, int64_t out, int64_t in) {
  return quant_cases::random_quantized(out, in, f.q, 5);
}

TEST(QuantizedLinearSchedule, PicksGemvThenW8a8ThenDequant) {
  using P = QuantizedLinearPath;
  const std::vector<quant_cases::Format> fmts = quant_cases::formats();
  auto find = [&](const std::string& name) {
    for (const auto& f : fmts)
      if (f.name == name) return f;
    throw std::runtime_error(name);
  };
  const quant_cases::Format blk = find("fp8 block 128x128"), ch = find("ct-fp8 channel"),
                            tensor = find("ct-fp8 tensor"), odd_blk = find("fp8 block 48x80"),
                            awq = find("awq g128");
  const QuantizedWeight wb = weight_of(blk, 256, 384), wc = weight_of(ch, 256, 384),
                        wt = weight_of(tensor, 256, 384), wo = weight_of(odd_blk, 256, 384),
                        wa = weight_of(awq, 256, 384), narrow = weight_of(blk, 256, 200);
  ops::QuantizedLinearProblem p;
  p.sm = 90;
  auto path = [&](const QuantizedWeight& w, const QuantConfig& q) {
    return ops::quantized_linear_schedule(p, w, q);
  };
  p.n = 64;
  EXPECT_EQ(path(wb, blk.q).path, P::kGemv);
  p.gemv_refusal = "x rows not 16-byte aligned";  // kAuto falls through to W8A8
  EXPECT_EQ(path(wb, blk.q).path, P::kW8a8);
  p.gemv_refusal = "";
  p.n = 65;
  for (auto [w, q] : {std::pair{&wb, &blk.q}, {&wc, &ch.q}, {&wt, &tensor.q}}) {
    const ops::QuantizedLinearSchedule s = path(*w, *q);
    EXPECT_EQ(s.path, P::kW8a8);
    EXPECT_EQ(s.w8a8_refusal, "");
  }
  auto refused = [&](const QuantizedWeight& w, const QuantConfig& q, const std::string& why) {
    const ops::QuantizedLinearSchedule s = path(w, q);
    EXPECT_EQ(s.path, P::kDequantGemm) << why;
    EXPECT_NE(s.w8a8_refusal.find(why), std::string::npos) << s.w8a8_refusal;
  };
  refused(wa, awq.q, "not FP8");
  refused(wo, odd_blk.q, "48x80");
  refused(narrow, blk.q, "multiples of 16");
  p.sm = 80;
  refused(wb, blk.q, "sm_80");
  p.sm = 100;
  refused(wb, blk.q, "sm_100");
  p.sm = 90;
  p.x_dtype = DType::kF32;
  p.out_dtype = DType::kF32;
  refused(wb, blk.q, "f32 x");
  p.x_dtype = DType::kBF16;
  p.out_dtype = DType::kF16;
  refused(wb, blk.q, "f16 out");
  p.out_dtype = DType::kF32;
  EXPECT_EQ(path(wb, blk.q).path, P::kW8a8);
  p.out_aligned16 = false;
  refused(wb, blk.q, "16-byte aligned");
  p.out_aligned16 = true;
  // Requested paths: run as asked, or a clear kUnsupported naming why not.
  p.requested = P::kDequantGemm;
  EXPECT_EQ(path(wb, blk.q).path, P::kDequantGemm);
  p.requested = P::kW8a8;
  EXPECT_EQ(path(wb, blk.q).path, P::kW8a8);
  for (auto [w, q] : {std::pair{&wa, &awq.q}, {&wo, &odd_blk.q}}) {
    try {
      path(*w, *q);
      ADD_FAILURE() << "W8A8 accepted " << quant_method_name(w->method);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    }
  }
  p.requested = P::kGemv;
  p.gemv_refusal = "n = 65 outside [1, 64]";
  try {
    path(wb, blk.q);
    ADD_FAILURE() << "a refused GEMV accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
  }
}

TEST(QuantizedLinearSchedule, W8a8ChunksFitTheWorkspace) {
  const quant_cases::Format blk = w8a8_cases::formats()[0];
  const QuantizedWeight w = weight_of(blk, 256, 4096);
  // The layout: 256-aligned parts in order, the codes [rows, in] first.
  const ops::W8a8Layout l = ops::w8a8_layout(4096, w);
  EXPECT_EQ(l.codes, 0);
  EXPECT_EQ(l.act_scales, 4096 * 4096);
  EXPECT_EQ(l.weight_scales, l.act_scales + 32 * 4096 * 4);
  EXPECT_EQ(l.tail_out, l.weight_scales + 2 * 32 * 4);  // 2 block rows x 32 (a multiple of 4)
  EXPECT_EQ(l.bytes, l.tail_out + 4 * 256 * 4);
  for (int64_t b : {l.act_scales, l.weight_scales, l.tail_out, l.bytes}) EXPECT_EQ(b % 256, 0);
  // The op's own workspace: min(n, kW8a8MaxChunkRows) rounded up to 4.
  EXPECT_EQ(ops::w8a8_chunk_rows(65, w, 0), 68);
  EXPECT_EQ(ops::w8a8_chunk_rows(4096, w, 0), 4096);
  EXPECT_EQ(ops::w8a8_chunk_rows(100000, w, 0), ops::kW8a8MaxChunkRows);
  // A caller's workspace: the most rows that fit, whole 128-row tiles from 128 on.
  for (int64_t rows : {int64_t(4), int64_t(100), int64_t(128), int64_t(1000), int64_t(8192)}) {
    const int64_t bytes = ops::w8a8_layout(rows, w).bytes;
    const int64_t got = ops::w8a8_chunk_rows(1 << 20, w, bytes);
    EXPECT_LE(ops::w8a8_layout(got, w).bytes, bytes) << rows;
    EXPECT_EQ(got % (got >= 128 ? 128 : 4), 0) << rows;
    EXPECT_GE(got, rows >= 128 ? rows / 128 * 128 : rows / 4 * 4) << rows;
  }
  EXPECT_EQ(ops::w8a8_chunk_rows(4096, w, ops::w8a8_layout(4, w).bytes - 1), 0);
  // kAuto's workspace covers every path the device may take.
  const int64_t bytes = ops::quantized_linear_workspace_bytes(4096, w, DType::kBF16);
  EXPECT_GE(bytes, ops::w8a8_layout(4096, w).bytes);
  EXPECT_GE(bytes, 256 * 4096 * 2);
  EXPECT_EQ(
      ops::quantized_linear_workspace_bytes(4096, w, DType::kBF16, QuantizedLinearPath::kW8a8),
      ops::w8a8_layout(4096, w).bytes);
}

// The CPU twin's W8A8 against its W8A16 (the reference), within the bound of w8a8_cases.h; the
// error is there (W8A8 is not W8A16 in disguise) and on random data far below the bound.
TEST(QuantizedLinearW8a8, CpuTwinWithinTheBoundOfW8a16) {
  for (const quant_cases::Format& f : w8a8_cases::formats())
    for (auto [out, in] : w8a8_cases::shapes()) {
      SCOPED_TRACE(f.name + " [" + std::to_string(out) + ", " + std::to_string(in) + "]");
      const QuantizedWeight w = weight_of(f, out, in);
      Tensor abs_w = dequantize(w, f.q, DType::kF32);
      for (int64_t i = 0; i < abs_w.numel(); ++i)
        abs_w.data<float>()[i] = std::abs(abs_w.data<float>()[i]);
      const int64_t n = 9;
      const std::vector<float> xv = activations(n, in, 11);
      Tensor x = Tensor::empty({n, in}, DType::kF32);
      std::copy(xv.begin(), xv.end(), x.data<float>());
      Tensor y8 = Tensor::empty({n, out}, DType::kF32), y16 = Tensor::empty({n, out}, DType::kF32);
      ops::quantized_linear_cpu(x, w, f.q, Tensor(), y8, QuantizedLinearPath::kW8a8);
      ops::quantized_linear_cpu(x, w, f.q, Tensor(), y16);
      const Tensor bound = w8a8_cases::w8a8_bound(x, w, f.q, abs_w);
      double max_ratio = 0, err2 = 0, ref2 = 0;
      for (int64_t i = 0; i < n * out; ++i) {
        const double e = std::abs(double(y8.data<float>()[i]) - y16.data<float>()[i]);
        ASSERT_LE(e, bound.data<float>()[i]) << "output " << i;
        max_ratio = std::max(max_ratio, e / bound.data<float>()[i]);
        err2 += e * e;
        ref2 += double(y16.data<float>()[i]) * y16.data<float>()[i];
      }
      EXPECT_GT(err2, 0.0);
      const double rel_rms = std::sqrt(err2 / ref2);
      EXPECT_LT(rel_rms, std::ldexp(1.0, -4));
      std::printf(
          "  %-18s [%lld, %lld]: W8A8 vs W8A16 rms %.2e of the outputs, max %.2f of the "
          "bound\n",
          f.name.c_str(), (long long)out, (long long)in, rel_rms, max_ratio);
    }
}

TEST(QuantizedLinearW8a8, CpuTwinRefusesWhatTheGemmCannotRun) {
  const quant_cases::Format awq = quant_cases::formats().front();
  const QuantizedWeight w = weight_of(awq, 16, 128);
  try {
    ops::quantized_linear_cpu(Tensor::zeros({1, 128}, DType::kF32), w, awq.q, Tensor(),
                              Tensor::zeros({1, 16}, DType::kF32), QuantizedLinearPath::kW8a8);
    ADD_FAILURE() << "W8A8 ran AWQ";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
}

}  // namespace
}  // namespace longctx
