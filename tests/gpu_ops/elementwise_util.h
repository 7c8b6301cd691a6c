// What the row-wise op tests (elementwise_test.cpp, rope_test.cpp) share: Mirror shorthands,
// the token counts they sweep, and rope_case, which elementwise_test.cpp's perf test also times.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_ops/gpu_ops_util.h"

namespace longctx::gpu_ops_test {

using M = std::shared_ptr<Mirror>;

inline M mirror(int64_t elems, DType dt) { return std::make_shared<Mirror>(elems, dt); }
inline M random_mirror(int64_t elems, DType dt, uint64_t seed, float lo = -2.f, float hi = 2.f) {
  auto m = mirror(elems, dt);
  m->random(seed, lo, hi);
  return m;
}
inline const char* dn(DType dt) { return dtype_name(dt).data(); }
inline double es(DType dt) { return double(dtype_size(dt)); }

inline const std::vector<int64_t> kTokens = {1, 3, 17, 1000, 4096};
inline const std::vector<int64_t> kTokensSmall = {1, 3, 17};

// q and k of a fused [n, (hq + 2 hkv) hd] qkv buffer, rotated in place (v must stay as is).
CaseSpec rope_case(int64_t n, int64_t hd, int64_t hq, int64_t hkv, DType dt, uint64_t seed);

}  // namespace longctx::gpu_ops_test
