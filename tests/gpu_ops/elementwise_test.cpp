// CUDA twins of the row-wise ops (embedding, rms_norm, add_rms_norm, silu_and_mul, add,
// gather_rows, cast; rope's are in rope_test.cpp) against their CPU twins on the same bytes
// (gpu_ops_util.h), on odd and
// realistic shapes: n in {1, 3, 17, 1000, 4096}, hidden in {64, 128, 4096, 5120}, head_dim
// 16/32/64/128, strided views (q/k heads inside a fused qkv buffer, gate/up halves, padded and
// misaligned rows that take the scalar path), in place where the op allows it.
//
// Tolerances, per element (ulp = one unit in the last place of the reference in the buffer's
// dtype; 16-bit results are compared after both twins rounded them once):
//   embedding, gather_rows, cast, add: exact (the same fp32 operation, one rounding);
//   add_rms_norm's residual: exact (one fp32 add);
//   rms_norm / add_rms_norm out: 2 ulp (f32) / 1 ulp (16-bit): both sum squares in double, so
//     only a double-sum order difference that moves the fp32 variance could differ;
//   silu_and_mul (and sigmoid_and_mul): 1e-6 relative (f32): CUDA's expf is within 2 ulp and
//   glibc's within 1, and the
//     division and product each round once on both sides, so they may differ by 5 * 2^-23
//     (6e-7) relative; an H200 run measured up to 5 ulp, 3e-7 relative / 1 ulp (16-bit).
// GpuOpsSmall.* are the small shapes only (for compute-sanitizer); GpuOps.* all of them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <climits>

#include "gpu_ops/elementwise_util.h"
#include "ops/add.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "ops/gather_rows.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/silu_and_mul.h"

namespace longctx::gpu_ops_test {
namespace {

const Tol kExact{};
Tol norm_tol(DType dt) { return dt == DType::kF32 ? Tol{0, 0, 2} : Tol{0, 0, 1}; }
Tol silu_tol(DType dt) { return dt == DType::kF32 ? Tol{1e-30, 1e-6, 0} : Tol{1e-30, 0, 1}; }
// gelu_tanh_and_mul: tanhf within 2 ulp on both sides, where 1 + tanh cancels (g near -3) that is
// ~1e-7 absolute on the factor, times |g u| <= 64 here.
Tol gelu_tol(DType dt) { return dt == DType::kF32 ? Tol{1e-5, 1e-6, 0} : Tol{1e-5, 0, 1}; }

const std::vector<int64_t> kHidden = {64, 128, 4096, 5120};
const std::vector<int64_t> kHiddenSmall = {64, 128};
const DType kActs[] = {DType::kF32, DType::kBF16, DType::kF16};

// ---------------------------------------------------------------------------------------------

CaseSpec embedding_case(int64_t n, int64_t hidden, DType tdt, DType odt, int64_t pad, uint64_t seed,
                        float scale = 1.f) {
  const int64_t vocab = 3001, ld = hidden + pad;
  M table = random_mirror(vocab * hidden, tdt, seed);
  M ids = mirror(n, DType::kI32);
  ids->random(seed + 1, 0, float(vocab));
  M out = mirror(n * ld, odt);
  CaseSpec c;
  c.name = fmt::format("embedding(n={} hidden={} {}->{} ld={} scale={})", n, hidden, dn(tdt),
                       dn(odt), ld, scale);
  c.gpu = [=] {
    ops::embedding(ids->dev({n}), table->dev({vocab, hidden}), out->dev({n, hidden}, {ld, 1}),
                   scale);
  };
  c.check = [=] {
    ops::embedding_cpu(ids->host({n}), table->host({vocab, hidden}),
                       out->host({n, hidden}, {ld, 1}), scale);
    return compare_all({{out.get(), kExact}});
  };
  c.bytes = double(n * hidden) * (es(tdt) + es(odt));
  return c;
}

// The vocab-parallel lookup: rows [first_row, first_row + 1000) of a 3001-token vocabulary, ids
// over all of it (and past it): zeros outside the shard on both twins.
CaseSpec embedding_shard_case(int64_t n, int64_t hidden, DType tdt, uint64_t seed) {
  const int64_t rows = 1000, first = 1500;
  M table = random_mirror(rows * hidden, tdt, seed);
  M ids = mirror(n, DType::kI32);
  ids->random(seed + 1, -10, 3100);
  M out = mirror(n * hidden, DType::kF32);
  CaseSpec c;
  c.name = fmt::format("embedding_shard(n={} hidden={} {})", n, hidden, dn(tdt));
  c.gpu = [=] {
    ops::embedding_shard(ids->dev({n}), table->dev({rows, hidden}), first, out->dev({n, hidden}));
  };
  c.check = [=] {
    ops::embedding_shard_cpu(ids->host({n}), table->host({rows, hidden}), first,
                             out->host({n, hidden}), 1.f);
    return compare_all({{out.get(), kExact}});
  };
  c.bytes = double(n * hidden) * (es(tdt) + 4);
  return c;
}

// Ids outside the vocabulary: the CPU twin throws; the CUDA kernel writes zero rows and never
// faults.
CaseSpec embedding_bad_ids_case() {
  const int64_t vocab = 100, hidden = 64, n = 6;
  M table = random_mirror(vocab * hidden, DType::kBF16, 5);
  std::vector<int32_t> id = {5, -1, 100, INT_MAX, 99, INT_MIN};
  M ids = mirror(n, DType::kI32);
  ids->set(id.data());
  M out = mirror(n * hidden, DType::kF32);
  CaseSpec c;
  c.name = "embedding(ids -1, vocab, INT_MAX, INT_MIN -> zero rows; CPU throws)";
  c.gpu = [=] {
    ops::embedding(ids->dev({n}), table->dev({vocab, hidden}), out->dev({n, hidden}));
  };
  c.check = [=] {
    Comparison cmp;
    try {
      ops::embedding_cpu(ids->host({n}), table->host({vocab, hidden}), out->host({n, hidden}), 1.f);
      cmp.bad = 1;
      cmp.first_bad = "CPU twin accepted an id outside the vocabulary";
      return cmp;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfRange) {
        cmp.bad = 1;
        cmp.first_bad = e.what();
        return cmp;
      }
    }
    // Expected: the table row for a valid id, zeros otherwise.
    float* ref = out->host({n, hidden}).data<float>();
    const uint16_t* t = reinterpret_cast<const uint16_t*>(table->host_bytes());
    for (int64_t i = 0; i < n; ++i) {
      const bool valid = id[i] >= 0 && id[i] < vocab;
      for (int64_t j = 0; j < hidden; ++j)
        ref[i * hidden + j] = valid ? bf16_to_f32(t[int64_t(id[i]) * hidden + j]) : 0.f;
    }
    return compare_all({{out.get(), kExact}});
  };
  return c;
}

void embedding_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  for (int64_t hidden : small ? kHiddenSmall : kHidden)
    for (int64_t n : small ? kTokensSmall : kTokens) {
      const DType tdt = kActs[(k + 1) % 3], odt = k % 2 ? DType::kBF16 : DType::kF32;
      const int64_t pad = k % 3 == 0 ? 0 : k % 3 == 1 ? 8 : 3;
      // Every fourth case scales as Gemma does (sqrt(hidden)).
      const float scale = k % 4 == 3 ? std::sqrt(float(hidden)) : 1.f;
      run_case(s, embedding_case(n, hidden, tdt, odt, pad, 100 + k, scale), sum);
      ++k;
    }
  run_case(s, embedding_bad_ids_case(), sum);
  run_case(s, embedding_shard_case(small ? 37 : 4096, 96, DType::kBF16, 11), sum);
  run_case(s, embedding_shard_case(5, 64, DType::kF16, 12), sum);
}

// ---------------------------------------------------------------------------------------------

// x [n, d] at column xoff of an [n, d + pad] buffer; out = x or a separate [n, d].
CaseSpec rms_norm_case(int64_t n, int64_t d, DType xdt, DType odt, DType wdt, int64_t pad,
                       bool in_place, uint64_t seed) {
  if (in_place) odt = xdt;
  const int64_t ld = d + pad, xoff = pad;
  M x = random_mirror(n * ld, xdt, seed, -3.f, 3.f);
  M w = random_mirror(d, wdt, seed + 1, 0.5f, 1.5f);
  M out = in_place ? x : mirror(n * d, odt);
  const float eps = 1e-6f;
  CaseSpec c;
  c.name = fmt::format("rms_norm(n={} d={} {}->{} w={} ld={}{})", n, d, dn(xdt), dn(odt), dn(wdt),
                       ld, in_place ? " in-place" : "");
  auto xv = [=](bool dev) {
    return dev ? x->dev({n, d}, {ld, 1}, xoff) : x->host({n, d}, {ld, 1}, xoff);
  };
  auto ov = [=](bool dev) {
    if (in_place) return xv(dev);
    return dev ? out->dev({n, d}) : out->host({n, d});
  };
  c.gpu = [=] { ops::rms_norm(xv(true), w->dev({d}), eps, ov(true)); };
  c.check = [=] {
    ops::rms_norm_cpu(xv(false), w->host({d}), eps, ov(false));
    return in_place ? compare_all({{x.get(), norm_tol(odt)}})
                    : compare_all({{x.get(), kExact}, {out.get(), norm_tol(odt)}});
  };
  c.bytes = double(n * d) * (es(xdt) + es(odt));
  return c;
}

// Qwen3's q_norm / k_norm: in place over [n, heads, head_dim] views of a fused qkv buffer.
CaseSpec head_norm_case(int64_t n, int64_t hd, int64_t hq, int64_t hkv, DType dt, uint64_t seed) {
  const int64_t width = (hq + 2 * hkv) * hd;
  M qkv = random_mirror(n * width, dt, seed, -3.f, 3.f);
  M wq = random_mirror(hd, DType::kBF16, seed + 1, 0.5f, 1.5f);
  M wk = random_mirror(hd, DType::kBF16, seed + 2, 0.5f, 1.5f);
  CaseSpec c;
  c.name = fmt::format("rms_norm q/k heads(n={} hd={} heads {}/{} of qkv {} in-place)", n, hd, hq,
                       hkv, dn(dt));
  auto q = [=](bool dev) {
    return dev ? qkv->dev({n, hq, hd}, {width, hd, 1}) : qkv->host({n, hq, hd}, {width, hd, 1});
  };
  auto k = [=](bool dev) {
    return dev ? qkv->dev({n, hkv, hd}, {width, hd, 1}, hq * hd)
               : qkv->host({n, hkv, hd}, {width, hd, 1}, hq * hd);
  };
  c.gpu = [=] {
    ops::rms_norm(q(true), wq->dev({hd}), 1e-6f, q(true));
    ops::rms_norm(k(true), wk->dev({hd}), 1e-6f, k(true));
  };
  c.check = [=] {
    ops::rms_norm_cpu(q(false), wq->host({hd}), 1e-6f, q(false));
    ops::rms_norm_cpu(k(false), wk->host({hd}), 1e-6f, k(false));
    return compare_all({{qkv.get(), norm_tol(dt)}});
  };
  c.bytes = 2.0 * double(n * (hq + hkv) * hd) * es(dt);
  return c;
}

void rms_norm_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  const std::pair<DType, DType> combos[] = {{DType::kF32, DType::kBF16},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kF32, DType::kF32},
                                            {DType::kBF16, DType::kF32},
                                            {DType::kF16, DType::kF16}};
  for (int64_t d : small ? kHiddenSmall : kHidden)
    for (int64_t n : small ? kTokensSmall : kTokens) {
      auto [xdt, odt] = combos[k % 5];
      const int64_t pad = k % 3 == 1 ? 8 : k % 3 == 2 ? 3 : 0;
      run_case(s, rms_norm_case(n, d, xdt, odt, kActs[k % 3], pad, k % 2 == 0, 200 + k), sum);
      ++k;
    }
  for (int64_t d : {67, 333, 1000})  // widths off the 8-element vector path
    run_case(s,
             rms_norm_case(small ? 3 : 257, d, DType::kBF16, DType::kF32, DType::kBF16, 0, false,
                           300 + d),
             sum);
  // Qwen3-30B-A3B's hidden size (a block's 128 threads hold two 8-element chunks each), and one
  // past the widths kept in registers (the kernel's looping path).
  for (int64_t d : {2048, 12288})
    for (int64_t n : {1, 17})
      run_case(s, rms_norm_case(n, d, DType::kBF16, DType::kBF16, kActs[0], 0, n == 1, 350 + d + n),
               sum);
  for (int64_t hd : {16, 32, 64, 128})
    for (int64_t n : small ? kTokensSmall : kTokens)
      run_case(s,
               head_norm_case(n, hd, hd == 128 ? 32 : 8, hd == 128 ? 8 : 2,
                              n == 17 ? DType::kF32 : DType::kBF16, 400 + hd + n),
               sum);
}

// ---------------------------------------------------------------------------------------------

// residual [n, d] at column `pad` of an [n, d + pad] f32 buffer; out = x or a separate [n, d].
CaseSpec add_rms_norm_case(int64_t n, int64_t d, DType xdt, DType odt, int64_t pad, bool in_place,
                           uint64_t seed) {
  if (in_place) odt = xdt;
  const int64_t ld = d + pad;
  M x = random_mirror(n * d, xdt, seed, -2.f, 2.f);
  M res = random_mirror(n * ld, DType::kF32, seed + 1, -4.f, 4.f);
  M w = random_mirror(d, DType::kBF16, seed + 2, 0.5f, 1.5f);
  M out = in_place ? x : mirror(n * d, odt);
  CaseSpec c;
  c.name = fmt::format("add_rms_norm(n={} d={} x {} residual f32 ld={} -> {}{})", n, d, dn(xdt), ld,
                       dn(odt), in_place ? " in-place" : "");
  auto rv = [=](bool dev) {
    return dev ? res->dev({n, d}, {ld, 1}, pad) : res->host({n, d}, {ld, 1}, pad);
  };
  auto xv = [=](bool dev) { return dev ? x->dev({n, d}) : x->host({n, d}); };
  auto ov = [=](bool dev) { return dev ? out->dev({n, d}) : out->host({n, d}); };
  c.gpu = [=] { ops::add_rms_norm(xv(true), rv(true), w->dev({d}), 1e-5f, ov(true)); };
  c.check = [=] {
    ops::add_rms_norm_cpu(xv(false), rv(false), w->host({d}), 1e-5f, ov(false));
    return in_place
               ? compare_all({{res.get(), kExact}, {x.get(), norm_tol(odt)}})
               : compare_all({{res.get(), kExact}, {x.get(), kExact}, {out.get(), norm_tol(odt)}});
  };
  c.bytes = double(n * d) * (es(xdt) + 8 + es(odt));
  return c;
}

void add_rms_norm_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  for (int64_t d : small ? kHiddenSmall : kHidden)
    for (int64_t n : small ? kTokensSmall : kTokens) {
      const DType xdt = k % 3 == 2 ? DType::kF32 : DType::kBF16;
      const DType odt = k % 4 == 1 ? DType::kF32 : DType::kBF16;
      run_case(s, add_rms_norm_case(n, d, xdt, odt, k % 3 == 1 ? 8 : 0, k % 2 == 0, 500 + k), sum);
      ++k;
    }
  run_case(s, add_rms_norm_case(small ? 3 : 100, 90, DType::kBF16, DType::kBF16, 1, true, 599),
           sum);
  // The 30B-A3B's hidden size (chunks in registers) and a width past them (the looping path).
  for (int64_t d : {2048, 12288})
    for (int64_t n : {1, 17})
      run_case(s, add_rms_norm_case(n, d, DType::kBF16, DType::kBF16, 8, n == 1, 600 + d + n), sum);
}

// ---------------------------------------------------------------------------------------------

// gate/up: halves of an [n, 2I] buffer; out = gate or a separate [n, I].
CaseSpec silu_case(int64_t n, int64_t inter, DType dt, DType odt, bool in_place, uint64_t seed,
                   ops::GatedAct act = ops::GatedAct::kSilu) {
  const bool gelu = act == ops::GatedAct::kGeluTanh;
  const bool sigmoid = act == ops::GatedAct::kSigmoid;
  if (in_place) odt = dt;
  M gu = random_mirror(n * 2 * inter, dt, seed, -8.f, 8.f);
  M out = in_place ? gu : mirror(n * inter, odt);
  CaseSpec c;
  c.name = fmt::format("{}(n={} I={} halves of {} [n, 2I] -> {}{})",
                       gelu      ? "gelu_tanh_and_mul"
                       : sigmoid ? "sigmoid_and_mul"
                                 : "silu_and_mul",
                       n, inter, dn(dt), dn(odt), in_place ? " into gate" : "");
  auto g = [=](bool dev) {
    return dev ? gu->dev({n, inter}, {2 * inter, 1}) : gu->host({n, inter}, {2 * inter, 1});
  };
  auto u = [=](bool dev) {
    return dev ? gu->dev({n, inter}, {2 * inter, 1}, inter)
               : gu->host({n, inter}, {2 * inter, 1}, inter);
  };
  auto o = [=](bool dev) {
    if (in_place) return g(dev);
    return dev ? out->dev({n, inter}) : out->host({n, inter});
  };
  c.gpu = [=] {
    if (gelu)
      ops::gelu_tanh_and_mul(g(true), u(true), o(true));
    else if (sigmoid)
      ops::sigmoid_and_mul(g(true), u(true), o(true));
    else
      ops::silu_and_mul(g(true), u(true), o(true));
  };
  c.check = [=] {
    if (gelu)
      ops::gelu_tanh_and_mul_cpu(g(false), u(false), o(false));
    else if (sigmoid)
      ops::sigmoid_and_mul_cpu(g(false), u(false), o(false));
    else
      ops::silu_and_mul_cpu(g(false), u(false), o(false));
    const Tol tol = gelu ? gelu_tol(odt) : silu_tol(odt);
    return in_place ? compare_all({{gu.get(), tol}})
                    : compare_all({{gu.get(), kExact}, {out.get(), tol}});
  };
  c.bytes = double(n * inter) * (2 * es(dt) + es(odt));
  return c;
}

void silu_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  const std::vector<int64_t> inters =
      small ? std::vector<int64_t>{64, 128} : std::vector<int64_t>{64, 128, 5120, 14336};
  for (int64_t inter : inters)
    for (int64_t n : small ? kTokensSmall : kTokens) {
      if (inter == 14336 && n == 4096) continue;  // 235 MB for nothing new
      const DType dt = k % 3 == 2 ? DType::kF32 : DType::kBF16;
      run_case(s, silu_case(n, inter, dt, k % 2 ? DType::kF32 : DType::kBF16, k % 2 == 0, 600 + k),
               sum);
      run_case(s,
               silu_case(n, inter, dt, k % 2 ? DType::kBF16 : DType::kF32, k % 3 == 0, 650 + k,
                         ops::GatedAct::kGeluTanh),
               sum);
      ++k;
    }
  run_case(s, silu_case(small ? 3 : 33, 37, DType::kBF16, DType::kBF16, false, 699), sum);
  // sigmoid_and_mul (Qwen3-Next's attention output gate): the silu tolerance (expf and one
  // division on each side).
  for (int64_t n : small ? kTokensSmall : kTokens)
    for (DType dt : {DType::kF32, DType::kBF16})
      run_case(s,
               silu_case(n, n == 17 ? 37 : 256, dt, dt, n == 3, 700 + n, ops::GatedAct::kSigmoid),
               sum);
}

// ---------------------------------------------------------------------------------------------

// a [n, d] f32 (the residual), b [n, d] at column pad of an [n, d + pad] buffer; out = a or a
// separate [n, d].
CaseSpec add_case(int64_t n, int64_t d, DType bdt, DType odt, int64_t pad, bool in_place,
                  uint64_t seed) {
  if (in_place) odt = DType::kF32;
  const int64_t ld = d + pad;
  M a = random_mirror(n * d, DType::kF32, seed, -4.f, 4.f);
  M b = random_mirror(n * ld, bdt, seed + 1);
  M out = in_place ? a : mirror(n * d, odt);
  CaseSpec c;
  c.name = fmt::format("add(n={} d={} f32 + {} ld={} -> {}{})", n, d, dn(bdt), ld, dn(odt),
                       in_place ? " in-place" : "");
  auto av = [=](bool dev) { return dev ? a->dev({n, d}) : a->host({n, d}); };
  auto bv = [=](bool dev) {
    return dev ? b->dev({n, d}, {ld, 1}, pad) : b->host({n, d}, {ld, 1}, pad);
  };
  auto ov = [=](bool dev) { return dev ? out->dev({n, d}) : out->host({n, d}); };
  c.gpu = [=] { ops::add(av(true), bv(true), ov(true)); };
  c.check = [=] {
    ops::add_cpu(av(false), bv(false), ov(false));
    return compare_all({{a.get(), kExact}, {b.get(), kExact}, {out.get(), kExact}});
  };
  c.bytes = double(n * d) * (4 + es(bdt) + es(odt));
  return c;
}

void add_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  for (int64_t d : small ? kHiddenSmall : kHidden)
    for (int64_t n : small ? kTokensSmall : kTokens) {
      run_case(
          s,
          add_case(n, d, k % 3 == 2 ? DType::kF32 : DType::kBF16,
                   k % 2 ? DType::kBF16 : DType::kF32, k % 4 == 3 ? 5 : 0, k % 2 == 0, 700 + k),
          sum);
      ++k;
    }
}

// ---------------------------------------------------------------------------------------------

// x [n, d] at column pad of an [n, d + pad] buffer, r gathered rows (repeats allowed).
CaseSpec gather_case(int64_t n, int64_t d, int64_t r, DType dt, int64_t pad, uint64_t seed) {
  const int64_t ld = d + pad;
  M x = mirror(n * ld, dt);
  x->random(seed, -2.f, dt == DType::kI32 ? 1e6f : 2.f);
  M rows = mirror(r, DType::kI32);
  rows->random(seed + 1, 0.f, float(n));
  M out = mirror(r * d, dt);
  CaseSpec c;
  c.name = fmt::format("gather_rows(n={} d={} {} ld={} -> {} rows)", n, d, dn(dt), ld, r);
  auto xv = [=](bool dev) {
    return dev ? x->dev({n, d}, {ld, 1}, pad) : x->host({n, d}, {ld, 1}, pad);
  };
  c.gpu = [=] { ops::gather_rows(xv(true), rows->dev({r}), out->dev({r, d})); };
  c.check = [=] {
    ops::gather_rows_cpu(xv(false), rows->host({r}), out->host({r, d}));
    return compare_all({{out.get(), kExact}});
  };
  c.bytes = 2.0 * double(r * d) * es(dt);
  return c;
}

// Indices outside [0, n): the CPU twin throws, CUDA writes zero rows.
CaseSpec gather_bad_rows_case() {
  const int64_t n = 10, d = 24, r = 4;
  M x = random_mirror(n * d, DType::kF32, 901);
  std::vector<int32_t> idx = {3, -1, 10, 9};
  M rows = mirror(r, DType::kI32);
  rows->set(idx.data());
  M out = mirror(r * d, DType::kF32);
  CaseSpec c;
  c.name = "gather_rows(indices -1, n -> zero rows; CPU throws)";
  c.gpu = [=] { ops::gather_rows(x->dev({n, d}), rows->dev({r}), out->dev({r, d})); };
  c.check = [=] {
    Comparison cmp;
    try {
      ops::gather_rows_cpu(x->host({n, d}), rows->host({r}), out->host({r, d}));
      cmp.bad = 1;
      cmp.first_bad = "CPU twin accepted an index outside [0, n)";
      return cmp;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfRange) {
        cmp.bad = 1;
        cmp.first_bad = e.what();
        return cmp;
      }
    }
    float* ref = out->host({r, d}).data<float>();
    const float* xs = reinterpret_cast<const float*>(x->host_bytes());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < d; ++j)
        ref[i * d + j] = idx[i] >= 0 && idx[i] < n ? xs[idx[i] * d + j] : 0.f;
    return compare_all({{out.get(), kExact}});
  };
  return c;
}

void gather_cases(bool small) {
  TestStream s;
  Summary sum;
  run_case(s, gather_case(17, 64, 5, DType::kBF16, 0, 910), sum);
  run_case(s, gather_case(17, 63, 17, DType::kBF16, 1, 911), sum);  // 2-byte units
  run_case(s, gather_case(3, 128, 1, DType::kF32, 4, 912), sum);
  run_case(s, gather_case(33, 10, 40, DType::kI32, 3, 913), sum);
  run_case(s, gather_case(5, 7, 9, DType::kU8, 1, 918), sum);  // 1-byte units
  if (!small) {
    run_case(s, gather_case(4096, 4096, 64, DType::kBF16, 0, 914), sum);
    run_case(s, gather_case(1000, 5120, 1000, DType::kF32, 0, 915), sum);
  }
  run_case(s, gather_bad_rows_case(), sum);
}

// ---------------------------------------------------------------------------------------------

// x [n, d] at column pad of an [n, d + pad] buffer (or the rank-3 [n, 2, d / 2] view of it).
CaseSpec cast_case(int64_t n, int64_t d, DType from, DType to, int64_t pad, bool rank3,
                   uint64_t seed) {
  const int64_t ld = d + pad;
  M x = random_mirror(n * ld, from, seed, -70000.f, 70000.f);  // f16 overflows to inf
  M out = mirror(n * d, to);
  CaseSpec c;
  c.name = fmt::format("cast(n={} d={} {} ld={} -> {}{})", n, d, dn(from), ld, dn(to),
                       rank3 ? " rank 3" : "");
  auto xv = [=](bool dev) {
    const Shape sh = rank3 ? Shape{n, 2, d / 2} : Shape{n, d};
    const Shape st = rank3 ? Shape{ld, d / 2, 1} : Shape{ld, 1};
    return dev ? x->dev(sh, st, pad) : x->host(sh, st, pad);
  };
  auto ov = [=](bool dev) {
    const Shape sh = rank3 ? Shape{n, 2, d / 2} : Shape{n, d};
    return dev ? out->dev(sh) : out->host(sh);
  };
  c.gpu = [=] { ops::cast(xv(true), ov(true)); };
  c.check = [=] {
    ops::cast_cpu(xv(false), ov(false));
    return compare_all({{out.get(), kExact}});
  };
  c.bytes = double(n * d) * (es(from) + es(to));
  return c;
}

void cast_cases(bool small) {
  TestStream s;
  Summary sum;
  int k = 0;
  for (DType from : kActs)
    for (DType to : kActs) {
      const int64_t n = small ? 3 : (k % 2 ? 1000 : 17), d = k % 3 == 0 ? 4096 : 128;
      run_case(s, cast_case(n, small ? 64 : d, from, to, k % 2 ? 8 : 0, k % 4 == 3, 1000 + k), sum);
      ++k;
    }
  run_case(s, cast_case(5, 38, DType::kF32, DType::kBF16, 3, true, 1099), sum);
}

// ---------------------------------------------------------------------------------------------
// The ops launch on current_stream(): the input is written on the test stream behind a 20 ms
// spin, so an op on any other stream would read the NaN prefill.

TEST(GpuOps, RunOnTheCurrentStream) {
  TestStream s;
  const int64_t n = 64, d = 256;
  M a = random_mirror(n * d, DType::kBF16, 1);
  M b = random_mirror(n * d, DType::kBF16, 2);
  M late = mirror(n * d, DType::kBF16);  // NaN bytes until the copy behind the spin
  M out = mirror(n * d, DType::kBF16);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  launch_spin(s.get(), 20'000'000);
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(late->dev_ptr(), a->dev_ptr(), a->bytes(),
                                     cudaMemcpyDeviceToDevice, s.get()));
  ops::add(late->dev({n, d}), b->dev({n, d}), out->dev({n, d}));
  s.sync();
  ops::add_cpu(a->host({n, d}), b->host({n, d}), out->host({n, d}));
  Comparison c = compare_all({{out.get(), kExact}});
  EXPECT_TRUE(c.ok()) << c.str();
}

TEST(GpuOps, ClearErrorsInsteadOfFaults) {
  TestStream s;
  M x = random_mirror(8 * 64, DType::kBF16, 3);
  M w = random_mirror(64, DType::kBF16, 4);
  auto code_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  // A host weight with device activations.
  EXPECT_EQ(code_of([&] {
              ops::rms_norm(x->dev({8, 64}), w->host({64}), 1e-6f, x->dev({8, 64}));
            }),
            ErrorCode::kInvalidArgument);
  // Last dim not contiguous.
  EXPECT_EQ(
      code_of([&] {
        ops::add(x->dev({8, 32}, {64, 2}), x->dev({8, 32}, {64, 2}), x->dev({8, 32}, {64, 2}));
      }),
      ErrorCode::kInvalidArgument);
  // i32 activations.
  M ids = mirror(8, DType::kI32);
  EXPECT_EQ(code_of([&] { ops::cast(ids->dev({8}), x->dev({8})); }), ErrorCode::kInvalidArgument);
  // head_dim above the CUDA rope's limit.
  M big = mirror(2048, DType::kBF16);
  M pos = mirror(1, DType::kI64);
  M inv = mirror(1024, DType::kF32);
  EXPECT_EQ(code_of([&] {
              ops::rope(big->dev({1, 1, 2048}), pos->dev({1}), inv->dev({1024}));
            }),
            ErrorCode::kUnsupported);
  s.sync();
}

TEST(GpuOps, Embedding) { embedding_cases(false); }
TEST(GpuOps, RmsNorm) { rms_norm_cases(false); }
TEST(GpuOps, AddRmsNorm) { add_rms_norm_cases(false); }
TEST(GpuOps, SiluAndMul) { silu_cases(false); }
TEST(GpuOps, Add) { add_cases(false); }
TEST(GpuOps, GatherRows) { gather_cases(false); }
TEST(GpuOps, Cast) { cast_cases(false); }

TEST(GpuOpsSmall, Embedding) { embedding_cases(true); }
TEST(GpuOpsSmall, RmsNorm) { rms_norm_cases(true); }
TEST(GpuOpsSmall, AddRmsNorm) { add_rms_norm_cases(true); }
TEST(GpuOpsSmall, SiluAndMul) { silu_cases(true); }
TEST(GpuOpsSmall, Add) { add_cases(true); }
TEST(GpuOpsSmall, GatherRows) { gather_cases(true); }
TEST(GpuOpsSmall, Cast) { cast_cases(true); }

// ---------------------------------------------------------------------------------------------
// Perf mode: the row-wise ops at a Llama-3.1-8B prefill chunk (8192 tokens, hidden 4096,
// intermediate 14336, 32/8 heads of 128), GB/s of bytes each op must read + write.

TEST(GpuOpsPerf, RowOpsLlama8B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  Summary sum;
  const int64_t n = 8192, h = 4096, inter = 14336, hd = 128, hq = 32, hkv = 8;
  auto perf = [](CaseSpec c) {
    c.check = nullptr;
    c.perf_only = true;
    return c;
  };
  {
    const int64_t vocab = 128256;
    M table = random_mirror(vocab * h, DType::kBF16, 1);
    M ids = mirror(n, DType::kI32);
    ids->random(2, 0, float(vocab));
    M out = mirror(n * h, DType::kF32);
    CaseSpec c;
    c.name = fmt::format("embedding(n={} hidden={} vocab={} bf16->f32)", n, h, vocab);
    c.gpu = [=] { ops::embedding(ids->dev({n}), table->dev({vocab, h}), out->dev({n, h})); };
    c.bytes = double(n * h) * 6;
    run_case(s, perf(c), sum);
  }
  run_case(s, perf(rms_norm_case(n, h, DType::kF32, DType::kBF16, DType::kBF16, 0, false, 3)), sum);
  run_case(s, perf(rms_norm_case(n, h, DType::kBF16, DType::kBF16, DType::kBF16, 0, true, 4)), sum);
  run_case(s, perf(add_rms_norm_case(n, h, DType::kBF16, DType::kBF16, 0, true, 5)), sum);
  run_case(s, perf(silu_case(n, inter, DType::kBF16, DType::kBF16, false, 6)), sum);
  run_case(s, perf(silu_case(n, inter, DType::kBF16, DType::kBF16, true, 7)), sum);
  run_case(s, perf(add_case(n, h, DType::kBF16, DType::kF32, 0, true, 8)), sum);
  run_case(s, perf(rope_case(n, hd, hq, hkv, DType::kBF16, 9)), sum);
  run_case(s, perf(head_norm_case(n, hd, hq, hkv, DType::kBF16, 10)), sum);
  run_case(s, perf(cast_case(n, h, DType::kF32, DType::kBF16, 0, false, 11)), sum);
  run_case(s, perf(gather_case(n, h, n, DType::kBF16, 0, 12)), sum);
}

}  // namespace
}  // namespace longctx::gpu_ops_test
