#include "kernels/cpu/linear_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/parallel.h"

namespace longctx::kernels::cpu {

namespace {

// x / sqrt(sum x^2 + eps) * scale into out (fla's l2norm, then the query scale).
void l2norm_scaled(const float* x, int64_t n, float eps, float scale, float* out) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = scale / std::sqrt(ss + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
}

// Runs fn(s, h) for every sequence and value head, in parallel.
template <typename Fn>
void for_each_seq_head(const GatedDeltaRuleParams& p, Fn&& fn) {
  parallel_for(p.num_seqs * p.num_v_heads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(i / p.num_v_heads, i % p.num_v_heads);
  });
}

int64_t key_head(const GatedDeltaRuleParams& p, int64_t h) {
  return h / (p.num_v_heads / p.num_k_heads);
}

// The reference reads and writes f32 activations only (the ops layer converts or refuses).
struct F32Views {
  const float *q, *k, *v;
  float* out;
  explicit F32Views(const GatedDeltaRuleParams& p)
      : q(static_cast<const float*>(p.q)),
        k(static_cast<const float*>(p.k)),
        v(static_cast<const float*>(p.v)),
        out(static_cast<float*>(p.out)) {
    LONGCTX_CHECK(p.dtype == DType::kF32, ErrorCode::kUnsupported,
                  "gated_delta_rule (CPU reference): {} activations (f32 only)",
                  dtype_name(p.dtype));
  }
};

}  // namespace

void gated_delta_rule_recurrent(const GatedDeltaRuleParams& p) {
  const F32Views io(p);
  const int64_t dk = p.k_dim, dv = p.v_dim;
  for_each_seq_head(p, [&](int64_t s, int64_t h) {
    float* st = p.states[s] + h * dk * dv;  // [dk, dv]
    const int64_t kh = key_head(p, h);
    std::vector<float> q(dk), k(dk), delta(dv);
    for (int64_t t = p.qo_indptr[s]; t < p.qo_indptr[s + 1]; ++t) {
      l2norm_scaled(io.q + t * p.q_stride_t + kh * p.q_stride_h, dk, p.l2norm_eps, p.scale,
                    q.data());
      l2norm_scaled(io.k + t * p.k_stride_t + kh * p.k_stride_h, dk, p.l2norm_eps, 1.f, k.data());
      const float* v = io.v + t * p.v_stride_t + h * p.v_stride_h;
      const float decay = std::exp(p.g[t * p.g_stride_t + h]);
      const float beta = p.beta[t * p.beta_stride_t + h];
      for (int64_t i = 0; i < dk * dv; ++i) st[i] *= decay;
      // delta = beta (v - S^T k)
      for (int64_t j = 0; j < dv; ++j) delta[j] = v[j];
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) delta[j] -= st[i * dv + j] * k[i];
      for (int64_t j = 0; j < dv; ++j) delta[j] *= beta;
      // S += k delta^T; o = S^T q
      float* o = io.out + t * p.out_stride_t + h * p.out_stride_h;
      std::fill(o, o + dv, 0.f);
      for (int64_t i = 0; i < dk; ++i) {
        float* row = st + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          row[j] += k[i] * delta[j];
          o[j] += row[j] * q[i];
        }
      }
    }
  });
}

void gated_delta_rule_chunked(const GatedDeltaRuleParams& p) {
  const F32Views io(p);
  const int64_t dk = p.k_dim, dv = p.v_dim, cs = std::max<int64_t>(1, p.chunk_size);
  for_each_seq_head(p, [&](int64_t s, int64_t h) {
    float* st = p.states[s] + h * dk * dv;  // [dk, dv]
    const int64_t kh = key_head(p, h);
    std::vector<float> q(cs * dk), k(cs * dk), w(cs * dk), u(cs * dv), gc(cs), beta(cs);
    std::vector<float> a(cs * cs), qk(cs * cs);
    for (int64_t c0 = p.qo_indptr[s]; c0 < p.qo_indptr[s + 1]; c0 += cs) {
      const int64_t n = std::min<int64_t>(cs, p.qo_indptr[s + 1] - c0);
      float cum = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = c0 + i;
        l2norm_scaled(io.q + t * p.q_stride_t + kh * p.q_stride_h, dk, p.l2norm_eps, p.scale,
                      &q[i * dk]);
        l2norm_scaled(io.k + t * p.k_stride_t + kh * p.k_stride_h, dk, p.l2norm_eps, 1.f,
                      &k[i * dk]);
        cum += p.g[t * p.g_stride_t + h];
        gc[i] = cum;  // the decay's cumulative log within the chunk
        beta[i] = p.beta[t * p.beta_stride_t + h];
      }
      // A = -(beta_i k_i . k_j) exp(G_i - G_j) below the diagonal; then T = (I - A)^-1 by
      // forward substitution, row by row: T[i][j] = A[i][j] + sum_{j<m<i} A[i][m] T[m][j].
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j) {
          float dot = 0.f;
          for (int64_t e = 0; e < dk; ++e) dot += k[i * dk + e] * k[j * dk + e];
          a[i * cs + j] = -beta[i] * dot * std::exp(gc[i] - gc[j]);
        }
        for (int64_t j = 0; j < i; ++j) {
          float acc = a[i * cs + j];
          for (int64_t m = j + 1; m < i; ++m) acc += a[i * cs + m] * a[m * cs + j];
          qk[j] = acc;  // row i's new values, written back after the row is done
        }
        for (int64_t j = 0; j < i; ++j) a[i * cs + j] = qk[j];
        a[i * cs + i] = 1.f;
      }
      // U = T (beta v), W = T (beta exp(G) k): the chunk's updates in WY form.
      for (int64_t i = 0; i < n; ++i) {
        std::fill(&u[i * dv], &u[i * dv] + dv, 0.f);
        std::fill(&w[i * dk], &w[i * dk] + dk, 0.f);
        for (int64_t j = 0; j <= i; ++j) {
          const float tij = a[i * cs + j];
          const float* v = io.v + (c0 + j) * p.v_stride_t + h * p.v_stride_h;
          const float fv = tij * beta[j], fk = tij * beta[j] * std::exp(gc[j]);
          for (int64_t e = 0; e < dv; ++e) u[i * dv + e] += fv * v[e];
          for (int64_t e = 0; e < dk; ++e) w[i * dk + e] += fk * k[j * dk + e];
        }
      }
      // v_new = U - W S (each row's write after what the state already predicts)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < dk; ++e) {
          const float wi = w[i * dk + e];
          const float* row = st + e * dv;
          for (int64_t j = 0; j < dv; ++j) u[i * dv + j] -= wi * row[j];
        }
      // o_i = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) v_new_j
      for (int64_t i = 0; i < n; ++i) {
        float* o = io.out + (c0 + i) * p.out_stride_t + h * p.out_stride_h;
        std::fill(o, o + dv, 0.f);
        const float di = std::exp(gc[i]);
        for (int64_t e = 0; e < dk; ++e) {
          const float qe = q[i * dk + e] * di;
          const float* row = st + e * dv;
          for (int64_t j = 0; j < dv; ++j) o[j] += qe * row[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          float dot = 0.f;
          for (int64_t e = 0; e < dk; ++e) dot += q[i * dk + e] * k[j * dk + e];
          const float f = dot * std::exp(gc[i] - gc[j]);
          for (int64_t e = 0; e < dv; ++e) o[e] += f * u[j * dv + e];
        }
      }
      // S = exp(G_last) S + sum_j exp(G_last - G_j) k_j v_new_j^T
      const float last = gc[n - 1], dl = std::exp(last);
      for (int64_t i = 0; i < dk * dv; ++i) st[i] *= dl;
      for (int64_t j = 0; j < n; ++j) {
        const float f = std::exp(last - gc[j]);
        for (int64_t e = 0; e < dk; ++e) {
          const float ke = k[j * dk + e] * f;
          float* row = st + e * dv;
          for (int64_t x = 0; x < dv; ++x) row[x] += ke * u[j * dv + x];
        }
      }
    }
  });
}

void causal_conv1d(const CausalConv1dParams& p) {
  LONGCTX_CHECK(p.dtype == DType::kF32, ErrorCode::kUnsupported,
                "causal_conv1d (CPU reference): {} activations (f32 only)", dtype_name(p.dtype));
  const float* x = static_cast<const float*>(p.x);
  float* out = static_cast<float*>(p.out);
  const int64_t kw = p.kernel, hist = kw - 1, ch = p.channels;
  parallel_for(
      p.num_seqs * ch,
      [&](int64_t b, int64_t e) {
        std::vector<float> win(kw);
        for (int64_t i = b; i < e; ++i) {
          const int64_t s = i / ch, c = i % ch;
          float* state = p.states[s];
          const float* wc = p.weight + c * kw;
          for (int64_t j = 0; j < hist; ++j) win[j] = state[j * ch + c];
          for (int64_t t = p.qo_indptr[s]; t < p.qo_indptr[s + 1]; ++t) {
            win[hist] = x[t * p.x_stride_t + c];
            float acc = 0.f;
            for (int64_t j = 0; j < kw; ++j) acc += wc[j] * win[j];
            out[t * p.out_stride_t + c] = p.silu ? acc / (1.f + std::exp(-acc)) : acc;
            for (int64_t j = 0; j < hist; ++j) win[j] = win[j + 1];
          }
          for (int64_t j = 0; j < hist; ++j) state[j * ch + c] = win[j];
        }
      },
      64);
}

}  // namespace longctx::kernels::cpu
