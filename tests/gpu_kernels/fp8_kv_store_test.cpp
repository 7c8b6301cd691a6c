// CUDA KV store writing an FP8 KV cache, against the CPU reference (kernels/cpu/kv_store_cpu.h):
// after every step the codes and the page scales must equal the reference's bit for bit. A step
// appends a few tokens to each of several sequences (their tokens consecutive, in slot order, as
// the engine appends), so pages fill over several steps; row magnitudes spread over 2^-12 .. 2^12
// so later rows raise a page's scale and re-encode its earlier rows; some rows hold NaN, +-Inf,
// zeros or values past 448 x scale. Sequences start inside a page the test prefilled with random
// codes and scales (a prefix another step wrote). Padding tokens and slots past the pool are
// mixed in; the caches and scales sit in guarded buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/cuda/kv_store.h"
#include "longctx/core/error.h"

namespace longctx::gpu_test {
namespace {

struct Fp8StoreShape {
  int num_seqs = 3;
  int num_kv_heads = 2;
  int head_dim = 128;
  int page_size = 16;
  int steps = 6;
  int max_step_tokens = 40;  // tokens a sequence appends per step: 0 .. this (1 = decode)
  DType dtype = DType::kBF16;
  int row_padding = 0;   // elements past num_kv_heads * head_dim in each source row
  bool specials = true;  // NaN / Inf / zero / huge rows
  uint64_t seed = 1;
};

std::string name_of(const Fp8StoreShape& s) {
  std::ostringstream os;
  os << "fp8 kv_store(seqs=" << s.num_seqs << " hk=" << s.num_kv_heads << " d=" << s.head_dim
     << " page=" << s.page_size << " steps=" << s.steps << " max=" << s.max_step_tokens << " "
     << dtype_name(s.dtype) << " row+" << s.row_padding << ")";
  return os.str();
}

void store_element(std::vector<uint8_t>& buf, int64_t i, float v, DType dt) {
  switch (dt) {
    case DType::kF32:
      reinterpret_cast<float*>(buf.data())[i] = v;
      break;
    case DType::kF16:
      reinterpret_cast<uint16_t*>(buf.data())[i] = f32_to_f16(v);
      break;
    default:
      reinterpret_cast<uint16_t*>(buf.data())[i] = f32_to_bf16(v);
  }
}

void run_fp8_store_case(const Fp8StoreShape& s) {
  SCOPED_TRACE(name_of(s));
  std::mt19937_64 rng(s.seed);
  const int hk = s.num_kv_heads, d = s.head_dim, ps = s.page_size;
  const int64_t row = int64_t(hk) * d, stride = row + s.row_padding;
  // Each sequence gets pages for all its steps plus one, shuffled over the pool.
  const int pages_per_seq = (s.steps * s.max_step_tokens + ps - 1) / ps + 2;
  const int num_pages = s.num_seqs * pages_per_seq + 1;
  std::vector<int> perm(num_pages);
  for (int i = 0; i < num_pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  const size_t cache_bytes = size_t(num_pages) * ps * row;
  std::vector<uint8_t> k_ref(cache_bytes), v_ref(cache_bytes);
  for (auto& b : k_ref) b = uint8_t(rng());
  for (auto& b : v_ref) b = uint8_t(rng());
  std::vector<float> ks_ref(size_t(num_pages) * hk), vs_ref(ks_ref.size());
  std::uniform_int_distribution<int> exp_dist(-10, 6);
  for (auto* v : {&ks_ref, &vs_ref})
    for (auto& x : *v) x = rng() % 4 == 0 ? 0.f : std::ldexp(1.f, exp_dist(rng));
  GuardedBuffer dk = upload_vector(k_ref), dv = upload_vector(v_ref);
  GuardedBuffer dks = upload_vector(ks_ref), dvs = upload_vector(vs_ref);
  GuardedBuffer dflag(sizeof(int), 0);

  std::vector<int64_t> pos(s.num_seqs);  // next key position of each sequence
  for (auto& p : pos) p = int64_t(rng() % ps);
  std::uniform_int_distribution<int> n_dist(0, s.max_step_tokens);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> mag(-12, 12);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const size_t es = dtype_size(s.dtype);
  bool saw_oob = false;
  for (int step = 0; step < s.steps; ++step) {
    std::vector<int64_t> slots;
    for (int q = 0; q < s.num_seqs; ++q) {
      const int n = n_dist(rng);
      for (int i = 0; i < n; ++i, ++pos[q]) {
        const int64_t page = perm[q * pages_per_seq + pos[q] / ps];
        slots.push_back(page * ps + pos[q] % ps);
        if (rng() % 11 == 0) slots.push_back(-1);  // padding between a sequence's tokens
      }
    }
    if (rng() % 3 == 0) {  // a slot past the pool, at the end of the step
      slots.push_back(int64_t(num_pages) * ps + int64_t(rng() % 5));
      saw_oob = true;
    }
    const int T = int(slots.size());
    std::vector<uint8_t> k(std::max<size_t>(1, T * stride * es)), v(k.size());
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < hk; ++h) {
        for (auto* buf : {&k, &v}) {
          const float m = std::ldexp(1.f, mag(rng));
          const int kind = s.specials ? int(rng() % 16) : 15;
          for (int c = 0; c < d; ++c) {
            float x = unit(rng) * m;
            if (kind == 0 && c % 7 == 3) x = c % 2 ? nan : -nan;
            if (kind == 1 && c == d / 2) x = c % 2 ? inf : -inf;
            if (kind == 2) x = 0.f;
            if (kind == 3 && c == 1) x = 3e4f * m;  // an outlier: the row's amax
            store_element(*buf, t * stride + int64_t(h) * d + c, x, s.dtype);
          }
        }
      }
    }
    GuardedBuffer dsrc_k = upload_vector(k), dsrc_v = upload_vector(v);
    GuardedBuffer dslots = upload_vector(slots);
    kernels::KvStoreParams p;
    p.k_token_stride = p.v_token_stride = stride;
    p.num_tokens = T;
    p.num_kv_heads = hk;
    p.head_dim = d;
    p.page_size = ps;
    p.num_pages = num_pages;
    p.dtype = s.dtype;
    p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    kernels::KvStoreParams dp = p;
    dp.k = dsrc_k.data();
    dp.v = dsrc_v.data();
    dp.k_cache = dk.data();
    dp.v_cache = dv.data();
    dp.k_scale = static_cast<float*>(dks.data());
    dp.v_scale = static_cast<float*>(dvs.data());
    dp.slot_mapping = static_cast<const int64_t*>(dslots.data());
    dp.error_flag = static_cast<int*>(dflag.data());
    kernels::cuda::kv_store_run(dp, nullptr);
    LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
    // The reference skips the slots past the pool as the kernel does (it would throw on them).
    std::vector<int64_t> ref_slots = slots;
    for (auto& x : ref_slots)
      if (x >= int64_t(num_pages) * ps) x = -1;
    p.k = k.data();
    p.v = v.data();
    p.k_cache = k_ref.data();
    p.v_cache = v_ref.data();
    p.k_scale = ks_ref.data();
    p.v_scale = vs_ref.data();
    p.slot_mapping = ref_slots.data();
    kernels::cpu::kv_store(p);

    const auto kg = dk.download<uint8_t>(), vg = dv.download<uint8_t>();
    const auto ksg = dks.download<float>(), vsg = dvs.download<float>();
    int64_t bad_codes = 0, bad_scales = 0, first_bad = -1;
    for (size_t i = 0; i < cache_bytes; ++i) {
      const bool bad = kg[i] != k_ref[i] || vg[i] != v_ref[i];
      if (bad && first_bad < 0) first_bad = int64_t(i);
      bad_codes += bad;
    }
    for (size_t i = 0; i < ks_ref.size(); ++i)
      bad_scales += std::memcmp(&ksg[i], &ks_ref[i], 4) != 0 || std::memcmp(&vsg[i], &vs_ref[i], 4);
    EXPECT_EQ(bad_codes, 0) << "step " << step << ": first differing code byte " << first_bad
                            << " (k " << int(kg[std::max<int64_t>(first_bad, 0)]) << " ref "
                            << int(k_ref[std::max<int64_t>(first_bad, 0)]) << ")";
    EXPECT_EQ(bad_scales, 0) << "step " << step;
  }
  for (const GuardedBuffer* b : {&dk, &dv, &dks, &dvs}) EXPECT_TRUE(b->guards_intact());
  EXPECT_EQ(dflag.download<int>()[0], saw_oob ? 1 : 0);
}

Fp8StoreShape fshape(int seqs, int hk, int d, int page, int steps, int max_tokens, DType dt,
                     uint64_t seed, int row_pad = 0) {
  Fp8StoreShape s;
  s.num_seqs = seqs;
  s.num_kv_heads = hk;
  s.head_dim = d;
  s.page_size = page;
  s.steps = steps;
  s.max_step_tokens = max_tokens;
  s.dtype = dt;
  s.seed = seed;
  s.row_padding = row_pad;
  return s;
}

// Prefill-sized steps over model shapes and odd ones (head_dim 1 .. 200, pages 1 .. 256, every
// source dtype, padded source rows).
TEST(KvStoreFp8Gpu, BatchedAppendsMatchReferenceBits) {
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  run_fp8_store_case(fshape(2, 8, 128, 16, 4, 300, bf, 1));   // Llama-3.1-8B
  run_fp8_store_case(fshape(3, 8, 128, 128, 5, 200, bf, 2));  // 128-token blocks
  run_fp8_store_case(fshape(4, 2, 64, 16, 6, 40, bf, 3));     // needle (4/2 x 64)
  run_fp8_store_case(fshape(3, 2, 16, 1, 5, 20, f16, 4));     // page of one token
  run_fp8_store_case(fshape(3, 3, 200, 7, 5, 30, f32, 5, 3));
  run_fp8_store_case(fshape(2, 1, 1, 5, 4, 12, bf, 6, 1));
  run_fp8_store_case(fshape(2, 5, 96, 256, 3, 400, f16, 7, 8));
  run_fp8_store_case(fshape(5, 1, 130, 3, 6, 9, f32, 8));
}

// Decode: every sequence appends one token per step, so every row after a page's first may raise
// its scale (the case the re-encoding exists for).
TEST(KvStoreFp8Gpu, DecodeAppendsMatchReferenceBits) {
  run_fp8_store_case(fshape(6, 8, 128, 16, 40, 1, DType::kBF16, 11));
  run_fp8_store_case(fshape(3, 2, 64, 5, 30, 1, DType::kF16, 12));
  run_fp8_store_case(fshape(2, 3, 33, 4, 25, 2, DType::kF32, 13));
}

// Without the special rows (only finite values): the same, a separate case so a failure says
// whether the special values or the ordinary path differ.
TEST(KvStoreFp8Gpu, FiniteRowsMatchReferenceBits) {
  Fp8StoreShape s = fshape(3, 4, 128, 16, 6, 50, DType::kBF16, 21);
  s.specials = false;
  run_fp8_store_case(s);
}

TEST(KvStoreFp8Gpu, MissingScalesThrow) {
  GuardedBuffer src(1024), kc(1024), vc(1024), slots(64, 0);
  kernels::KvStoreParams p;
  p.k = src.data();
  p.v = static_cast<char*>(src.data()) + 128;
  p.k_token_stride = p.v_token_stride = 16;
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.slot_mapping = static_cast<const int64_t*>(slots.data());
  p.num_tokens = 4;
  p.num_kv_heads = 1;
  p.head_dim = 16;
  p.page_size = 4;
  p.num_pages = 8;
  p.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_THROW(kernels::cuda::kv_store_run(p, nullptr), Error);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace longctx::gpu_test
