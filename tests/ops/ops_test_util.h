// Small helpers for the op tests: random tensors and float comparisons.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx::testing {

// A tensor of `dtype` filled with uniform values in [lo, hi) (rounded to the dtype).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed, float lo = -1.f,
                            float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor f = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = dist(rng);
  return dtype == DType::kF32 ? f : f.to_dtype(dtype);
}

// Element i of a float tensor (f32/bf16/f16, contiguous) as double.
inline double value_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kBF16:
      return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::kF16:
      return f16_to_f32(t.data<uint16_t>()[i]);
    default:
      return 0;
  }
}

inline double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = std::abs(value_at(a, i) - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates as the max
  }
  return m;
}

}  // namespace longctx::testing
