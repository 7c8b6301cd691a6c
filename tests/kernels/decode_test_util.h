// Helpers of the decode / merge / block-causal CPU tests: seeded random bf16/f16 data and a
// direct dense attention in double precision (the independent check of the references).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "longctx/core/dtype.h"

namespace longctx::testing {

// n values of `dtype` (bf16/f16 as uint16_t bits), uniform in [-1, 1], stored as raw bits.
inline std::vector<uint16_t> random_half(int64_t n, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = dtype == DType::kBF16 ? f32_to_bf16(u(rng)) : f32_to_f16(u(rng));
  return out;
}

inline float half_to_f32(uint16_t v, DType dtype) {
  return dtype == DType::kBF16 ? bf16_to_f32(v) : f16_to_f32(v);
}

// One query row against keys/values given as float rows [n_k][D]; double accumulation.
// Returns lse (natural log; -inf for no key) and writes o[D].
inline double dense_row(const std::vector<float>& q, const std::vector<std::vector<float>>& k,
                        const std::vector<std::vector<float>>& v, double scale,
                        std::vector<double>& o) {
  const size_t D = q.size();
  o.assign(D, 0.0);
  if (k.empty()) return -std::numeric_limits<double>::infinity();
  std::vector<double> s(k.size());
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < k.size(); ++j) {
    double dot = 0;
    for (size_t d = 0; d < D; ++d) dot += double(q[d]) * k[j][d];
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  double l = 0;
  for (size_t j = 0; j < k.size(); ++j) {
    double w = std::exp(s[j] - m);
    l += w;
    for (size_t d = 0; d < D; ++d) o[d] += w * v[j][d];
  }
  for (auto& x : o) x /= l;
  return m + std::log(l);
}

}  // namespace longctx::testing
