// The quantized Linear's CPU twin: every format of tests/common/quantized_linear_cases.h on odd
// shapes and n = 1..9 (with and without bias, strided x and out rows), against
//   - a double-precision sum over the loader's dequantized weight (the op's plumbing: which
//     weight, which rows, bias, strides): |got - ref| <= S * 2^-24 * (in + 16), S = sum |x w|
//     (the twin's sequential fp32 sum);
//   - the dense weight the checkpoint was made from, within the format's rounding bound (the
//     packing round trip): per weight one int4 step s of its group (round to nearest, plus the
//     clamp of a range's top value), or 2^-4 |w| + 2^-9 scale for E4M3 (3 mantissa bits;
//     subnormals' spacing), summed with |x|.
// Bad inputs through the dispatcher: the shared cases (a clear Error naming the tensor).
#include <gtest/gtest.h>

#include <cmath>

#include "common/quantized_linear_cases.h"
#include "loader/quantized_weights.h"
#include "ops/ops_test_util.h"
#include "ops/quantized_linear.h"

namespace longctx {
namespace {

using quant_cases::Format;

// The largest rounding error of each weight of w made from `dense` ([out, in] f32).
Tensor rounding_bound(const QuantizedWeight& w, const QuantConfig& q) {
  const int64_t out = w.out_features, in = w.in_features;
  Tensor b = Tensor::empty({out, in}, DType::kF32);
  const Tensor s = w.scales.to_dtype(DType::kF32);
  const Tensor deq = dequantize(w, q, DType::kF32);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      float bound;
      if (quant_cases::is_int4(q)) {
        bound = s.data<float>()[(i / q.group_of(in)) * out + o];
      } else {
        const float scale = q.method == QuantMethod::kFp8Block
                                ? s.data<float>()[(o / q.block_out) * s.size(1) + i / q.block_in]
                            : q.fp8_strategy == Fp8ScaleStrategy::kChannel ? s.data<float>()[o]
                                                                           : s.data<float>()[0];
        bound = std::ldexp(std::abs(deq.data<float>()[o * in + i]), -4) + std::ldexp(scale, -9);
      }
      b.data<float>()[o * in + i] = bound;
    }
  return b;
}

struct Case {
  int64_t n;
  bool bias = false;
  int64_t x_pad = 0, out_pad = 0;
};

void run_format(const Format& f, int64_t out, int64_t in, uint32_t seed) {
  SCOPED_TRACE(f.name + " [" + std::to_string(out) + ", " + std::to_string(in) + "]");
  const Tensor dense = quant_cases::random_dense(out, in, seed);
  const QuantizedWeight w = quantize_rtn(dense, f.q, "test.weight");
  const Tensor deq = dequantize(w, f.q, DType::kF32);
  const Tensor bound = rounding_bound(w, f.q);
  std::vector<Case> cases;
  for (int64_t n = 1; n <= 9; ++n) cases.push_back({n, n % 3 == 0, n == 4 ? 8 : 0, n == 5 ? 3 : 0});
  for (const Case& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n));
    const int64_t ldx = in + c.x_pad, ldo = out + c.out_pad;
    const Tensor xs = testing::random_tensor({c.n, ldx}, DType::kF32, seed + uint32_t(c.n));
    const Tensor x = xs.slice(1, 0, in);
    const Tensor bias = c.bias ? testing::random_tensor({out}, DType::kBF16, seed + 100) : Tensor();
    Tensor ys = Tensor::empty({c.n, ldo}, DType::kF32);
    for (int64_t i = 0; i < ys.numel(); ++i) ys.data<float>()[i] = 12345.f;
    const Tensor y = ys.slice(1, 0, out);
    ops::quantized_linear(x, w, f.q, bias, y);
    int64_t bad_plumbing = 0, bad_bound = 0;
    for (int64_t j = 0; j < c.n; ++j) {
      const float* xr = xs.data<float>() + j * ldx;
      for (int64_t o = 0; o < out; ++o) {
        double ref = 0, s = 0, orig = 0, err = 0;
        for (int64_t i = 0; i < in; ++i) {
          const double wd = deq.data<float>()[o * in + i];
          ref += double(xr[i]) * wd;
          s += std::abs(double(xr[i]) * wd);
          orig += double(xr[i]) * dense.data<float>()[o * in + i];
          err += std::abs(double(xr[i])) * bound.data<float>()[o * in + i];
        }
        const double b = c.bias ? testing::value_at(bias, o) : 0.0;
        const double got = ys.data<float>()[j * ldo + o];
        const double slack = (s + std::abs(b)) * std::ldexp(1.0, -24) * double(in + 16);
        if (!(std::abs(got - (ref + b)) <= slack) && bad_plumbing++ == 0)
          ADD_FAILURE() << "row " << j << " col " << o << ": got " << got << ", dequantized "
                        << ref + b << " (allowed " << slack << ")";
        if (!(std::abs(got - (orig + b)) <= err + slack) && bad_bound++ == 0)
          ADD_FAILURE() << "row " << j << " col " << o << ": got " << got << ", dense " << orig + b
                        << " (format's bound " << err << ")";
      }
      for (int64_t o = out; o < ldo; ++o)
        EXPECT_EQ(ys.data<float>()[j * ldo + o], 12345.f) << "padding of row " << j;
    }
  }
}

TEST(QuantizedLinear, EveryFormatOddShapes) {
  uint32_t seed = 1;
  for (const Format& f : quant_cases::formats())
    for (auto [out, in] : quant_cases::odd_shapes(f.q, false)) run_format(f, out, in, seed++);
}

TEST(QuantizedLinear, EmptyBatchWritesNothing) {
  const Format f = quant_cases::formats().front();
  const QuantizedWeight w = quant_cases::random_quantized(16, 64, f.q, 3);
  ops::quantized_linear(Tensor::empty({0, 64}, DType::kF32), w, f.q, Tensor(),
                        Tensor::empty({0, 16}, DType::kF32));
}

TEST(QuantizedLinear, BadInputsAreClearErrors) {
  quant_cases::expect_bad_inputs_rejected(
      [](const Tensor& x, const QuantizedWeight& w, const QuantConfig& q, const Tensor& out) {
        ops::quantized_linear(x, w, q, Tensor(), out);
      },
      Device::cpu(), DType::kF32);
  // The CPU twin takes f32 activations only.
  const Format f = quant_cases::formats().front();
  const QuantizedWeight w = quant_cases::random_quantized(16, 64, f.q, 4);
  try {
    ops::quantized_linear_cpu(Tensor::zeros({1, 64}, DType::kBF16), w, f.q, Tensor(),
                              Tensor::zeros({1, 16}, DType::kF32));
    ADD_FAILURE() << "bf16 x accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("x must be f32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace longctx
