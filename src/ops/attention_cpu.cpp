// CPU attention reference. One task = one KV head x a tile of kQueries queries (all the q heads
// of that KV head's group, so a converted key chunk serves group * kQueries rows). Keys are
// visited in chunks of kChunk with the online softmax (running max m, running sum l, rescaled
// accumulator), which equals softmax-then-matmul up to fp32 rounding and needs O(chunk) memory.
// Inner loops have fixed widths (kSub keys for q.k, kDBlock dims for p.v) with accumulators held
// in vector registers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/attention.h"
#include "ops/op_utils.h"
#include "ops/simd.h"

namespace longctx::ops {

namespace {

constexpr int64_t kQueries = 16;  // queries per task
constexpr int64_t kChunk = 128;   // keys per online-softmax step
constexpr int64_t kSub = 32;      // keys per q.k accumulator block (8 SSE registers)
constexpr int64_t kDBlock = 16;   // head dims per p.v accumulator block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t n, hq, hkv, group, d, kv_len;
};

void attention_task(const AttentionArgs& a, const Dims& dm, int64_t g, int64_t q0, int64_t q1) {
  const int64_t d = dm.d, group = dm.group, rows = (q1 - q0) * group;
  const float* q = a.q.data<float>();
  const float* k = a.k.data<float>();
  const float* v = a.v.data<float>();
  const int64_t* qpos = a.q_positions.data<int64_t>();
  const int64_t* kpos = a.k_positions.data<int64_t>();
  float* out = a.out.data<float>();
  const int64_t kv_stride = dm.hkv * d;  // floats between consecutive tokens of the cache

  // Row r is query q0 + r / group, q head g * group + r % group.
  auto q_row = [&](int64_t r) {
    return q + ((q0 + r / group) * dm.hq + g * group + r % group) * d;
  };
  int64_t max_qpos = std::numeric_limits<int64_t>::min();
  int64_t min_qpos = std::numeric_limits<int64_t>::max();
  for (int64_t i = q0; i < q1; ++i) {
    max_qpos = std::max(max_qpos, qpos[i]);
    min_qpos = std::min(min_qpos, qpos[i]);
  }
  // A sliding window hides keys at positions <= p - window from the query at p.
  const int64_t window = a.window > 0 ? a.window : std::numeric_limits<int64_t>::max();
  auto visible = [&](int64_t kp, int64_t p) { return kp <= p && kp > p - window; };

  std::vector<float> m(rows, kNegInf), l(rows, 0.0f), acc(rows * d, 0.0f);
  std::vector<float> kt(d * kChunk);  // [d][kChunk] transposed key chunk
  std::vector<float> s(kChunk);

  for (int64_t j0 = 0; j0 < dm.kv_len; j0 += kChunk) {
    const int64_t len = std::min(kChunk, dm.kv_len - j0);
    int64_t min_kpos = std::numeric_limits<int64_t>::max();
    int64_t max_kpos = std::numeric_limits<int64_t>::min();
    for (int64_t j = 0; j < len; ++j) {
      min_kpos = std::min(min_kpos, kpos[j0 + j]);
      max_kpos = std::max(max_kpos, kpos[j0 + j]);
    }
    if (min_kpos > max_qpos) continue;  // no query of this tile sees any key of the chunk
    if (a.window > 0 && max_kpos <= min_qpos - a.window) continue;  // all before every window

    std::fill(kt.begin(), kt.end(), 0.0f);
    for (int64_t j = 0; j < len; ++j) {
      const float* kj = k + (j0 + j) * kv_stride + g * d;
      for (int64_t dd = 0; dd < d; ++dd) kt[dd * kChunk + j] = kj[dd];
    }

    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q_row(r);
      const int64_t p = qpos[q0 + r / group];
      // s = scale * (q . k) for the chunk's keys; keys the row may not see get -inf.
      for (int64_t sb = 0; sb < len; sb += kSub) {
        f32x4 acc[kSub / 4] = {};
        for (int64_t dd = 0; dd < d; ++dd) {
          const float qv = qr[dd];
          const float* kr = kt.data() + dd * kChunk + sb;
#pragma GCC unroll 8
          for (int64_t j = 0; j < kSub / 4; ++j) acc[j] += qv * load4(kr + 4 * j);
        }
        float dot[kSub];
        for (int64_t j = 0; j < kSub / 4; ++j) store4(dot + 4 * j, acc[j]);
        const int64_t n_sub = std::min(kSub, len - sb);
        for (int64_t j = 0; j < n_sub; ++j)
          s[sb + j] = visible(kpos[j0 + sb + j], p) ? dot[j] * a.scale : kNegInf;
      }
      float chunk_max = kNegInf;
      for (int64_t j = 0; j < len; ++j) chunk_max = std::max(chunk_max, s[j]);
      if (chunk_max == kNegInf) continue;  // this row sees none of these keys

      const float m_new = std::max(m[r], chunk_max);
      const float alpha = std::exp(m[r] - m_new);  // 0 on the first visible chunk
      float sum = 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        s[j] = s[j] == kNegInf ? 0.0f : std::exp(s[j] - m_new);
        sum += s[j];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;

      float* ar = acc.data() + r * d;
      int64_t d0 = 0;
      for (; d0 + kDBlock <= d; d0 += kDBlock) {
        f32x4 o[kDBlock / 4];
        for (int64_t t = 0; t < kDBlock / 4; ++t) o[t] = load4(ar + d0 + 4 * t) * alpha;
        for (int64_t j = 0; j < len; ++j) {
          const float pj = s[j];
          const float* vj = v + (j0 + j) * kv_stride + g * d + d0;
#pragma GCC unroll 4
          for (int64_t t = 0; t < kDBlock / 4; ++t) o[t] += pj * load4(vj + 4 * t);
        }
        for (int64_t t = 0; t < kDBlock / 4; ++t) store4(ar + d0 + 4 * t, o[t]);
      }
      for (; d0 < d; ++d0) {  // head_dim not a multiple of kDBlock: scalar tail
        float o = ar[d0] * alpha;
        for (int64_t j = 0; j < len; ++j) o += s[j] * v[(j0 + j) * kv_stride + g * d + d0];
        ar[d0] = o;
      }
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + ((q0 + r / group) * dm.hq + g * group + r % group) * d;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int64_t dd = 0; dd < d; ++dd) o[dd] = acc[r * d + dd] * inv;
  }
}

}  // namespace

void attention_cpu(const AttentionArgs& a) {
  constexpr const char* kOp = "attention";
  for (auto [name, t] : {std::pair{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}}) {
    check_contiguous(kOp, name, *t);
    check_dtype(kOp, name, *t, DType::kF32);
    check_rank(kOp, name, *t, 3);
  }
  check_contiguous(kOp, "q_positions", a.q_positions);
  check_contiguous(kOp, "k_positions", a.k_positions);
  check_dtype(kOp, "q_positions", a.q_positions, DType::kI64);
  check_dtype(kOp, "k_positions", a.k_positions, DType::kI64);
  Dims dm;
  dm.n = a.q.size(0);
  dm.hq = a.q.size(1);
  dm.d = a.q.size(2);
  dm.hkv = a.k.size(1);
  dm.kv_len = a.kv_len;
  check_shape(kOp, "v", a.v, a.k.shape());
  check_shape(kOp, "out", a.out, a.q.shape());
  LONGCTX_CHECK(a.k.size(2) == dm.d, ErrorCode::kInvalidArgument,
                "attention: head_dim of q {} and k {} differ", a.q.str(), a.k.str());
  LONGCTX_CHECK(dm.hkv > 0 && dm.hq % dm.hkv == 0, ErrorCode::kInvalidArgument,
                "attention: {} q heads are not a multiple of {} kv heads", dm.hq, dm.hkv);
  LONGCTX_CHECK(0 <= a.kv_len && a.kv_len <= a.k.size(0), ErrorCode::kInvalidArgument,
                "attention: kv_len {} outside the cache capacity {}", a.kv_len, a.k.size(0));
  check_shape(kOp, "q_positions", a.q_positions, {dm.n});
  LONGCTX_CHECK(a.k_positions.rank() == 1 && a.k_positions.size(0) >= a.kv_len,
                ErrorCode::kInvalidArgument, "attention: k_positions {} shorter than kv_len {}",
                a.k_positions.str(), a.kv_len);
  dm.group = dm.hq / dm.hkv;
  const int64_t q_tiles = (dm.n + kQueries - 1) / kQueries;
  parallel_for(dm.hkv * q_tiles, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task % dm.hkv, q0 = (task / dm.hkv) * kQueries;
      attention_task(a, dm, g, q0, std::min(dm.n, q0 + kQueries));
    }
  });
}

}  // namespace longctx::ops
