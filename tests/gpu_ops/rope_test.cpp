// CUDA rope (the plain table, llama3, yarn, longrope, dynamic NTK, partial rotary) against its
// CPU twin on the same bytes (gpu_ops_util.h): q and k heads of a fused qkv buffer, head_dim
// 16/32/64/128, n in {1, 3, 17, 1000, 4096}, positions up to 2^20; v and the dims past
// rotary_dim must come back unchanged.
//
// Tolerance, per element: 1e-6 absolute + 2 ulp (f32) / 1 ulp (16-bit, compared after both
// twins rounded once): sincosf is within 2 ulp of the correctly rounded cos/sin, |x| <= 2.
// GpuOpsSmall.* are the small shapes only (for compute-sanitizer); GpuOps.* all of them.
#include "ops/rope.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "gpu_ops/elementwise_util.h"

namespace longctx::gpu_ops_test {
namespace {

Tol rope_tol(DType dt) { return dt == DType::kF32 ? Tol{1e-6, 0, 2} : Tol{1e-6, 0, 1}; }

}  // namespace

CaseSpec rope_case(int64_t n, int64_t hd, int64_t hq, int64_t hkv, DType dt, uint64_t seed) {
  const int64_t width = (hq + 2 * hkv) * hd;
  M qkv = random_mirror(n * width, dt, seed);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = int64_t(rng() % (1 << 20));
  const int64_t fixed[] = {0, 1, 1048575, 131071};
  for (int64_t i = 0; i < std::min<int64_t>(n, 4); ++i) pos[i] = fixed[i];
  M positions = mirror(n, DType::kI64);
  positions->set(pos.data());
  RopeConfig rc;
  if (hd == 128) {  // Llama-3.1's rope
    rc.type = RopeType::kLlama3;
    rc.theta = 5e5;
    rc.factor = 8;
    rc.low_freq_factor = 1;
    rc.high_freq_factor = 4;
    rc.original_max_position_embeddings = 8192;
  } else {
    rc.theta = 1e6;
  }
  std::vector<float> inv = ops::rope_inv_freq(rc, hd);
  M inv_freq = mirror(hd / 2, DType::kF32);
  inv_freq->set(inv.data());
  CaseSpec c;
  c.name = fmt::format("rope(n={} hd={} heads {}/{} of qkv {}, positions < 2^20)", n, hd, hq, hkv,
                       dn(dt));
  auto q = [=](bool dev) {
    return dev ? qkv->dev({n, hq, hd}, {width, hd, 1}) : qkv->host({n, hq, hd}, {width, hd, 1});
  };
  auto k = [=](bool dev) {
    return dev ? qkv->dev({n, hkv, hd}, {width, hd, 1}, hq * hd)
               : qkv->host({n, hkv, hd}, {width, hd, 1}, hq * hd);
  };
  c.gpu = [=] {
    ops::rope(q(true), positions->dev({n}), inv_freq->dev({hd / 2}));
    ops::rope(k(true), positions->dev({n}), inv_freq->dev({hd / 2}));
  };
  c.check = [=] {
    ops::rope_cpu(q(false), positions->host({n}), inv_freq->host({hd / 2}));
    ops::rope_cpu(k(false), positions->host({n}), inv_freq->host({hd / 2}));
    return compare_all({{qkv.get(), rope_tol(dt)}});
  };
  c.bytes = 2.0 * double(n * (hq + hkv) * hd) * es(dt);
  return c;
}

namespace {

// The rope variants (yarn with its attention scaling, longrope's two tables, dynamic NTK's
// in-kernel frequencies, partial rotary) against the CPU twin on a fused qkv buffer: sequences
// of random lengths packed one after another (positions from a random cached length on, `lens`
// the sequence's end, so longrope/dynamic tokens below the switch still take the long table /
// the grown base when their sequence ends past it), or with `decode` one token per sequence and
// no lens (position + 1). Dims past rotary_dim and v must come back unchanged.
enum class RopeVariant { kYarnPartial, kLongrope, kLongropePartial, kDynamic };

CaseSpec rope_variant_case(RopeVariant variant, int64_t seqs, bool decode, DType dt,
                           uint64_t seed) {
  RopeConfig rc;
  int64_t hd = 128, hq = 8, hkv = 2;
  const char* name = "";
  std::mt19937_64 rng(seed);
  switch (variant) {
    case RopeVariant::kYarnPartial:  // Qwen's 128K recipe over a 3/4 rotary head
      name = "yarn x4 of 32768, rotary 96 of 128";
      rc.type = RopeType::kYarn;
      rc.theta = 1e6;
      rc.factor = 4;
      rc.original_max_position_embeddings = 32768;
      rc.partial_rotary_factor = 0.75;
      break;
    case RopeVariant::kLongrope:           // Phi-3-mini-128k: head_dim 96, switch at 4096
    case RopeVariant::kLongropePartial: {  // Phi-4-mini: 96 of 128 rotate
      const bool partial = variant == RopeVariant::kLongropePartial;
      name =
          partial ? "longrope 4096 -> 131072, rotary 96 of 128" : "longrope 4096 -> 131072, hd 96";
      hd = partial ? 128 : 96;
      rc.type = RopeType::kLongrope;
      rc.theta = 10000;
      rc.original_max_position_embeddings = 4096;
      rc.factor = 32;
      rc.partial_rotary_factor = partial ? 0.75 : 1.0;
      for (int i = 0; i < 48; ++i) {
        rc.short_factor.push_back(1.0 + 0.002 * i);
        rc.long_factor.push_back(1.0 + 1.2 * i);
      }
      break;
    }
    case RopeVariant::kDynamic:
      name = "dynamic x2 past 4096, hd 64";
      hd = 64;
      rc.type = RopeType::kDynamic;
      rc.theta = 10000;
      rc.factor = 2;
      rc.max_position_embeddings = 4096;
      break;
  }
  const ops::RopeFrequencies f = ops::rope_frequencies(rc, hd);
  const int64_t width = (hq + 2 * hkv) * hd;
  // Each sequence ends around the switch length (below or past it) or far past it.
  std::vector<int64_t> pos, lens;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t q = decode ? 1 : 1 + int64_t(rng() % 300);
    const int64_t end =
        s % 3 == 2 ? 100000 + int64_t(rng() % 30000) : 4096 - 150 + int64_t(rng() % 300);
    for (int64_t p = std::max<int64_t>(0, end - q); p < end; ++p) {
      pos.push_back(p);
      lens.push_back(end);
    }
  }
  const int64_t n = int64_t(pos.size());
  M qkv = random_mirror(n * width, dt, seed);
  M positions = mirror(n, DType::kI64);
  positions->set(pos.data());
  M len_m = mirror(n, DType::kI64);
  len_m->set(lens.data());
  const int64_t tables = f.tables(), half = f.rotary_dim / 2;
  M inv_freq = mirror(tables * half, DType::kF32);
  inv_freq->set(f.inv_freq.data());
  CaseSpec c;
  c.name = fmt::format("rope({}, scaling {}, {} seqs {} n={} heads {}/{} of qkv {})", name,
                       f.attention_scaling, seqs, decode ? "decode (no lens)" : "with lens", n, hq,
                       hkv, dn(dt));
  auto view = [=](bool dev, int64_t heads, int64_t offset) {
    return dev ? qkv->dev({n, heads, hd}, {width, hd, 1}, offset)
               : qkv->host({n, heads, hd}, {width, hd, 1}, offset);
  };
  auto args = [=](bool dev) {
    Tensor t = dev ? inv_freq->dev({tables, half}) : inv_freq->host({tables, half});
    Tensor l = decode ? Tensor() : (dev ? len_m->dev({n}) : len_m->host({n}));
    return ops::rope_args(f, t, l);
  };
  c.gpu = [=] {
    // q and k together, as the models rotate them (adjacent heads of each row).
    ops::rope(view(true, hq + hkv, 0), positions->dev({n}), args(true));
  };
  c.check = [=] {
    ops::rope_cpu(view(false, hq + hkv, 0), positions->host({n}), args(false));
    return compare_all({{qkv.get(), rope_tol(dt)}});
  };
  c.bytes = 2.0 * double(n * (hq + hkv) * hd) * es(dt);
  return c;
}

void rope_variant_cases(bool small) {
  TestStream s;
  Summary sum;
  uint64_t k = 0;
  for (RopeVariant v : {RopeVariant::kYarnPartial, RopeVariant::kLongrope,
                        RopeVariant::kLongropePartial, RopeVariant::kDynamic})
    for (bool decode : {false, true})
      for (int64_t seqs : small ? std::vector<int64_t>{3} : std::vector<int64_t>{1, 3, 12}) {
        run_case(
            s, rope_variant_case(v, seqs, decode, k % 3 == 1 ? DType::kF32 : DType::kBF16, 900 + k),
            sum);
        ++k;
      }
}

void rope_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  for (int64_t hd : {16, 32, 64, 128})
    for (int64_t n : small ? kTokensSmall : kTokens) {
      run_case(s,
               rope_case(n, hd, hd == 128 ? 32 : 8, hd == 128 ? 8 : 2,
                         k % 3 == 1 ? DType::kF32 : DType::kBF16, 800 + k),
               sum);
      ++k;
    }
}

TEST(GpuOps, Rope) { rope_cases(false); }
TEST(GpuOps, RopeVariants) { rope_variant_cases(false); }

TEST(GpuOpsSmall, Rope) { rope_cases(true); }
TEST(GpuOpsSmall, RopeVariants) { rope_variant_cases(true); }

}  // namespace
}  // namespace longctx::gpu_ops_test
