// The W8A8 path's property, shared by the CPU test (tests/ops: the CPU twin's kW8a8) and the GPU
// test (tests/gpu_ops: the CUDA W8A8 GEMM): its outputs stay within a written bound of the W8A16
// reference (the weight dequantized exactly, x unquantized).
//
// The bound, per output (j, o), from the activation quantization alone (the weight's codes and
// scales are the same on both sides): x_k is replaced by code * s_g (s_g the scale of its token
// and group). E4M3 keeps 3 mantissa bits, so for |x_k / s_g| in the normal range (>= 2^-6) the
// code is off by at most half an ulp, 2^-4 |x_k| relative; below it (subnormal codes, spacing
// 2^-9) by at most 2^-10 s_g; amax / s_g is 448 up to the division's rounding, which saturates
// to 448, within the first term. Hence
//   |y8 - y16| <= 2^-4 sum_k |w_ok x_jk| + 2^-10 sum_g s_jg sum_{k in g} |w_ok|
// plus both sides' fp32 sums (2 * 2^-24 (in + 16) sum_k |w x|; the GPU adds its own terms). On
// random data the error is far below the bound (about 2^-4 / sqrt(3) of the root-sum-square of
// the products, not of their absolute sum): the tests also report it.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/quantized_linear_cases.h"
#include "kernels/cpu/fp8_act_quant_cpu.h"
#include "kernels/fp8_act_quant.h"
#include "loader/quantized_weights.h"
#include "longctx/core/tensor.h"

namespace longctx::w8a8_cases {

// The formats W8A8 runs: FP8 blocks of 128x128, compressed-tensors FP8 per channel and per tensor.
inline std::vector<quant_cases::Format> formats() {
  std::vector<quant_cases::Format> v;
  for (const quant_cases::Format& f : quant_cases::formats())
    if (f.name == "fp8 block 128x128" || f.name == "ct-fp8 channel" || f.name == "ct-fp8 tensor")
      v.push_back(f);
  return v;
}

// Shapes W8A8 takes (multiples of 16): in past one 128-group with a partial last group (336 =
// 2 * 128 + 80), out not a multiple of 128 (a partial block row), and a whole-block shape.
inline std::vector<std::pair<int64_t, int64_t>> shapes() { return {{208, 336}, {256, 1024}}; }

// The bound above for x [n, in] f32 (contiguous) and w's dequantized weight |W| (abs_w [out, in]
// f32): [n, out] f32.
inline Tensor w8a8_bound(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                         const Tensor& abs_w) {
  const int64_t n = x.size(0), in = x.size(1), out = w.out_features;
  const int64_t group = w.method == QuantMethod::kFp8Block ? kernels::kFp8ActGroup : in;
  const int64_t groups = (in + group - 1) / group;
  std::vector<uint8_t> codes(size_t(n * in));
  std::vector<float> scales(size_t(n * groups));
  kernels::fp8_quantize_rows_cpu(x.data<float>(), n, in, in, group, codes.data(), scales.data());
  Tensor b = Tensor::empty({n, out}, DType::kF32);
  const float* xs = x.data<float>();
  const float* ws = abs_w.data<float>();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t o = 0; o < out; ++o) {
      double rel = 0, sub = 0;
      for (int64_t k = 0; k < in; ++k) {
        rel += double(ws[o * in + k]) * std::abs(double(xs[j * in + k]));
        sub += double(ws[o * in + k]) * scales[j * groups + k / group];
      }
      b.data<float>()[j * out + o] =
          float(std::ldexp(rel, -4) + std::ldexp(sub, -10) + 2 * std::ldexp(rel, -24) * (in + 16));
    }
  return b;
}

}  // namespace longctx::w8a8_cases
