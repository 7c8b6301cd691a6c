// The FP8 KV cache in the CPU references (kernels/kv_format.h): the KV store encodes every row
// within the E4M3 bound of its page's scale, keeps each (page, KV head)'s scale at the smallest
// power of two over the page's amax, re-encodes a page's earlier rows exactly when a later row
// raises the scale, and the decode and paged prefill references read FP8 K/V as exactly the
// dequantized values (bitwise the same outputs as an f32 cache holding them). Odd shapes: GQA
// 3, head_dim 20, pages of 5 in shuffled order, partial last pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/kv_store_params.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

using kernels::KvCacheFormat;

constexpr int kHkv = 2, kHq = 6, kD = 20, kPage = 5;

// The smallest power of two s with amax <= 448 s, by search (independent of fp8_page_scale).
float want_scale(float amax) {
  if (amax == 0.f) return 0.f;
  float s = 0x1p-60f;
  while (amax > 448.f * s) s *= 2.f;
  return s;
}

// Sequences of kv_lens tokens in shuffled pages of an FP8 pool, with their f32 source rows.
struct Fp8Pool {
  int num_pages = 0;
  std::vector<int> kv_lens;
  std::vector<std::vector<int32_t>> pages;  // per sequence
  std::vector<float> k, v;                  // [tokens, kHkv, kD] sources, sequences in order
  std::vector<int64_t> slots;               // [tokens]
  std::vector<uint8_t> k_cache, v_cache;    // [num_pages, kPage, kHkv, kD]
  std::vector<float> k_scale, v_scale;      // [num_pages, kHkv]

  explicit Fp8Pool(std::vector<int> lens, uint32_t seed) : kv_lens(std::move(lens)) {
    std::mt19937 rng(seed);
    for (int len : kv_lens) num_pages += (len + kPage - 1) / kPage;
    num_pages += 2;  // pages no sequence uses
    std::vector<int32_t> ids(num_pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::normal_distribution<float> n(0.f, 1.f);
    size_t next = 0;
    for (size_t s = 0; s < kv_lens.size(); ++s) {
      pages.emplace_back();
      for (int j = 0; j < kv_lens[s]; j += kPage) pages[s].push_back(ids[next++]);
      for (int j = 0; j < kv_lens[s]; ++j) {
        slots.push_back(int64_t(pages[s][j / kPage]) * kPage + j % kPage);
        // Heads of different magnitudes; now and then an outlier row, growing along the
        // sequence so appended rows raise their page's scale.
        for (int h = 0; h < kHkv; ++h) {
          const float mag = (h == 0 ? 0.05f : 3.f) * (j % 4 == 3 ? 1.f + j : 1.f);
          for (int c = 0; c < kD; ++c) {
            k.push_back(mag * n(rng));
            v.push_back(mag * n(rng));
          }
        }
      }
    }
    k_cache.assign(size_t(num_pages) * kPage * kHkv * kD, 0xA5);  // stale bytes
    v_cache.assign(k_cache.size(), 0x5A);
    k_scale.assign(size_t(num_pages) * kHkv, 123.f);
    v_scale.assign(k_scale.size(), 123.f);
  }

  int tokens() const { return static_cast<int>(slots.size()); }

  // Stores tokens [t0, t1) in one call.
  void store(int t0, int t1) {
    kernels::KvStoreParams p;
    p.k = k.data() + size_t(t0) * kHkv * kD;
    p.v = v.data() + size_t(t0) * kHkv * kD;
    p.k_token_stride = p.v_token_stride = kHkv * kD;
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.slot_mapping = slots.data() + t0;
    p.num_tokens = t1 - t0;
    p.num_kv_heads = kHkv;
    p.head_dim = kD;
    p.page_size = kPage;
    p.num_pages = num_pages;
    p.dtype = DType::kF32;
    p.kv_format = KvCacheFormat::kFp8E4M3;
    p.k_scale = k_scale.data();
    p.v_scale = v_scale.data();
    kernels::cpu::kv_store(p);
  }

  // The dequantized value of element c of head h at `slot` of K (half 0) or V (half 1).
  float dequant(int half, int64_t slot, int h, int c) const {
    const auto& cache = half == 0 ? k_cache : v_cache;
    const auto& scale = half == 0 ? k_scale : v_scale;
    return fp8e4m3_to_f32(cache[(slot * kHkv + h) * kD + c]) * scale[(slot / kPage) * kHkv + h];
  }
  // The whole pool dequantized into f32 caches.
  std::vector<float> dequant_cache(int half) const {
    std::vector<float> out(size_t(num_pages) * kPage * kHkv * kD);
    for (int64_t slot = 0; slot < int64_t(num_pages) * kPage; ++slot)
      for (int h = 0; h < kHkv; ++h)
        for (int c = 0; c < kD; ++c) out[(slot * kHkv + h) * kD + c] = dequant(half, slot, h, c);
    return out;
  }
  const float* src(int half, int t, int h) const {
    return (half == 0 ? k : v).data() + (size_t(t) * kHkv + h) * kD;
  }
};

// Every page's scale is the power of two of its rows' amax; every element within the bound:
// 2^-4 relative (a normal code) plus `sub_steps` subnormal steps 2^-9 s absolute.
void expect_scales_and_bounds(const Fp8Pool& pool, float sub_steps) {
  for (int half = 0; half < 2; ++half) {
    std::vector<float> amax(size_t(pool.num_pages) * kHkv, 0.f);
    for (int t = 0; t < pool.tokens(); ++t)
      for (int h = 0; h < kHkv; ++h)
        for (int c = 0; c < kD; ++c) {
          float& a = amax[(pool.slots[t] / kPage) * kHkv + h];
          a = std::max(a, std::abs(pool.src(half, t, h)[c]));
        }
    const auto& scale = half == 0 ? pool.k_scale : pool.v_scale;
    for (int t = 0; t < pool.tokens(); ++t) {
      for (int h = 0; h < kHkv; ++h) {
        const int64_t i = (pool.slots[t] / kPage) * kHkv + h;
        ASSERT_EQ(scale[i], want_scale(amax[i])) << "half " << half << " page-head " << i;
        for (int c = 0; c < kD; ++c) {
          const float x = pool.src(half, t, h)[c], q = pool.dequant(half, pool.slots[t], h, c);
          ASSERT_LE(std::abs(x - q), 0x1p-4f * std::abs(x) + sub_steps * 0x1p-9f * scale[i])
              << "half " << half << " token " << t << " head " << h << " element " << c;
        }
      }
    }
  }
}

TEST(Fp8KvStore, EncodesWithinTheBoundOfThePageScale) {
  Fp8Pool pool({1, 12, 23}, 1);
  pool.store(0, pool.tokens());
  expect_scales_and_bounds(pool, 0.5f);  // one rounding
}

TEST(Fp8KvStore, AppendedRowsRaiseThePageScaleExactly) {
  Fp8Pool bulk({1, 12, 23}, 2), appended({1, 12, 23}, 2);
  bulk.store(0, bulk.tokens());
  int raised = 0;  // rows that raised their page's scale after the page's first row
  for (int t = 0; t < appended.tokens(); ++t) {  // as decode appends
    const std::vector<float> before = appended.k_scale;
    appended.store(t, t + 1);
    if (appended.slots[t] % kPage != 0) raised += before != appended.k_scale;
  }
  ASSERT_GT(raised, 0) << "the data never grows a page's scale";
  expect_scales_and_bounds(appended, 1.5f);  // a subnormal code may round twice
  EXPECT_EQ(appended.k_scale, bulk.k_scale);
  EXPECT_EQ(appended.v_scale, bulk.v_scale);
  // Re-encoding at a larger power-of-two scale is exact for every code that stays normal; a
  // subnormal one is at most one step off the one-shot encoding.
  for (int half = 0; half < 2; ++half) {
    const auto& a = half == 0 ? appended.k_cache : appended.v_cache;
    const auto& b = half == 0 ? bulk.k_cache : bulk.v_cache;
    for (int t = 0; t < bulk.tokens(); ++t)
      for (int h = 0; h < kHkv; ++h)
        for (int c = 0; c < kD; ++c) {
          const size_t i = (bulk.slots[t] * kHkv + h) * kD + c;
          if ((b[i] & 0x7f) >= 0x08) {
            ASSERT_EQ(a[i], b[i]) << "token " << t << " head " << h << " element " << c;
          } else {
            ASSERT_LE(std::abs(fp8e4m3_to_f32(a[i]) - fp8e4m3_to_f32(b[i])), 0x1p-9f);
          }
        }
  }
}

TEST(Fp8KvStore, MissingScalesAreAnError) {
  Fp8Pool pool({3}, 3);
  kernels::KvStoreParams p;
  p.k = pool.k.data();
  p.v = pool.v.data();
  p.k_token_stride = p.v_token_stride = kHkv * kD;
  p.k_cache = pool.k_cache.data();
  p.v_cache = pool.v_cache.data();
  p.slot_mapping = pool.slots.data();
  p.num_tokens = 3;
  p.num_kv_heads = kHkv;
  p.head_dim = kD;
  p.page_size = kPage;
  p.num_pages = pool.num_pages;
  p.dtype = DType::kF32;
  p.kv_format = KvCacheFormat::kFp8E4M3;
  try {
    kernels::cpu::kv_store(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("k_scale"), std::string::npos) << e.what();
  }
}

// Page tables of the pool's sequences.
struct Tables {
  std::vector<int32_t> indptr{0}, indices, last;
  explicit Tables(const Fp8Pool& pool) {
    for (size_t s = 0; s < pool.kv_lens.size(); ++s) {
      indices.insert(indices.end(), pool.pages[s].begin(), pool.pages[s].end());
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(pool.kv_lens[s] - (static_cast<int>(pool.pages[s].size()) - 1) * kPage);
    }
  }
};

std::vector<float> random_q(int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> q(size_t(rows) * kHq * kD);
  for (float& x : q) x = n(rng);
  return q;
}

TEST(Fp8KvRead, DecodeReadsTheDequantizedValues) {
  Fp8Pool pool({1, 12, 23}, 4);
  pool.store(0, pool.tokens());
  const Tables tab(pool);
  const int batch = static_cast<int>(pool.kv_lens.size());
  const std::vector<float> q = random_q(batch, 5);
  const std::vector<float> kf = pool.dequant_cache(0), vf = pool.dequant_cache(1);
  auto run = [&](bool fp8, std::vector<float>& o, std::vector<float>& lse) {
    kernels::DecodeParams p;
    p.q = q.data();
    p.k_cache = fp8 ? static_cast<const void*>(pool.k_cache.data()) : kf.data();
    p.v_cache = fp8 ? static_cast<const void*>(pool.v_cache.data()) : vf.data();
    o.assign(q.size(), 0.f);
    lse.assign(size_t(batch) * kHq, 0.f);
    p.o = o.data();
    p.lse = lse.data();
    p.kv_indptr = tab.indptr.data();
    p.kv_indices = tab.indices.data();
    p.kv_last_page_len = tab.last.data();
    p.batch_size = batch;
    p.num_qo_heads = kHq;
    p.num_kv_heads = kHkv;
    p.head_dim = kD;
    p.page_size = kPage;
    p.dtype = DType::kF32;
    p.sm_scale = 1.f / std::sqrt(float(kD));
    if (fp8) {
      p.kv_format = KvCacheFormat::kFp8E4M3;
      p.k_scale = pool.k_scale.data();
      p.v_scale = pool.v_scale.data();
    }
    kernels::cpu::decode_attention(p);
  };
  std::vector<float> o8, lse8, of, lsef;
  run(true, o8, lse8);
  run(false, of, lsef);
  EXPECT_EQ(o8, of);
  EXPECT_EQ(lse8, lsef);
}

TEST(Fp8KvRead, PagedPrefillReadsTheDequantizedValues) {
  Fp8Pool pool({1, 12, 23}, 6);
  pool.store(0, pool.tokens());
  const Tables tab(pool);
  const int batch = static_cast<int>(pool.kv_lens.size());
  const std::vector<int32_t> qo = {0, 1, 8, 8 + 23};  // the last request's whole prefill
  const std::vector<float> q = random_q(qo.back(), 7);
  const std::vector<float> kf = pool.dequant_cache(0), vf = pool.dequant_cache(1);
  auto run = [&](bool fp8, std::vector<float>& o, std::vector<float>& lse) {
    kernels::PagedPrefillParams p;
    p.q = q.data();
    p.k_cache = fp8 ? static_cast<const void*>(pool.k_cache.data()) : kf.data();
    p.v_cache = fp8 ? static_cast<const void*>(pool.v_cache.data()) : vf.data();
    o.assign(q.size(), 0.f);
    lse.assign(size_t(qo.back()) * kHq, 0.f);
    p.o = o.data();
    p.lse = lse.data();
    p.qo_indptr = qo.data();
    p.kv_indptr = tab.indptr.data();
    p.kv_indices = tab.indices.data();
    p.kv_last_page_len = tab.last.data();
    p.batch_size = batch;
    p.num_qo_heads = kHq;
    p.num_kv_heads = kHkv;
    p.head_dim = kD;
    p.page_size = kPage;
    p.dtype = DType::kF32;
    p.mask_mode = kernels::MaskMode::kCausal;
    p.sm_scale = 1.f / std::sqrt(float(kD));
    if (fp8) {
      p.kv_format = KvCacheFormat::kFp8E4M3;
      p.k_scale = pool.k_scale.data();
      p.v_scale = pool.v_scale.data();
    }
    kernels::cpu::paged_prefill_ref(p);
  };
  std::vector<float> o8, lse8, of, lsef;
  run(true, o8, lse8);
  run(false, of, lsef);
  EXPECT_EQ(o8, of);
  EXPECT_EQ(lse8, lsef);
  // Without scales an FP8 read is refused.
  kernels::PagedPrefillParams p;
  p.q = q.data();
  p.k_cache = pool.k_cache.data();
  p.v_cache = pool.v_cache.data();
  p.o = o8.data();
  p.qo_indptr = qo.data();
  p.kv_indptr = tab.indptr.data();
  p.kv_indices = tab.indices.data();
  p.kv_last_page_len = tab.last.data();
  p.batch_size = batch;
  p.num_qo_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = kD;
  p.page_size = kPage;
  p.dtype = DType::kF32;
  p.kv_format = KvCacheFormat::kFp8E4M3;
  EXPECT_THROW(kernels::cpu::paged_prefill_ref(p), Error);
}

}  // namespace
}  // namespace longctx
