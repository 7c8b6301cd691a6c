// XAttention (prefill): for each q head, the chunk's queries in groups of `stride` rows and the
// keys in groups of `stride`, a group pair scored by the sum along its antidiagonal,
//   a(r, c) = sm_scale / stride * sum_s q[r * stride + stride - 1 - s] . k[c * stride + s],
// a softmax over the key groups each query group may see (key group c visible when its first key
// is at or before the query group's first position), the probabilities summed per (query block,
// key block) of 128; each query block keeps the sink block (keys 0..127) and its diagonal blocks,
// then the heaviest other blocks until the kept mass reaches `threshold` of its total.
#include <algorithm>
#include <cmath>

#include "kernels/attention_params.h"
#include "kv/sparse/policies.h"
#include "longctx/core/error.h"

namespace longctx::sparse {

namespace {

constexpr int64_t kBlock = kernels::kSparseBlock;

class XAttentionPolicy final : public SparsePolicy {
 public:
  XAttentionPolicy(const SparseOptions& o, const KvShape& s) : o_(o), s_(s) {
    LONGCTX_CHECK(kBlock % o.stride == 0, ErrorCode::kInvalidArgument,
                  "--xattn-stride {} must divide the mask block of {} tokens", o.stride, kBlock);
  }

  std::string_view name() const override { return "xattention"; }
  bool selects(Phase phase) const override { return phase == Phase::kPrefill; }

  PrefillMask select_prefill(int64_t, const float* q, int64_t q_stride, int64_t n,
                             const SeqKeys& keys) override {
    const int64_t kv_len = keys.kv_len, p0 = kv_len - n, S = o_.stride, d = s_.head_dim;
    const int64_t q_blocks = (n + kBlock - 1) / kBlock, k_blocks = (kv_len + kBlock - 1) / kBlock;
    if (k_blocks <= 2) return {};  // the sink and the diagonal are all there is
    const int64_t hq_n = s_.num_qo_heads, group = hq_n / s_.num_kv_heads;
    const int64_t q_groups = (n + S - 1) / S, k_groups = (kv_len + S - 1) / S;
    const int64_t bs = s_.block_size, row = s_.num_kv_heads * d;
    auto key = [&](int64_t j, int64_t h) {
      return keys.pool_k + (int64_t(keys.blocks[j / bs]) * bs + j % bs) * row + h * d;
    };
    PrefillMask m;
    m.q_blocks = q_blocks;
    m.k_blocks = k_blocks;
    m.mask.assign(static_cast<size_t>(hq_n * q_blocks * k_blocks), 0);
    std::vector<double> mass(static_cast<size_t>(q_blocks * k_blocks));
    std::vector<float> a(static_cast<size_t>(k_groups));
    const float scale = s_.sm_scale / static_cast<float>(S);
    for (int64_t hq = 0; hq < hq_n; ++hq) {
      const int64_t h = hq / group;
      std::fill(mass.begin(), mass.end(), 0.0);
      for (int64_t r = 0; r < q_groups; ++r) {
        const int64_t visible = std::min(k_groups, (p0 + r * S) / S + 1);
        float mx = -INFINITY;
        for (int64_t c = 0; c < visible; ++c) {
          float dot = 0.f;
          for (int64_t s = 0; s < S; ++s) {
            const int64_t qi = r * S + S - 1 - s, kj = c * S + s;
            if (qi >= n || kj >= kv_len) continue;
            const float* qr = q + qi * q_stride + hq * d;
            const float* kr = key(kj, h);
            for (int64_t e = 0; e < d; ++e) dot += qr[e] * kr[e];
          }
          a[c] = dot * scale;
          mx = std::max(mx, a[c]);
        }
        double sum = 0;
        for (int64_t c = 0; c < visible; ++c) sum += std::exp(double(a[c] - mx));
        const int64_t i = r * S / kBlock;
        for (int64_t c = 0; c < visible; ++c)
          mass[i * k_blocks + c * S / kBlock] += std::exp(double(a[c] - mx)) / sum;
      }
      for (int64_t i = 0; i < q_blocks; ++i) choose(hq, i, p0, n, mass.data() + i * k_blocks, m);
    }
    return m;
  }

 private:
  // Query block i of head hq: the sink, the diagonal blocks, then the heaviest others until the
  // kept mass reaches the threshold.
  void choose(int64_t hq, int64_t i, int64_t p0, int64_t n, const double* mass,
              PrefillMask& m) const {
    uint8_t* out = m.mask.data() + (hq * m.q_blocks + i) * m.k_blocks;
    const int64_t j_lo = (p0 + i * kBlock) / kBlock;
    const int64_t j_hi = (p0 + std::min(n, (i + 1) * kBlock) - 1) / kBlock;
    double total = 0, kept = 0;
    for (int64_t j = 0; j <= j_hi; ++j) total += mass[j];
    std::vector<int64_t> rest;
    for (int64_t j = 0; j <= j_hi; ++j) {
      if (j == 0 || j >= j_lo) {
        out[j] = 1;
        kept += mass[j];
      } else {
        rest.push_back(j);
      }
    }
    std::sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) {
      return mass[a] > mass[b] || (mass[a] == mass[b] && a < b);
    });
    for (int64_t j : rest) {
      if (kept >= o_.threshold * total) break;
      out[j] = 1;
      kept += mass[j];
    }
  }

  SparseOptions o_;
  KvShape s_;
};

}  // namespace

std::unique_ptr<SparsePolicy> make_xattention_policy(const SparseOptions& options,
                                                     const KvShape& shape) {
  return std::make_unique<XAttentionPolicy>(options, shape);
}

}  // namespace longctx::sparse
