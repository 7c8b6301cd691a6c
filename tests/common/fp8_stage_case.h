// Inputs of the FP8 staging conversion (kernels/fp8_stage_params.h) for the CPU twin's test
// (tests/kernels/fp8_stage_ref_test.cpp: against the reference decoder) and the CUDA kernel's
// (tests/gpu_kernels/fp8_stage_test.cpp: against the twin): a cache of FP8 pages whose codes take
// every byte value (NaN codes 0x7f / 0xff included), page scales from a given set, and a call
// reading some of the pages in shuffled order; outputs inside guard elements.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/fp8_stage_params.h"

namespace longctx::testing {

struct Fp8StageShape {
  int cache_pages = 0;  // pages in the cache
  int call_pages = 0;   // pages the call reads (<= cache_pages, distinct, shuffled)
  int page_size = 16;
  int num_kv_heads = 2;
  int head_dim = 128;
  DType dtype = DType::kBF16;
  std::vector<float> scales = {1.f};  // the page scales drawn from
  uint64_t seed = 1;
};

inline constexpr int64_t kStageGuard = 64;  // elements before and after each output
inline constexpr uint16_t kStageGuardValue = 0xA5A5;

struct Fp8StageInputs {
  Fp8StageShape shape;
  std::vector<uint8_t> k, v;            // [cache_pages, page_size, num_kv_heads, head_dim]
  std::vector<float> k_scale, v_scale;  // [cache_pages, num_kv_heads]
  std::vector<int32_t> indices;         // [call_pages]

  int64_t page_elems() const {
    return int64_t(shape.page_size) * shape.num_kv_heads * shape.head_dim;
  }
  int64_t out_elems() const { return shape.call_pages * page_elems(); }
  // An output buffer with its guards: [kStageGuard + out_elems() + kStageGuard].
  std::vector<uint16_t> guarded_output() const {
    return std::vector<uint16_t>(out_elems() + 2 * kStageGuard, kStageGuardValue);
  }
  static bool guards_intact(const std::vector<uint16_t>& out) {
    for (int64_t i = 0; i < kStageGuard; ++i)
      if (out[i] != kStageGuardValue || out[out.size() - 1 - i] != kStageGuardValue) return false;
    return true;
  }
  // The params over the given buffers (host or device), outputs at their guards' end.
  kernels::Fp8StageParams params(const uint8_t* kc, const uint8_t* vc, const float* ks,
                                 const float* vs, const int32_t* idx, uint16_t* k_out_guarded,
                                 uint16_t* v_out_guarded, int32_t* iota) const {
    kernels::Fp8StageParams p;
    p.k_codes = kc;
    p.v_codes = vc;
    p.k_scale = ks;
    p.v_scale = vs;
    p.kv_indices = idx;
    p.k_out = k_out_guarded + kStageGuard;
    p.v_out = v_out_guarded + kStageGuard;
    p.iota_out = iota;
    p.num_pages = shape.call_pages;
    p.page_size = shape.page_size;
    p.num_kv_heads = shape.num_kv_heads;
    p.head_dim = shape.head_dim;
    p.dtype = shape.dtype;
    return p;
  }
};

inline Fp8StageInputs make_fp8_stage_inputs(const Fp8StageShape& s) {
  Fp8StageInputs in;
  in.shape = s;
  std::mt19937_64 rng(s.seed);
  const int64_t n = int64_t(s.cache_pages) * in.page_elems();
  in.k.resize(n);
  in.v.resize(n);
  // Every byte value in every page's first 256 elements (NaN codes among them), random after.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = i % in.page_elems();
    in.k[i] = e < 256 ? uint8_t(e) : uint8_t(rng());
    in.v[i] = e < 256 ? uint8_t(255 - e) : uint8_t(rng());
  }
  auto scale = [&] { return s.scales[rng() % s.scales.size()]; };
  for (int64_t i = 0; i < int64_t(s.cache_pages) * s.num_kv_heads; ++i) {
    in.k_scale.push_back(scale());
    in.v_scale.push_back(scale());
  }
  std::vector<int32_t> all(s.cache_pages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  in.indices.assign(all.begin(), all.begin() + s.call_pages);
  return in;
}

}  // namespace longctx::testing
