// The ops on strided views (q/k/v of a fused qkv output, gate/up halves of one [n, 2I] output,
// rows with padding), 16-bit activations, and the ops added for the GPU model (add_rms_norm,
// gather_rows, cast), each against a straightforward loop over the view's elements. Elements
// outside a view must stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "ops/add.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "ops/gather_rows.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/silu_and_mul.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

// Element (i, j) / (i, j, k) of a strided float tensor as float.
float at(const Tensor& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0, d = 0;
  for (int64_t i : idx) off += i * t.strides()[d++];
  switch (t.dtype()) {
    case DType::kF32:
      return static_cast<const float*>(t.data_ptr())[off];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(t.data_ptr())[off]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(t.data_ptr())[off]);
    default:
      ADD_FAILURE() << "not a float dtype";
      return 0;
  }
}

// f rounded to dtype, as the ops store it.
float round_to(float f, DType dt) {
  if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(f));
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(f));
  return f;
}

// Byte-exact snapshot of a whole buffer, to check what a view must not touch.
std::vector<uint8_t> bytes_of(const Tensor& base) {
  const uint8_t* p = static_cast<const uint8_t*>(base.data_ptr());
  return std::vector<uint8_t>(p, p + base.nbytes());
}

// RMSNorm of one row of floats exactly as the twins define it (double sum of squares).
std::vector<float> rms_row(const std::vector<float>& x, const Tensor& w, float eps) {
  double ss = 0;
  for (float v : x) ss += double(v) * double(v);
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / double(x.size())) + eps);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float(value_at(w, int64_t(i))) * (x[i] * inv);
  return out;
}

}  // namespace

TEST(StridedOps, RmsNormOnHeadViewsOfFusedQkvInPlace) {
  // Qwen3's k_norm over [n, kv_heads, head_dim] inside a [n, (q + 2 kv) * head_dim] buffer.
  const int64_t n = 5, hq = 4, hkv = 2, d = 16, width = (hq + 2 * hkv) * d;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor qkv = random_tensor({n, width}, dt, 7, -3.f, 3.f);
    Tensor w = random_tensor({d}, DType::kBF16, 8, 0.5f, 1.5f);
    Tensor k = qkv.slice(1, hq * d, (hq + hkv) * d);
    Tensor kh =
        Tensor::from_blob(k.data_ptr(), {n, hkv, d}, dt, Device::cpu(), nullptr, {width, d, 1});
    Tensor before = qkv.contiguous().to(Device::cpu());
    std::vector<uint8_t> snapshot = bytes_of(qkv);
    ops::rms_norm(kh, w, 1e-6f, kh);
    const size_t es = dtype_size(dt);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < width; ++c) {
        const bool in_k = c >= hq * d && c < (hq + hkv) * d;
        if (!in_k)
          ASSERT_EQ(
              std::memcmp(&snapshot[(t * width + c) * es],
                          static_cast<const uint8_t*>(qkv.data_ptr()) + (t * width + c) * es, es),
              0)
              << "touched outside the view at " << t << "," << c;
      }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < hkv; ++h) {
        std::vector<float> row(d);
        for (int64_t i = 0; i < d; ++i) row[i] = at(before, {t, (hq + h) * d + i});
        std::vector<float> ref = rms_row(row, w, 1e-6f);
        for (int64_t i = 0; i < d; ++i)
          ASSERT_EQ(at(kh, {t, h, i}), round_to(ref[i], dt)) << dtype_name(dt) << " " << t;
      }
  }
}

TEST(StridedOps, RmsNormMixedDtypesAndPaddedRows) {
  const int64_t rows = 9, d = 40, ld = 48;
  for (DType xdt : {DType::kF32, DType::kBF16})
    for (DType odt : {DType::kF32, DType::kBF16, DType::kF16}) {
      Tensor xbase = random_tensor({rows, ld}, xdt, 11, -2.f, 2.f);
      Tensor x = xbase.slice(1, 3, 3 + d);
      Tensor obase = Tensor::zeros({rows, ld}, odt);
      Tensor out = obase.slice(1, 0, d);
      Tensor w = random_tensor({d}, DType::kF32, 12);
      ops::rms_norm(x, w, 1e-5f, out);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> row(d);
        for (int64_t i = 0; i < d; ++i) row[i] = at(x, {r, i});
        std::vector<float> ref = rms_row(row, w, 1e-5f);
        for (int64_t i = 0; i < d; ++i) ASSERT_EQ(at(out, {r, i}), round_to(ref[i], odt));
        for (int64_t i = d; i < ld; ++i) ASSERT_EQ(at(obase, {r, i}), 0.f);
      }
    }
}

TEST(StridedOps, AddRmsNormUpdatesResidualAndNormalizesInPlace) {
  const int64_t n = 6, d = 64;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = random_tensor({n, d}, dt, 13, -2.f, 2.f);
    Tensor res_base = random_tensor({n, d + 8}, DType::kF32, 14, -4.f, 4.f);
    Tensor residual = res_base.slice(1, 8, 8 + d);  // strided rows
    Tensor w = random_tensor({d}, DType::kBF16, 15, 0.5f, 1.5f);
    std::vector<float> new_res(n * d);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d; ++i) new_res[r * d + i] = at(residual, {r, i}) + at(x, {r, i});
    ops::add_rms_norm(x, residual, w, 1e-6f, x);  // out = x
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> row(new_res.begin() + r * d, new_res.begin() + (r + 1) * d);
      std::vector<float> ref = rms_row(row, w, 1e-6f);
      for (int64_t i = 0; i < d; ++i) {
        ASSERT_EQ(at(residual, {r, i}), row[i]);
        ASSERT_EQ(at(x, {r, i}), round_to(ref[i], dt));
      }
    }
  }
  Tensor x = Tensor::zeros({2, 4}, DType::kF32);
  EXPECT_THROW(ops::add_rms_norm(x, x, Tensor::zeros({4}, DType::kF32), 1e-6f, x), Error);
}

TEST(StridedOps, SiluAndMulOnHalvesOfFusedGateUp) {
  const int64_t n = 7, inter = 24;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor gu = random_tensor({n, 2 * inter}, dt, 16, -6.f, 6.f);
    Tensor gate = gu.slice(1, 0, inter), up = gu.slice(1, inter, 2 * inter);
    Tensor before = gu.contiguous().to(Device::cpu());
    ops::silu_and_mul(gate, up, gate);  // in place into gate
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < inter; ++i) {
        const float g = at(before, {t, i}), u = at(before, {t, inter + i});
        ASSERT_EQ(at(gate, {t, i}), round_to(g / (1.0f + std::exp(-g)) * u, dt));
        ASSERT_EQ(at(up, {t, i}), u);
      }
  }
}

TEST(StridedOps, AddMixedDtypesStrided) {
  const int64_t n = 4, d = 30;
  Tensor a = random_tensor({n, d}, DType::kF32, 17);
  Tensor bbase = random_tensor({n, 2 * d}, DType::kBF16, 18);
  Tensor b = bbase.slice(1, d, 2 * d);
  Tensor out = Tensor::empty({n, d}, DType::kBF16);
  ops::add(a, b, out);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < d; ++i)
      ASSERT_EQ(at(out, {r, i}), round_to(at(a, {r, i}) + at(b, {r, i}), DType::kBF16));
}

TEST(StridedOps, RopeOnQAndKViewsMatchesContiguousRope) {
  const int64_t n = 6, hq = 4, hkv = 2, d = 32, width = (hq + 2 * hkv) * d;
  RopeConfig rc;
  rc.theta = 5e5;
  std::vector<float> inv = ops::rope_inv_freq(rc, d);
  Tensor inv_t = Tensor::from_blob(inv.data(), {d / 2}, DType::kF32);
  std::vector<int64_t> pos = {0, 3, 17, 4095, 70000, 999999};
  Tensor pos_t = Tensor::from_blob(pos.data(), {n}, DType::kI64);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor qkv = random_tensor({n, width}, dt, 19, -2.f, 2.f);
    Tensor before = qkv.contiguous().to(Device::cpu());
    Tensor q =
        Tensor::from_blob(qkv.data_ptr(), {n, hq, d}, dt, Device::cpu(), nullptr, {width, d, 1});
    Tensor k = Tensor::from_blob(static_cast<char*>(qkv.data_ptr()) + hq * d * dtype_size(dt),
                                 {n, hkv, d}, dt, Device::cpu(), nullptr, {width, d, 1});
    ops::rope(q, pos_t, inv_t);
    ops::rope(k, pos_t, inv_t);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < hq + hkv; ++h)
        for (int64_t i = 0; i < d / 2; ++i) {
          const float angle = float(pos[t]) * inv[i];
          const float c = float(std::cos(double(angle))), s = float(std::sin(double(angle)));
          const float x1 = at(before, {t, h * d + i}), x2 = at(before, {t, h * d + i + d / 2});
          ASSERT_EQ(at(qkv, {t, h * d + i}), round_to(x1 * c + (-x2) * s, dt));
          ASSERT_EQ(at(qkv, {t, h * d + i + d / 2}), round_to(x2 * c + x1 * s, dt));
        }
    for (int64_t t = 0; t < n; ++t)  // v untouched
      for (int64_t c = (hq + hkv) * d; c < width; ++c)
        ASSERT_EQ(at(qkv, {t, c}), at(before, {t, c}));
  }
}

TEST(StridedOps, EmbeddingIntoBf16PaddedRows) {
  Tensor table = random_tensor({20, 12}, DType::kF32, 20);
  std::vector<int32_t> id = {3, 19, 0};
  Tensor obase = Tensor::zeros({3, 16}, DType::kBF16);
  Tensor out = obase.slice(1, 2, 14);
  ops::embedding(Tensor::from_blob(id.data(), {3}, DType::kI32), table, out);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t c = 0; c < 12; ++c)
      ASSERT_EQ(at(out, {i, c}), round_to(at(table, {id[i], c}), DType::kBF16));
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(at(obase, {i, 15}), 0.f);
}

TEST(StridedOps, GatherRowsAnyDtype) {
  std::vector<int32_t> idx = {4, 0, 4, 2};
  Tensor rows = Tensor::from_blob(idx.data(), {4}, DType::kI32);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI64, DType::kU8}) {
    const int64_t n = 5, d = 7, ld = 9;
    Tensor xbase = Tensor::empty({n, ld}, dt);
    for (size_t b = 0; b < xbase.nbytes(); ++b) static_cast<uint8_t*>(xbase.data_ptr())[b] = b * 37;
    Tensor x = xbase.slice(1, 1, 1 + d);
    Tensor out = Tensor::zeros({4, d}, dt);
    ops::gather_rows(x, rows, out);
    const size_t es = dtype_size(dt);
    for (int64_t i = 0; i < 4; ++i)
      ASSERT_EQ(
          std::memcmp(static_cast<const char*>(out.data_ptr()) + i * d * es,
                      static_cast<const char*>(xbase.data_ptr()) + (idx[i] * ld + 1) * es, d * es),
          0)
          << dtype_name(dt) << " row " << i;
  }
  std::vector<int32_t> bad = {1, 5};
  Tensor x = Tensor::zeros({5, 3}, DType::kF32);
  Tensor out = Tensor::empty({2, 3}, DType::kF32);
  try {
    ops::gather_rows(x, Tensor::from_blob(bad.data(), {2}, DType::kI32), out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("row index 5"), std::string::npos) << e.what();
  }
}

TEST(StridedOps, CastBetweenFloatDtypesFromStridedSource) {
  const DType dts[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType from : dts)
    for (DType to : dts) {
      Tensor base = random_tensor({3, 2, 20}, from, 21, -70000.f, 70000.f);  // f16 overflows too
      Tensor x = base.slice(2, 5, 16);                                       // [3, 2, 11]
      Tensor out = Tensor::empty({3, 2, 11}, to);
      ops::cast(x, out);
      for (int64_t a = 0; a < 3; ++a)
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t c = 0; c < 11; ++c)
            ASSERT_EQ(at(out, {a, b, c}), round_to(at(x, {a, b, c}), to))
                << dtype_name(from) << "->" << dtype_name(to);
    }
}

TEST(StridedOps, LinearStridedRowsEqualContiguous) {
  const int64_t n = 5, in = 40, out_f = 24;
  Tensor xbase = random_tensor({n, 2 * in}, DType::kF32, 22);
  Tensor x = xbase.slice(1, in, 2 * in);
  Tensor w = random_tensor({out_f, in}, DType::kBF16, 23);
  Tensor b = random_tensor({out_f}, DType::kF32, 24);
  Tensor ref = Tensor::empty({n, out_f}, DType::kF32);
  ops::linear(x.contiguous(), w, b, ref);
  Tensor obase = Tensor::zeros({n, out_f + 3}, DType::kF32);
  Tensor out = obase.slice(1, 0, out_f);
  ops::linear(x, w, b, out);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t o = 0; o < out_f; ++o) ASSERT_EQ(at(out, {t, o}), at(ref, {t, o}));
    for (int64_t o = out_f; o < out_f + 3; ++o) ASSERT_EQ(at(obase, {t, o}), 0.f);
  }
}

TEST(StridedOps, RejectsNonContiguousLastDimAndRank4) {
  Tensor base = Tensor::zeros({4, 6}, DType::kF32);
  Tensor col =
      Tensor::from_blob(base.data_ptr(), {4, 3}, DType::kF32, Device::cpu(), nullptr, {6, 2});
  Tensor out = Tensor::empty({4, 3}, DType::kF32);
  try {
    ops::add(col, out, out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("contiguous last dim"), std::string::npos) << e.what();
  }
  Tensor r4 = Tensor::zeros({2, 2, 2, 2}, DType::kF32);
  EXPECT_THROW(ops::cast(r4, r4), Error);
}
