// A 4-float vector (GCC vector extension, SSE2 on x86-64 baseline, NEON on arm64) for the CPU
// reference's hot loops. The loops stay element-wise: lane i computes exactly what a scalar loop
// would (one multiply, one add, same order), so results do not depend on the vector width.
// Accumulators kept as arrays of f32x4 with a fully unrolled update stay in registers; plain
// float arrays updated in a loop are kept in memory by GCC at -O2.
#pragma once

#include <cstring>

namespace longctx::ops {

typedef float f32x4 __attribute__((vector_size(16)));

inline f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store4(float* p, f32x4 v) { std::memcpy(p, &v, sizeof v); }

}  // namespace longctx::ops
