// CUDA twins of the linear-attention ops (gated_delta_rule recurrent, on both its kernels, and
// chunked, causal_conv1d, delta_rule_gates, rms_norm_gated) against their CPU twins on the same
// bytes (gpu_ops_util.h): several sequences of different lengths in one call (an empty one among
// them), each continuing from its own random state; T in {1, 7, 63, 64, 65, 300, 1000 + 4097};
// Hv = 2 Hk and Hv = Hk; head dims 128 and odd small ones (5, 3, 33, 17), 256 (where the chunked
// kernel halves its chunk to fit shared memory); q/k/v as strided views of one fused conv output,
// as Qwen3-Next passes them. bf16 activations run the CPU twin on the same values widened to f32
// and compare after rounding its result to bf16 once.
//
// Tolerances, per element:
//   gated_delta_rule, same form on both sides (out and every state): 1e-4 absolute + 1e-4
//     relative in f32. Both accumulate in fp32; they differ in the order of each dot
//     product's sum (the column-split kernel adds four warps' partial sums, and scales the sums
//     by the l2 norms rather than the vectors), the l2 norms' sums (a tree on the GPU), expf
//     against glibc's expf (2 ulp) and fused multiply-adds, each ~1e-7 relative, carried
//     through 300 state updates whose entries stay O(1): the CPU test bounds either form
//     against a double reference at 2e-5 for T <= 200 on small heads; 1e-4 leaves room for
//     128-wide heads and 300 tokens;
//     bf16 out: the same plus 1 bf16 ulp (a result near a rounding boundary may round apart);
//   gated_delta_rule, GPU chunked against CPU recurrent (or a different chunk): 5e-4 absolute
//     + 5e-4 relative: the two forms are equal in real arithmetic and differ in rounding only;
//   causal_conv1d: out 1e-6 absolute + 1e-5 relative (K <= 4 products summed in one order,
//     possibly fused, and silu's expf); states exact (copies of inputs);
//   delta_rule_gates: 1e-7 absolute + 4e-6 relative (expf/log1pf within 2 ulp on each side);
//   rms_norm_gated: 1e-6 absolute + 4e-6 relative in f32 (the sum of squares in another order,
//     expf); 16-bit outputs 1 ulp plus that.
// GpuLinearAttentionSmall.* runs the small shapes only (for compute-sanitizer).
#include "ops/linear_attention.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <numeric>

#include "gpu_ops/gpu_ops_util.h"

namespace longctx::gpu_ops_test {
namespace {

using M = std::shared_ptr<Mirror>;

M mirror(int64_t elems, DType dt) { return std::make_shared<Mirror>(elems, dt); }
M random_mirror(int64_t elems, DType dt, uint64_t seed, float lo, float hi) {
  auto m = mirror(elems, dt);
  m->random(seed, lo, hi);
  return m;
}
const char* dn(DType dt) { return dtype_name(dt).data(); }

Tol act_tol(DType dt, double abs, double rel) {
  return dt == DType::kF32 ? Tol{abs, rel, 0} : Tol{abs, rel, 1};
}

// The host bytes of a mirror as an f32 tensor of the same element count (for a bf16/f16
// mirror, the CPU twin's input: the same values widened).
Tensor widened(const Mirror& m) {
  Tensor whole = m.host({m.elems()});
  return m.dtype() == DType::kF32 ? whole : whole.to_dtype(DType::kF32);
}

Tensor view_of(const Tensor& base, const Shape& shape, const Shape& strides = {},
               int64_t offset = 0) {
  const Shape st = strides.empty() ? contiguous_strides(shape) : strides;
  return Tensor::from_blob(
      static_cast<char*>(base.data_ptr()) + offset * int64_t(base.element_size()), shape,
      base.dtype(), base.device(), nullptr, st);
}

// Writes an f32 result into a view of a mirror's host bytes, rounded once to the mirror's dtype.
void store_rounded(Tensor dst_view, const Tensor& f32) {
  dst_view.copy_from(dst_view.dtype() == DType::kF32 ? f32
                                                     : f32.contiguous().to_dtype(dst_view.dtype()));
}

std::vector<int32_t> indptr_of(const std::vector<int64_t>& lens) {
  std::vector<int32_t> qo = {0};
  for (int64_t n : lens) qo.push_back(qo.back() + int32_t(n));
  return qo;
}

std::string lens_str(const std::vector<int64_t>& lens) {
  return fmt::format("{}", fmt::join(lens, ","));
}

// ---------------------------------------------------------------------------------------------

struct DeltaShape {
  std::vector<int64_t> lens;  // tokens per sequence
  int64_t hk = 2, hv = 4, dk = 128, dv = 128;
};

// gpu_form on the device (the recurrent form on `kernel`) against ref_form on the CPU (chunk sizes
// likewise).
CaseSpec delta_case(const DeltaShape& sh, DType dt, ops::DeltaRuleForm gpu_form,
                    ops::DeltaRuleForm ref_form, int64_t gpu_chunk, int64_t ref_chunk, Tol tol,
                    uint64_t seed,
                    ops::RecurrentKernel kernel = ops::RecurrentKernel::kColumnSplit) {
  const std::vector<int32_t> qo = indptr_of(sh.lens);
  const int64_t t = qo.back(), num = int64_t(sh.lens.size());
  const int64_t hk = sh.hk, hv = sh.hv, dk = sh.dk, dv = sh.dv;
  const int64_t ld = 2 * hk * dk + hv * dv + 3;  // the conv output's row, padded
  const int64_t state_elems = hv * dk * dv;
  M mixed = random_mirror(t * ld, dt, seed, -1.f, 1.f);
  M g = random_mirror(t * hv, DType::kF32, seed + 1, -0.6f, -0.01f);
  M beta = random_mirror(t * hv, DType::kF32, seed + 2, 0.05f, 0.95f);
  M out = mirror(t * hv * dv, dt);
  M states = random_mirror(num * state_elems, DType::kF32, seed + 3, -0.3f, 0.3f);
  auto fill = [=](bool dev, const Tensor& mixed_base, const Tensor& out_base,
                  std::vector<Tensor>& st, ops::GatedDeltaRuleArgs& a) {
    auto mv = [&](const Shape& shape, const Shape& strides, int64_t off) {
      return dev ? mixed->dev(shape, strides, off) : view_of(mixed_base, shape, strides, off);
    };
    a.q = mv({t, hk, dk}, {ld, dk, 1}, 0);
    a.k = mv({t, hk, dk}, {ld, dk, 1}, hk * dk);
    a.v = mv({t, hv, dv}, {ld, dv, 1}, 2 * hk * dk);
    a.g = dev ? g->dev({t, hv}) : g->host({t, hv});
    a.beta = dev ? beta->dev({t, hv}) : beta->host({t, hv});
    a.out = dev ? out->dev({t, hv, dv}) : out_base;
    for (int64_t s = 0; s < num; ++s)
      st.push_back(dev ? states->dev({hv, dk, dv}, {}, s * state_elems)
                       : states->host({hv, dk, dv}, {}, s * state_elems));
  };
  auto form_name = [](ops::DeltaRuleForm f, int64_t chunk) {
    return f == ops::DeltaRuleForm::kRecurrent ? std::string("recurrent")
                                               : fmt::format("chunked{}", chunk);
  };
  const bool per_head =
      gpu_form == ops::DeltaRuleForm::kRecurrent && kernel == ops::RecurrentKernel::kPerHead;
  CaseSpec c;
  c.name = fmt::format("gated_delta_rule(lens {} heads {}/{} dims {}/{} {} {} vs cpu {})",
                       lens_str(sh.lens), hk, hv, dk, dv, dn(dt),
                       form_name(gpu_form, gpu_chunk) + (per_head ? "-per-head" : ""),
                       form_name(ref_form, ref_chunk));
  c.gpu = [=] {
    ops::GatedDeltaRuleArgs a;
    std::vector<Tensor> st;
    fill(true, Tensor(), Tensor(), st, a);
    a.qo_indptr = qo;
    a.states = st;
    a.form = gpu_form;
    a.chunk_size = gpu_chunk;
    a.recurrent_kernel = kernel;
    ops::gated_delta_rule(a);
  };
  c.check = [=] {
    const Tensor mixed_f32 = widened(*mixed);
    const bool f32 = dt == DType::kF32;
    const Tensor out_f32 = f32 ? out->host({t, hv, dv}) : Tensor::empty({t, hv, dv}, DType::kF32);
    ops::GatedDeltaRuleArgs a;
    std::vector<Tensor> st;
    fill(false, mixed_f32, out_f32, st, a);
    a.qo_indptr = qo;
    a.states = st;
    a.form = ref_form;
    a.chunk_size = ref_chunk;
    ops::gated_delta_rule_cpu(a);
    if (!f32) store_rounded(out->host({t, hv, dv}), out_f32);
    return compare_all({{out.get(), tol}, {states.get(), Tol{tol.abs, tol.rel, 0}}});
  };
  const double es = double(dtype_size(dt));
  c.bytes = double(t) * ((2 * hk * dk + 2 * hv * dv) * es + 8 * hv) + 2.0 * num * state_elems * 4;
  return c;
}

void delta_cases(bool small) {
  using F = ops::DeltaRuleForm;
  TestStream s;
  Summary sum;
  const Tol same{1e-4, 1e-4, 0}, forms{5e-4, 5e-4, 0};
  std::vector<DeltaShape> shapes = {
      {{1}, 1, 2, 128, 128},
      {{7}},
      {{5, 0, 64, 3}, 1, 2, 5, 3},
      {{7, 65, 1}, 3, 6, 33, 17},
      {{1, 1, 1, 1, 1, 1, 1, 1, 1}, 2, 4, 64, 64},  // a decode batch
      {{9}, 2, 2, 128, 128},                        // Hv = Hk
      {{1, 1, 0, 1}, 16, 32, 128, 128},             // Qwen3-Next-80B's heads, decode
  };
  if (!small) {
    for (int64_t n : {63, 64, 65, 300}) shapes.push_back({{n}});
    shapes.push_back({{5, 0, 130, 1, 64, 300}});
    shapes.push_back({{100}, 1, 2, 256, 256});  // the chunked kernel's chunk is halved to fit
    shapes.push_back({{1000, 4097}});           // many chunks per sequence, a partial last one
  }
  uint64_t seed = 1000;
  for (const DeltaShape& sh : shapes) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const Tol t = act_tol(dt, same.abs, same.rel), tf = act_tol(dt, forms.abs, forms.rel);
      const bool halved = sh.dk == 256;
      run_case(s, delta_case(sh, dt, F::kRecurrent, F::kRecurrent, 64, 64, t, seed++), sum);
      run_case(s,
               delta_case(sh, dt, F::kRecurrent, F::kRecurrent, 64, 64, t, seed++,
                          ops::RecurrentKernel::kPerHead),
               sum);
      run_case(s, delta_case(sh, dt, F::kChunked, F::kChunked, 64, 64, halved ? tf : t, seed++),
               sum);
      run_case(s, delta_case(sh, dt, F::kChunked, F::kRecurrent, 64, 64, tf, seed++), sum);
    }
    // Other chunk sizes: 16 against the CPU's 16 (exact schedule) and 7 against recurrent.
    run_case(s, delta_case(sh, DType::kF32, F::kChunked, F::kChunked, 16, 16, same, seed++), sum);
    run_case(s, delta_case(sh, DType::kF32, F::kChunked, F::kRecurrent, 7, 64, forms, seed++), sum);
  }
}

// A prefill in pieces then decode steps on the device equals one CPU run over all the tokens
// (the state carried between calls on the device).
TEST(GpuLinearAttention, PiecesThenDecodeEqualOneCpuRun) {
  TestStream s;
  const int64_t hk = 2, hv = 4, dk = 128, dv = 128, t = 150, ld = 2 * hk * dk + hv * dv;
  M mixed = random_mirror(t * ld, DType::kF32, 7, -1.f, 1.f);
  M g = random_mirror(t * hv, DType::kF32, 8, -0.6f, -0.01f);
  M beta = random_mirror(t * hv, DType::kF32, 9, 0.05f, 0.95f);
  M out = mirror(t * hv * dv, DType::kF32);
  M state = mirror(hv * dk * dv, DType::kF32);
  std::vector<float> zeros(hv * dk * dv, 0.f);
  state->set(zeros.data());
  auto args = [&](bool dev, int64_t b, int64_t e, ops::DeltaRuleForm form) {
    auto sl = [&](Tensor x) { return x.slice(0, b, e); };
    ops::GatedDeltaRuleArgs a;
    auto mv = [&](const Shape& shape, const Shape& strides, int64_t off) {
      return dev ? mixed->dev(shape, strides, off) : mixed->host(shape, strides, off);
    };
    a.q = sl(mv({t, hk, dk}, {ld, dk, 1}, 0));
    a.k = sl(mv({t, hk, dk}, {ld, dk, 1}, hk * dk));
    a.v = sl(mv({t, hv, dv}, {ld, dv, 1}, 2 * hk * dk));
    a.g = sl(dev ? g->dev({t, hv}) : g->host({t, hv}));
    a.beta = sl(dev ? beta->dev({t, hv}) : beta->host({t, hv}));
    a.out = sl(dev ? out->dev({t, hv, dv}) : out->host({t, hv, dv}));
    a.form = form;
    return a;
  };
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor dev_state = state->dev({hv, dk, dv});
  // Pieces 0-70, 70-140 chunked, then ten decode rows.
  std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 70}, {70, 140}};
  for (int64_t i = 140; i < t; ++i) pieces.push_back({i, i + 1});
  for (auto [b, e] : pieces) {
    ops::GatedDeltaRuleArgs a = args(
        true, b, e, e - b == 1 ? ops::DeltaRuleForm::kRecurrent : ops::DeltaRuleForm::kChunked);
    std::vector<int32_t> qo = {0, int32_t(e - b)};
    a.qo_indptr = qo;
    a.states = {&dev_state, 1};
    ops::gated_delta_rule(a);
  }
  s.sync();
  ops::GatedDeltaRuleArgs a = args(false, 0, t, ops::DeltaRuleForm::kRecurrent);
  std::vector<int32_t> qo = {0, int32_t(t)};
  const Tensor host_state = state->host({hv, dk, dv});
  a.qo_indptr = qo;
  a.states = {&host_state, 1};
  ops::gated_delta_rule_cpu(a);
  const Comparison cmp =
      compare_all({{out.get(), Tol{5e-4, 5e-4, 0}}, {state.get(), Tol{5e-4, 5e-4, 0}}});
  EXPECT_TRUE(cmp.ok()) << cmp.str();
}

// ---------------------------------------------------------------------------------------------

CaseSpec conv_case(const std::vector<int64_t>& lens, int64_t channels, int64_t kernel, DType dt,
                   bool silu, uint64_t seed) {
  const std::vector<int32_t> qo = indptr_of(lens);
  const int64_t t = qo.back(), num = int64_t(lens.size()), hist = kernel - 1;
  const int64_t ld = channels + 5, out_ld = channels + 2;
  M x = random_mirror(t * ld, dt, seed, -1.f, 1.f);
  M w = random_mirror(channels * kernel, DType::kF32, seed + 1, -0.5f, 0.5f);
  M out = mirror(t * out_ld, dt);
  M states = random_mirror(num * hist * channels, DType::kF32, seed + 2, -1.f, 1.f);
  auto state_views = [=](bool dev) {
    std::vector<Tensor> st;
    for (int64_t s = 0; s < num; ++s)
      st.push_back(dev ? states->dev({hist, channels}, {}, s * hist * channels)
                       : states->host({hist, channels}, {}, s * hist * channels));
    return st;
  };
  CaseSpec c;
  c.name = fmt::format("causal_conv1d(lens {} channels {} kernel {} {}{})", lens_str(lens),
                       channels, kernel, dn(dt), silu ? " silu" : "");
  c.gpu = [=] {
    const std::vector<Tensor> st = state_views(true);
    ops::CausalConv1dArgs a;
    a.x = x->dev({t, channels}, {ld, 1}, 2);
    a.weight = w->dev({channels, kernel});
    a.out = out->dev({t, channels}, {out_ld, 1});
    a.qo_indptr = qo;
    a.states = st;
    a.silu = silu;
    ops::causal_conv1d(a);
  };
  c.check = [=] {
    const std::vector<Tensor> st = state_views(false);
    const Tensor xf = widened(*x);
    const bool f32 = dt == DType::kF32;
    const Tensor out_f32 =
        f32 ? out->host({t, channels}, {out_ld, 1}) : Tensor::empty({t, channels}, DType::kF32);
    ops::CausalConv1dArgs a;
    a.x = view_of(xf, {t, channels}, {ld, 1}, 2);
    a.weight = w->host({channels, kernel});
    a.out = out_f32;
    a.qo_indptr = qo;
    a.states = st;
    a.silu = silu;
    ops::causal_conv1d_cpu(a);
    if (!f32) store_rounded(out->host({t, channels}, {out_ld, 1}), out_f32);
    return compare_all({{out.get(), act_tol(dt, 1e-6, 1e-5)}, {states.get(), Tol{}}});
  };
  c.bytes = double(t * channels) * 2 * double(dtype_size(dt));
  return c;
}

void conv_cases(bool small) {
  TestStream s;
  Summary sum;
  uint64_t seed = 2000;
  std::vector<std::vector<int64_t>> batches = {{1}, {7}, {2, 0, 1, 5}, {1, 1, 1, 1}};
  if (!small) batches.insert(batches.end(), {{63}, {64, 65}, {300, 1, 2}});
  for (const auto& lens : batches)
    for (int64_t channels : {37, 1024})
      for (int64_t kernel : {4, 2, 1})
        for (DType dt : {DType::kF32, DType::kBF16})
          run_case(s, conv_case(lens, channels, kernel, dt, kernel != 2, seed++), sum);
}

// ---------------------------------------------------------------------------------------------

CaseSpec gates_case(int64_t t, int64_t hv, DType dt, uint64_t seed) {
  const int64_t ld = 2 * hv + 3;
  // a + dt_bias spans softplus' threshold (20) on both sides.
  M ba = random_mirror(t * ld, dt, seed, -25.f, 25.f);
  M a_neg = random_mirror(hv, DType::kF32, seed + 1, -8.f, -0.1f);
  M dt_bias = random_mirror(hv, DType::kF32, seed + 2, -1.f, 1.f);
  M g = mirror(t * hv, DType::kF32);
  M beta = mirror(t * hv, DType::kF32);
  CaseSpec c;
  c.name = fmt::format("delta_rule_gates(T={} Hv={} {})", t, hv, dn(dt));
  c.gpu = [=] {
    ops::delta_rule_gates(ba->dev({t, hv}, {ld, 1}), ba->dev({t, hv}, {ld, 1}, hv),
                          a_neg->dev({hv}), dt_bias->dev({hv}), g->dev({t, hv}),
                          beta->dev({t, hv}));
  };
  c.check = [=] {
    const Tensor baf = widened(*ba);
    ops::delta_rule_gates_cpu(view_of(baf, {t, hv}, {ld, 1}), view_of(baf, {t, hv}, {ld, 1}, hv),
                              a_neg->host({hv}), dt_bias->host({hv}), g->host({t, hv}),
                              beta->host({t, hv}));
    const Tol tol{1e-7, 4e-6, 0};
    return compare_all({{g.get(), tol}, {beta.get(), tol}});
  };
  c.bytes = double(t * hv) * (2 * double(dtype_size(dt)) + 8);
  return c;
}

CaseSpec norm_gated_case(int64_t rows, int64_t d, DType dt, bool in_place, uint64_t seed) {
  const int64_t ld = d + 3;
  M x = random_mirror(rows * ld, dt, seed, -2.f, 2.f);
  M z = random_mirror(rows * ld, dt, seed + 1, -4.f, 4.f);
  M w = random_mirror(d, DType::kF32, seed + 2, 0.5f, 1.5f);
  M out = in_place ? x : mirror(rows * d, dt);
  auto out_view = [=](bool dev) {
    if (in_place) return dev ? x->dev({rows, d}, {ld, 1}, 1) : x->host({rows, d}, {ld, 1}, 1);
    return dev ? out->dev({rows, d}) : out->host({rows, d});
  };
  CaseSpec c;
  c.name = fmt::format("rms_norm_gated(rows={} d={} {}{})", rows, d, dn(dt),
                       in_place ? " in-place" : "");
  c.gpu = [=] {
    ops::rms_norm_gated(x->dev({rows, d}, {ld, 1}, 1), z->dev({rows, d}, {ld, 1}, 2), w->dev({d}),
                        1e-6f, out_view(true));
  };
  c.check = [=] {
    const Tensor xf = widened(*x), zf = widened(*z);
    const bool f32 = dt == DType::kF32;
    const Tensor of = f32 ? out_view(false) : Tensor::empty({rows, d}, DType::kF32);
    ops::rms_norm_gated_cpu(view_of(xf, {rows, d}, {ld, 1}, 1), view_of(zf, {rows, d}, {ld, 1}, 2),
                            w->host({d}), 1e-6f, of);
    if (!f32) store_rounded(out_view(false), of);
    const Tol tol = act_tol(dt, 1e-6, 4e-6);
    return in_place ? compare_all({{x.get(), tol}})
                    : compare_all({{x.get(), Tol{}}, {out.get(), tol}});
  };
  c.bytes = double(rows * d) * 3 * double(dtype_size(dt));
  return c;
}

void elementwise_cases(bool small) {
  TestStream s;
  Summary sum;
  uint64_t seed = 3000;
  for (int64_t t : small ? std::vector<int64_t>{1, 7} : std::vector<int64_t>{1, 7, 300, 4096})
    for (int64_t hv : {3, 32})
      for (DType dt : {DType::kF32, DType::kBF16}) run_case(s, gates_case(t, hv, dt, seed++), sum);
  for (int64_t rows : small ? std::vector<int64_t>{1, 9} : std::vector<int64_t>{1, 9, 4800})
    for (int64_t d : {7, 128, 256})
      for (DType dt : {DType::kF32, DType::kBF16})
        for (bool in_place : {false, true})
          run_case(s, norm_gated_case(rows, d, dt, in_place, seed++), sum);
}

// Bad arguments on the device are refused with the CPU twin's rules, before any launch.
// SeqDeviceArrays (the paged backend's per-step arrays, which decode graphs replay) give the
// host arrays' results bit for bit: three sequences (rows 2, 1, 3), the conv then the delta rule
// in both forms, each sequence's state at a scattered place of one buffer.
TEST(GpuLinearAttention, DeviceSequenceArraysEqualHostArrays) {
  TestStream s;
  const int64_t hk = 2, hv = 4, dk = 32, dv = 16, kw = 4, ld = 2 * hk * dk + hv * dv, t = 6;
  const std::vector<int32_t> qo = {0, 2, 3, 6};
  const int64_t num = 3, rec = hv * dk * dv, conv = (kw - 1) * ld;
  auto rnd = [](int64_t n, uint64_t seed, float lo, float hi) {
    std::vector<float> v(n);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (float& f : v) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      f = lo + (hi - lo) * float(x >> 40) / float(1 << 24);
    }
    return v;
  };
  auto to_gpu = [](std::vector<float> v, const Shape& shape) {
    return Tensor::from_blob(v.data(), shape, DType::kF32).to(kGpu);
  };
  const std::vector<float> x0 = rnd(t * ld, 1, -1, 1), w0 = rnd(ld * kw, 2, -0.5f, 0.5f),
                           g0 = rnd(t * hv, 3, -0.6f, -0.01f), b0 = rnd(t * hv, 4, 0.05f, 0.95f),
                           rec0 = rnd(2 * num * rec, 5, -0.5f, 0.5f),
                           conv0 = rnd(2 * num * conv, 6, -1, 1);
  struct Result {
    std::vector<float> mixed, out, rec, conv;
  };
  auto run = [&](bool device_arrays, ops::DeltaRuleForm form) {
    Tensor x = to_gpu(x0, {t, ld}), w = to_gpu(w0, {ld, kw}), g = to_gpu(g0, {t, hv}),
           beta = to_gpu(b0, {t, hv});
    // Sequence q's states at slot 2 - q of two per sequence (not in batch order).
    Tensor recs = to_gpu(rec0, {2 * num, rec}), convs = to_gpu(conv0, {2 * num, conv});
    Tensor mixed = Tensor::empty({t, ld}, DType::kF32, kGpu);
    Tensor out = Tensor::empty({t, hv, dv}, DType::kF32, kGpu);
    std::vector<Tensor> rec_views, conv_views;
    std::vector<int64_t> rec_ptrs, conv_ptrs;
    for (int64_t q = 0; q < num; ++q) {
      const int64_t slot = 2 * (num - 1 - q) + 1;
      rec_views.push_back(recs.slice(0, slot, slot + 1).view({hv, dk, dv}));
      conv_views.push_back(convs.slice(0, slot, slot + 1).view({kw - 1, ld}));
      rec_ptrs.push_back(int64_t(reinterpret_cast<uintptr_t>(rec_views.back().data_ptr())));
      conv_ptrs.push_back(int64_t(reinterpret_cast<uintptr_t>(conv_views.back().data_ptr())));
    }
    std::vector<int32_t> qo_copy = qo;
    const Tensor qo_dev = Tensor::from_blob(qo_copy.data(), {num + 1}, DType::kI32).to(kGpu);
    const Tensor rec_dev = Tensor::from_blob(rec_ptrs.data(), {num}, DType::kI64).to(kGpu);
    const Tensor conv_dev = Tensor::from_blob(conv_ptrs.data(), {num}, DType::kI64).to(kGpu);
    auto seqs = [&](const Tensor& ptrs) {
      return ops::SeqDeviceArrays{qo_dev.data<int32_t>(),
                                  reinterpret_cast<float* const*>(ptrs.data_ptr()), num};
    };
    ops::CausalConv1dArgs c;
    c.x = x;
    c.weight = w;
    c.out = mixed;
    if (device_arrays) {
      c.device = seqs(conv_dev);
    } else {
      c.qo_indptr = qo;
      c.states = conv_views;
    }
    ops::causal_conv1d(c);
    ops::GatedDeltaRuleArgs d;
    d.q = mixed.slice(1, 0, hk * dk).unflatten(1, {hk, dk});
    d.k = mixed.slice(1, hk * dk, 2 * hk * dk).unflatten(1, {hk, dk});
    d.v = mixed.slice(1, 2 * hk * dk, ld).unflatten(1, {hv, dv});
    d.g = g;
    d.beta = beta;
    d.out = out;
    d.form = form;
    if (device_arrays) {
      d.device = seqs(rec_dev);
    } else {
      d.qo_indptr = qo;
      d.states = rec_views;
    }
    ops::gated_delta_rule(d);
    s.sync();
    auto host = [](const Tensor& a) {
      Tensor h = a.to(Device::cpu());
      return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
    };
    return Result{host(mixed), host(out), host(recs), host(convs)};
  };
  for (ops::DeltaRuleForm form : {ops::DeltaRuleForm::kRecurrent, ops::DeltaRuleForm::kChunked}) {
    const Result a = run(false, form), b = run(true, form);
    EXPECT_EQ(a.mixed, b.mixed);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.rec, b.rec);
    EXPECT_EQ(a.conv, b.conv);
    EXPECT_NE(a.rec, rec0);  // the states moved
  }
  // Device arrays with host ones too, or without states, are refused by name.
  Tensor x = to_gpu(x0, {t, ld});
  ops::CausalConv1dArgs c;
  c.x = x;
  c.weight = to_gpu(w0, {ld, kw});
  c.out = Tensor::empty({t, ld}, DType::kF32, kGpu);
  c.qo_indptr = qo;
  std::vector<int32_t> qo_copy = qo;
  const Tensor qo_dev = Tensor::from_blob(qo_copy.data(), {num + 1}, DType::kI32).to(kGpu);
  c.device = {qo_dev.data<int32_t>(), nullptr, num};
  EXPECT_THROW(ops::causal_conv1d(c), Error);
  c.qo_indptr = {};
  EXPECT_THROW(ops::causal_conv1d(c), Error);
}

TEST(GpuLinearAttention, RefusesBadArguments) {
  TestStream s;
  const Tensor q = Tensor::zeros({4, 1, 8}, DType::kF32, kGpu);
  const Tensor v = Tensor::zeros({4, 2, 8}, DType::kF32, kGpu);
  const Tensor gb = Tensor::zeros({4, 2}, DType::kF32, kGpu);
  const Tensor out = Tensor::zeros({4, 2, 8}, DType::kF32, kGpu);
  const Tensor dev_state = Tensor::zeros({2, 8, 8}, DType::kF32, kGpu);
  const Tensor host_state = Tensor::zeros({2, 8, 8}, DType::kF32);
  std::vector<int32_t> qo = {0, 4};
  ops::GatedDeltaRuleArgs a;
  a.q = q;
  a.k = q;
  a.v = v;
  a.g = gb;
  a.beta = gb;
  a.out = out;
  a.qo_indptr = qo;
  a.states = {&host_state, 1};
  EXPECT_THROW(ops::gated_delta_rule(a), Error);  // a state on the host
  a.states = {&dev_state, 1};
  std::vector<int32_t> short_qo = {0, 3};
  a.qo_indptr = short_qo;
  EXPECT_THROW(ops::gated_delta_rule(a), Error);  // indptr does not reach T
  a.qo_indptr = qo;
  const Tensor bf_out = Tensor::zeros({4, 2, 8}, DType::kBF16, kGpu);
  a.out = bf_out;
  EXPECT_THROW(ops::gated_delta_rule(a), Error);  // mixed activation dtypes
  a.out = out;
  EXPECT_NO_THROW(ops::gated_delta_rule(a));
  s.sync();
}

}  // namespace

// The chunked delta rule at Qwen3-Next-80B's shapes (16 key / 32 value heads of 128, bf16), one
// sequence of 32K and 128K tokens: the prefill's linear-attention time per layer, for the issue's
// comparison with a full-attention layer (bench_attention --prefill 256:131072). No check: the
// CPU reference over 128K tokens is minutes; the cases above check the same kernel.
TEST(GpuOpsPerf, GatedDeltaRuleQwen3Next80B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  Summary sum;
  for (int64_t t : {32768, 131072}) {
    CaseSpec c = delta_case({{t}, 16, 32, 128, 128}, DType::kBF16, ops::DeltaRuleForm::kChunked,
                            ops::DeltaRuleForm::kChunked, 64, 64, Tol{}, 77);
    c.check = nullptr;
    c.perf_only = true;
    // q k^T within chunks, the WY solve, the state's reads and writes: the chunked form's
    // dominant products per token and value head (2 * chunk * (dk + dv) + 4 * dk * dv).
    c.flops = double(t) * 32 * (2.0 * 64 * (128 + 128) + 4.0 * 128 * 128);
    run_case(s, c, sum);
  }
}

// A decode step's delta rule at Qwen3-Next-80B's shapes (16 key / 32 value heads of 128, bf16),
// batch 1 and 32, on both recurrent kernels: GB/s of the state read and written once per sequence
// (2 MiB each way a sequence and layer) and the step's q/k/v/out. The cases above check both.
TEST(GpuOpsPerf, GatedDeltaRuleDecodeQwen3Next80B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  Summary sum;
  for (int64_t batch : {1, 32}) {
    for (ops::RecurrentKernel kernel :
         {ops::RecurrentKernel::kColumnSplit, ops::RecurrentKernel::kPerHead}) {
      CaseSpec c = delta_case({std::vector<int64_t>(size_t(batch), 1), 16, 32, 128, 128},
                              DType::kBF16, ops::DeltaRuleForm::kRecurrent,
                              ops::DeltaRuleForm::kRecurrent, 64, 64, Tol{}, 78, kernel);
      c.check = nullptr;
      c.perf_only = true;
      run_case(s, c, sum);
    }
  }
}

// Qwen3-Next-80B's heads over more chunks than the chunked form's workspace holds (56 chunks of
// 64 tokens at 32 value heads): the second segment starts inside the second sequence, which
// carries its state across the segments.
TEST(GpuLinearAttention, GatedDeltaRuleSegments) {
  using F = ops::DeltaRuleForm;
  TestStream s;
  Summary sum;
  const DeltaShape sh{{1000, 3100}, 16, 32, 128, 128};
  for (DType dt : {DType::kF32, DType::kBF16})
    run_case(s, delta_case(sh, dt, F::kChunked, F::kChunked, 64, 64, act_tol(dt, 1e-4, 1e-4), 90),
             sum);
}

TEST(GpuLinearAttention, GatedDeltaRule) { delta_cases(false); }
TEST(GpuLinearAttention, CausalConv1d) { conv_cases(false); }
TEST(GpuLinearAttention, GatesAndGatedNorm) { elementwise_cases(false); }
TEST(GpuLinearAttentionSmall, GatedDeltaRule) { delta_cases(true); }
TEST(GpuLinearAttentionSmall, CausalConv1d) { conv_cases(true); }
TEST(GpuLinearAttentionSmall, GatesAndGatedNorm) { elementwise_cases(true); }

}  // namespace longctx::gpu_ops_test
