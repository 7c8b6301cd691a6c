// The CUDA qk_norm_rope (q/k head norms + RoPE in one launch) against its CPU twin (the unfused
// rms_norm and rope CPU ops) on the same bytes (gpu_ops_util.h), and against the unfused CUDA
// ops. q and k heads are views of a fused qkv buffer whose rows may carry padding; v and the
// padding must come back untouched (the harness's NaN fill and guard bytes see any stray write).
// Shapes: Qwen3-30B-A3B's heads (32 / 4 of 128) at decode and prefill token counts, Qwen3-8B's,
// odd head counts and head_dim 64 / 256, a partial rotary dim with yarn's attention scaling.
// Tolerance: 1e-6 absolute + 2 ulp: the twins' normalized values agree unless the double sums'
// order moves the float32 variance (then by 1 ulp, which the rotation carries into at most 2 of
// its output), and sincosf is within 2 ulp of the correctly rounded cos / sin (rope's tolerance).
#include "ops/qk_norm_rope.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu_ops/gpu_ops_util.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"

namespace longctx::gpu_ops_test {
namespace {

using M = std::shared_ptr<Mirror>;

const Tol kTol{1e-6, 0, 2};

M random_mirror(int64_t elems, DType dt, uint64_t seed, float lo, float hi) {
  auto m = std::make_shared<Mirror>(elems, dt);
  m->random(seed, lo, hi);
  return m;
}

struct Shape {
  int64_t n, hd, hq, hkv, pad;  // pad: elements after each qkv row
  bool partial;                 // yarn x4 over 3/4 of the head (attention scaling != 1)
};

// One qkv buffer [n, row] (q, k, v heads, then pad), its weights, positions and rope.
struct QkBuffers {
  int64_t width, row;
  ops::RopeFrequencies f;
  M qkv, wq, wk, positions, inv_freq;
  QkBuffers(const Shape& s, DType dt, uint64_t seed) {
    width = (s.hq + 2 * s.hkv) * s.hd;
    row = width + s.pad;
    RopeConfig rc;
    rc.theta = 1e6;
    if (s.partial) {
      rc.type = RopeType::kYarn;
      rc.factor = 4;
      rc.original_max_position_embeddings = 32768;
      rc.partial_rotary_factor = 0.75;
    }
    f = ops::rope_frequencies(rc, s.hd);
    qkv = random_mirror(s.n * row, dt, seed, -3.f, 3.f);
    wq = random_mirror(s.hd, DType::kBF16, seed + 1, 0.5f, 1.5f);
    wk = random_mirror(s.hd, DType::kBF16, seed + 2, -1.5f, -0.5f);
    std::mt19937_64 rng(seed);
    std::vector<int64_t> pos(s.n);
    for (int64_t i = 0; i < s.n; ++i) pos[i] = int64_t(rng() % (1 << 20));
    const int64_t fixed[] = {0, 1, 1048575, 32767};
    for (int64_t i = 0; i < std::min<int64_t>(s.n, 4); ++i) pos[i] = fixed[i];
    positions = std::make_shared<Mirror>(s.n, DType::kI64);
    positions->set(pos.data());
    inv_freq = std::make_shared<Mirror>(int64_t(f.inv_freq.size()), DType::kF32);
    inv_freq->set(f.inv_freq.data());
  }
  Tensor qk(const Shape& s, bool dev) const {
    return dev ? qkv->dev({s.n, s.hq + s.hkv, s.hd}, {row, s.hd, 1})
               : qkv->host({s.n, s.hq + s.hkv, s.hd}, {row, s.hd, 1});
  }
  ops::RopeArgs args(bool dev) const {
    const int64_t half = f.rotary_dim / 2;
    return ops::rope_args(f, dev ? inv_freq->dev({half}) : inv_freq->host({half}));
  }
  void fused(const Shape& s, bool dev) const {
    const Tensor p = dev ? positions->dev({s.n}) : positions->host({s.n});
    const Tensor q_w = dev ? wq->dev({s.hd}) : wq->host({s.hd});
    const Tensor k_w = dev ? wk->dev({s.hd}) : wk->host({s.hd});
    if (dev)
      ops::qk_norm_rope(qk(s, true), s.hq, q_w, k_w, 1e-6f, p, args(true));
    else
      ops::qk_norm_rope_cpu(qk(s, false), s.hq, q_w, k_w, 1e-6f, p, args(false));
  }
};

std::string shape_name(const Shape& s, DType dt) {
  return fmt::format("qk_norm_rope(n={} hd={} heads {}/{} pad {}{} {})", s.n, s.hd, s.hq, s.hkv,
                     s.pad, s.partial ? " yarn rotary 3/4" : "", dtype_name(dt));
}

CaseSpec twin_case(const Shape& s, DType dt, uint64_t seed) {
  auto st = std::make_shared<QkBuffers>(s, dt, seed);
  CaseSpec c;
  c.name = shape_name(s, dt);
  c.gpu = [=] { st->fused(s, true); };
  c.check = [=] {
    st->fused(s, false);
    return compare_all({{st->qkv.get(), kTol}});
  };
  c.bytes = 2.0 * double(s.n * (s.hq + s.hkv) * s.hd) * double(dtype_size(dt));
  return c;
}

const std::vector<Shape> kShapes = {
    {1, 128, 32, 4, 0, false},    {3, 128, 32, 4, 0, false}, {17, 128, 32, 4, 8, false},
    {1000, 128, 32, 4, 0, false}, {1, 128, 32, 8, 0, false}, {5, 64, 5, 1, 3, false},
    {4, 256, 8, 4, 0, false},     {9, 128, 16, 2, 0, true},  {1, 32, 3, 3, 1, true},
};

TEST(GpuOps, QkNormRopeMatchesCpuTwin) {
  TestStream s;
  Summary sum;
  uint64_t seed = 900;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (const Shape& sh : kShapes) run_case(s, twin_case(sh, dt, seed++), sum);
}

// The fused op against the three unfused CUDA launches on the same bytes.
TEST(GpuOps, QkNormRopeMatchesUnfusedCudaOps) {
  TestStream s;
  for (const Shape& sh : kShapes) {
    const DType dt = DType::kBF16;
    QkBuffers a(sh, dt, 950), b(sh, dt, 950);
    a.fused(sh, true);
    const Tensor q = b.qk(sh, true).slice(1, 0, sh.hq),
                 k = b.qk(sh, true).slice(1, sh.hq, sh.hq + sh.hkv);
    ops::rms_norm(q, b.wq->dev({sh.hd}), 1e-6f, q);
    ops::rms_norm(k, b.wk->dev({sh.hd}), 1e-6f, k);
    ops::rope(b.qk(sh, true), b.positions->dev({sh.n}), b.args(true));
    s.sync();
    Mirror unfused(b.qkv->elems(), dt);
    const std::vector<uint8_t> ub = b.qkv->download();
    unfused.set(ub.data());
    const Comparison c = compare(unfused, a.qkv->download(), kTol);
    EXPECT_TRUE(c.ok() && a.qkv->guards_intact()) << shape_name(sh, dt) << ": " << c.str();
    std::printf("  fused vs unfused CUDA %-60s %s\n", shape_name(sh, dt).c_str(), c.str().c_str());
  }
}

// A NaN in one head stays in that head (its norm), on both twins; every other head matches.
TEST(GpuOps, QkNormRopeNanStaysInItsHead) {
  TestStream s;
  const Shape sh = {3, 128, 32, 4, 0, false};
  for (int64_t nan_head : {int64_t(2), int64_t(33)}) {  // a q head, a k head
    QkBuffers st(sh, DType::kBF16, 970);
    std::vector<uint8_t> bytes = st.qkv->download();
    const uint16_t nan_bits = 0x7fc0;
    std::memcpy(bytes.data() + (nan_head * sh.hd + 5) * 2, &nan_bits, 2);
    st.qkv->set(bytes.data());
    st.fused(sh, true);
    s.sync();
    st.fused(sh, false);
    const std::vector<uint8_t> got = st.qkv->download();
    int64_t bad = 0;
    for (int64_t t = 0; t < sh.n; ++t)
      for (int64_t j = 0; j < st.row; ++j) {
        const int64_t i = t * st.row + j;
        const double g = element_value(got.data() + 2 * i, DType::kBF16);
        const double r = element_value(st.qkv->host_bytes() + 2 * i, DType::kBF16);
        const bool in_nan_head = t == 0 && j / sh.hd == nan_head;
        if (in_nan_head) {
          bad += !(std::isnan(g) && std::isnan(r));
        } else {
          const double allowed = kTol.abs + kTol.ulps * ulp_of(r, DType::kBF16);
          bad += !(std::isfinite(g) && std::abs(g - r) <= allowed);
        }
      }
    EXPECT_EQ(bad, 0) << "NaN in head " << nan_head;
    EXPECT_TRUE(st.qkv->guards_intact());
  }
}

TEST(GpuOpsSmall, QkNormRope) {
  TestStream s;
  Summary sum;
  run_case(s, twin_case({3, 128, 32, 4, 8, false}, DType::kBF16, 990), sum);
  run_case(s, twin_case({2, 64, 5, 1, 3, true}, DType::kF32, 991), sum);
}

// Perf: Qwen3-30B-A3B's q/k at decode (1 token) and a prefill chunk: the fused launch against
// the unfused three (rms_norm q, rms_norm k, rope), ms per call eagerly.
TEST(GpuOpsPerf, QkNormRopeQwen3_30B_A3B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  for (int64_t n : {1, 8192}) {
    const Shape sh = {n, 128, 32, 4, 0, false};
    QkBuffers st(sh, DType::kBF16, 999);
    const Tensor qk = st.qk(sh, true), q = qk.slice(1, 0, sh.hq),
                 k = qk.slice(1, sh.hq, sh.hq + sh.hkv);
    const double fused = time_ms(s, [&] { st.fused(sh, true); });
    const double unfused = time_ms(s, [&] {
      ops::rms_norm(q, st.wq->dev({sh.hd}), 1e-6f, q);
      ops::rms_norm(k, st.wk->dev({sh.hd}), 1e-6f, k);
      ops::rope(qk, st.positions->dev({n}), st.args(true));
    });
    std::printf("  qk_norm_rope n=%-5lld fused %8.4f ms, unfused (3 launches) %8.4f ms\n",
                (long long)n, fused, unfused);
  }
}

}  // namespace
}  // namespace longctx::gpu_ops_test
