// FP8 pages for the attention kernels' GPU tests: a PagedCase's 16-bit K/V pool encoded by the CPU
// KV store (kernels/cpu/kv_store_cpu.h) into E4M3 codes and page scales, slot by slot in order as
// the engine appends. Before encoding, each row is multiplied by 2^e (e in -2 .. 1 from a hash of
// the seed and the row) so pages of one pool hold different scales and later rows raise a page's
// scale (re-encoding its earlier rows): the readers see scales that vary per page and head.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/paged_case.h"

namespace longctx::gpu_test {

struct Fp8Pages {
  std::vector<uint8_t> k, v;            // codes, [num_pages, page_size, num_kv_heads, head_dim]
  std::vector<float> k_scale, v_scale;  // [num_pages, num_kv_heads]
};

inline Fp8Pages make_fp8_pages(const testing::PagedCase& h, uint64_t seed) {
  const auto& s = h.shape;
  const int64_t slots = h.num_pages * s.page_size, row = int64_t(s.num_kv_heads) * s.head_dim;
  std::vector<float> k(slots * row), v(slots * row);
  for (int64_t r = 0; r < slots * s.num_kv_heads; ++r) {
    const uint64_t z = (seed * 0x9E3779B97F4A7C15ull + uint64_t(r)) * 0xBF58476D1CE4E5B9ull;
    const float fk = std::ldexp(1.f, int((z >> 40) % 4) - 2);
    const float fv = std::ldexp(1.f, int((z >> 50) % 4) - 2);
    for (int c = 0; c < s.head_dim; ++c) {
      const int64_t i = r * s.head_dim + c;
      k[i] = fk * (s.dtype == DType::kBF16 ? bf16_to_f32(h.k_cache[i]) : f16_to_f32(h.k_cache[i]));
      v[i] = fv * (s.dtype == DType::kBF16 ? bf16_to_f32(h.v_cache[i]) : f16_to_f32(h.v_cache[i]));
    }
  }
  Fp8Pages out;
  out.k.resize(slots * row);
  out.v.resize(slots * row);
  out.k_scale.assign(size_t(h.num_pages) * s.num_kv_heads, 0.f);
  out.v_scale.assign(out.k_scale.size(), 0.f);
  std::vector<int64_t> slot_ids(slots);
  for (int64_t i = 0; i < slots; ++i) slot_ids[i] = i;
  kernels::KvStoreParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = p.v_token_stride = row;
  p.k_cache = out.k.data();
  p.v_cache = out.v.data();
  p.slot_mapping = slot_ids.data();
  p.num_tokens = int(slots);
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.page_size = s.page_size;
  p.num_pages = int(h.num_pages);
  p.dtype = DType::kF32;
  p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  p.k_scale = out.k_scale.data();
  p.v_scale = out.v_scale.data();
  kernels::cpu::kv_store(p);
  return out;
}

// Sets the FP8 fields of decode or paged prefill params to `pages` (host or device pointers).
template <typename Params>
void set_fp8(Params& p, const void* k, const void* v, const float* k_scale, const float* v_scale) {
  p.k_cache = k;
  p.v_cache = v;
  p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
}

}  // namespace longctx::gpu_test
