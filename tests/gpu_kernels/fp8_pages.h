// FP8 pages for the attention kernels' GPU tests: a PagedCase's 16-bit K/V pool encoded by the CPU
// KV store (kernels/cpu/kv_store_cpu.h) into E4M3 codes and page scales, slot by slot in order as
// the engine appends. Before encoding, each row is multiplied by 2^e (e in -2 .. 1 from a hash of
// the seed and the row) so pages of one pool hold different scales and later rows raise a page's
// scale (re-encoding its earlier rows): the readers see scales that vary per page and head.
#pragma once

#include <algorithm>
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
  const int64_t ps = s.page_size, row = int64_t(s.num_kv_heads) * s.head_dim;
  const int64_t slots = h.num_pages * ps;
  Fp8Pages out;
  out.k.resize(slots * row);
  out.v.resize(slots * row);
  out.k_scale.assign(size_t(h.num_pages) * s.num_kv_heads, 0.f);
  out.v_scale.assign(out.k_scale.size(), 0.f);
  auto load = [&](const std::vector<uint16_t>& c, int64_t i) {
    return s.dtype == DType::kBF16 ? bf16_to_f32(c[i]) : f16_to_f32(c[i]);
  };
  // Whole pages at a time (a page's rows in slot order), so the f32 rows stay small.
  const int64_t pages_per_pass = std::max<int64_t>(1, (int64_t(1) << 16) / ps);
  std::vector<float> k, v;
  std::vector<int64_t> slot_ids;
  for (int64_t p0 = 0; p0 < h.num_pages; p0 += pages_per_pass) {
    const int64_t s0 = p0 * ps, n = std::min(h.num_pages - p0, pages_per_pass) * ps;
    k.resize(n * row);
    v.resize(n * row);
    slot_ids.resize(n);
    for (int64_t t = 0; t < n; ++t) {
      slot_ids[t] = s0 + t;
      for (int64_t hh = 0; hh < s.num_kv_heads; ++hh) {
        const uint64_t r = uint64_t((s0 + t) * s.num_kv_heads + hh);
        const uint64_t z = (seed * 0x9E3779B97F4A7C15ull + r) * 0xBF58476D1CE4E5B9ull;
        const float fk = std::ldexp(1.f, int((z >> 40) % 4) - 2);
        const float fv = std::ldexp(1.f, int((z >> 50) % 4) - 2);
        for (int64_t c = 0; c < s.head_dim; ++c) {
          const int64_t at = hh * s.head_dim + c;
          k[t * row + at] = fk * load(h.k_cache, (s0 + t) * row + at);
          v[t * row + at] = fv * load(h.v_cache, (s0 + t) * row + at);
        }
      }
    }
    kernels::KvStoreParams p;
    p.k = k.data();
    p.v = v.data();
    p.k_token_stride = p.v_token_stride = row;
    p.k_cache = out.k.data();
    p.v_cache = out.v.data();
    p.slot_mapping = slot_ids.data();
    p.num_tokens = int(n);
    p.num_kv_heads = s.num_kv_heads;
    p.head_dim = s.head_dim;
    p.page_size = s.page_size;
    p.num_pages = int(h.num_pages);
    p.dtype = DType::kF32;
    p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    p.k_scale = out.k_scale.data();
    p.v_scale = out.v_scale.data();
    kernels::cpu::kv_store(p);
  }
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
