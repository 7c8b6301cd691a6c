#include "kernels/cpu/linear_attention_cpu.h"

#include <cmath>
#include <vector>

#include "ops/linear_attention.h"
#include "ops/op_utils.h"

namespace longctx::ops {

namespace {

// A [rows, ...] f32 tensor whose last dim is contiguous, on the CPU.
void check_f32_rows(const char* op, const char* arg, const Tensor& t, int64_t rank) {
  check_rank(op, arg, t, rank);
  check_dtype(op, arg, t, DType::kF32);
  LONGCTX_CHECK(t.strides()[rank - 1] == 1, ErrorCode::kInvalidArgument,
                "{}: {} {} must have a contiguous last dim", op, arg, t.str());
  LONGCTX_CHECK(t.device().is_cpu(), ErrorCode::kInvalidArgument, "{}: {} is on {}", op, arg,
                t.device().str());
}

// qo_indptr from 0 to `rows`, non-decreasing, with one state per sequence of `state_shape`.
std::vector<float*> check_seqs(const char* op, std::span<const int32_t> qo, int64_t rows,
                               std::span<const Tensor> states, const Shape& state_shape) {
  LONGCTX_CHECK(qo.size() >= 2 && qo.front() == 0 && qo.back() == rows, ErrorCode::kInvalidArgument,
                "{}: qo_indptr must run from 0 to the {} rows over at least one sequence", op,
                rows);
  for (size_t s = 0; s + 1 < qo.size(); ++s)
    LONGCTX_CHECK(qo[s] <= qo[s + 1], ErrorCode::kInvalidArgument,
                  "{}: qo_indptr decreases at sequence {}", op, s);
  LONGCTX_CHECK(states.size() == qo.size() - 1, ErrorCode::kInvalidArgument,
                "{}: {} states for {} sequences", op, states.size(), qo.size() - 1);
  std::vector<float*> ptrs;
  for (const Tensor& st : states) {
    check_contiguous(op, "state", st);
    check_dtype(op, "state", st, DType::kF32);
    check_shape(op, "state", st, state_shape);
    LONGCTX_CHECK(st.device().is_cpu(), ErrorCode::kInvalidArgument, "{}: a state is on {}", op,
                  st.device().str());
    ptrs.push_back(st.data<float>());
  }
  return ptrs;
}

}  // namespace

void gated_delta_rule_cpu(const GatedDeltaRuleArgs& a) {
  constexpr const char* kOp = "gated_delta_rule";
  check_f32_rows(kOp, "q", a.q, 3);
  check_f32_rows(kOp, "v", a.v, 3);
  const int64_t t = a.q.size(0), hk = a.q.size(1), dk = a.q.size(2);
  const int64_t hv = a.v.size(1), dv = a.v.size(2);
  check_f32_rows(kOp, "k", a.k, 3);
  check_shape(kOp, "k", a.k, a.q.shape());
  check_shape(kOp, "v", a.v, {t, hv, dv});
  for (auto [name, x] : {std::pair{"g", &a.g}, {"beta", &a.beta}}) {
    check_f32_rows(kOp, name, *x, 2);
    check_shape(kOp, name, *x, {t, hv});
  }
  check_f32_rows(kOp, "out", a.out, 3);
  check_shape(kOp, "out", a.out, {t, hv, dv});
  LONGCTX_CHECK(hk > 0 && hv % hk == 0 && dk > 0 && dv > 0, ErrorCode::kInvalidArgument,
                "{}: {} value heads must be a multiple of {} key heads (dims {}, {})", kOp, hv, hk,
                dk, dv);
  LONGCTX_CHECK(a.chunk_size > 0, ErrorCode::kInvalidArgument, "{}: chunk size {}", kOp,
                a.chunk_size);
  std::vector<float*> states = check_seqs(kOp, a.qo_indptr, t, a.states, {hv, dk, dv});
  kernels::GatedDeltaRuleParams p;
  p.q = a.q.data<float>();
  p.k = a.k.data<float>();
  p.v = a.v.data<float>();
  p.g = a.g.data<float>();
  p.beta = a.beta.data<float>();
  p.out = a.out.data<float>();
  p.q_stride_t = a.q.strides()[0];
  p.q_stride_h = a.q.strides()[1];
  p.k_stride_t = a.k.strides()[0];
  p.k_stride_h = a.k.strides()[1];
  p.v_stride_t = a.v.strides()[0];
  p.v_stride_h = a.v.strides()[1];
  p.g_stride_t = a.g.strides()[0];
  p.beta_stride_t = a.beta.strides()[0];
  p.out_stride_t = a.out.strides()[0];
  p.out_stride_h = a.out.strides()[1];
  p.qo_indptr = a.qo_indptr.data();
  p.num_seqs = static_cast<int64_t>(states.size());
  p.states = states.data();
  p.num_k_heads = hk;
  p.num_v_heads = hv;
  p.k_dim = dk;
  p.v_dim = dv;
  p.scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(dk));
  p.chunk_size = a.chunk_size;
  if (a.form == DeltaRuleForm::kRecurrent)
    kernels::cpu::gated_delta_rule_recurrent(p);
  else
    kernels::cpu::gated_delta_rule_chunked(p);
}

void causal_conv1d_cpu(const CausalConv1dArgs& a) {
  constexpr const char* kOp = "causal_conv1d";
  check_f32_rows(kOp, "x", a.x, 2);
  check_f32_rows(kOp, "out", a.out, 2);
  check_shape(kOp, "out", a.out, a.x.shape());
  check_contiguous(kOp, "weight", a.weight);
  check_f32_rows(kOp, "weight", a.weight, 2);
  const int64_t t = a.x.size(0), c = a.x.size(1), kw = a.weight.size(1);
  LONGCTX_CHECK(a.weight.size(0) == c && kw >= 1, ErrorCode::kInvalidArgument,
                "{}: weight {} must be [{} channels, kernel >= 1]", kOp, a.weight.str(), c);
  const float* x0 = a.x.data<float>();
  const float* o0 = a.out.data<float>();
  LONGCTX_CHECK(t == 0 || o0 + (t - 1) * a.out.strides()[0] + c <= x0 ||
                    x0 + (t - 1) * a.x.strides()[0] + c <= o0,
                ErrorCode::kInvalidArgument, "{}: out must not overlap x", kOp);
  std::vector<float*> states = check_seqs(kOp, a.qo_indptr, t, a.states, {kw - 1, c});
  kernels::CausalConv1dParams p;
  p.x = x0;
  p.x_stride_t = a.x.strides()[0];
  p.weight = a.weight.data<float>();
  p.out = a.out.data<float>();
  p.out_stride_t = a.out.strides()[0];
  p.qo_indptr = a.qo_indptr.data();
  p.num_seqs = static_cast<int64_t>(states.size());
  p.states = states.data();
  p.channels = c;
  p.kernel = kw;
  p.silu = a.silu;
  kernels::cpu::causal_conv1d(p);
}

void delta_rule_gates_cpu(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                          const Tensor& dt_bias, const Tensor& g, const Tensor& beta) {
  constexpr const char* kOp = "delta_rule_gates";
  check_f32_rows(kOp, "b", b, 2);
  const int64_t t = b.size(0), hv = b.size(1);
  check_f32_rows(kOp, "a", a, 2);
  check_shape(kOp, "a", a, b.shape());
  for (auto [name, x] : {std::pair{"a_neg", &a_neg}, {"dt_bias", &dt_bias}}) {
    check_contiguous(kOp, name, *x);
    check_f32_rows(kOp, name, *x, 1);
    check_shape(kOp, name, *x, {hv});
  }
  for (auto [name, x] : {std::pair{"g", &g}, {"beta", &beta}}) {
    check_contiguous(kOp, name, *x);
    check_f32_rows(kOp, name, *x, 2);
    check_shape(kOp, name, *x, b.shape());
  }
  const float* an = a_neg.data<float>();
  const float* dt = dt_bias.data<float>();
  for (int64_t r = 0; r < t; ++r) {
    const float* br = b.data<float>() + r * b.strides()[0];
    const float* ar = a.data<float>() + r * a.strides()[0];
    for (int64_t h = 0; h < hv; ++h) {
      beta.data<float>()[r * hv + h] = 1.f / (1.f + std::exp(-br[h]));
      // softplus as torch computes it: x past its threshold 20 is returned as is
      const float x = ar[h] + dt[h];
      const float sp = x > 20.f ? x : std::log1p(std::exp(x));
      g.data<float>()[r * hv + h] = an[h] * sp;
    }
  }
}

void rms_norm_gated_cpu(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                        const Tensor& out) {
  constexpr const char* kOp = "rms_norm_gated";
  check_f32_rows(kOp, "x", x, 2);
  check_f32_rows(kOp, "z", z, 2);
  check_f32_rows(kOp, "out", out, 2);
  check_shape(kOp, "z", z, x.shape());
  check_shape(kOp, "out", out, x.shape());
  const int64_t d = x.size(1);
  check_contiguous(kOp, "weight", weight);
  check_f32_rows(kOp, "weight", weight, 1);
  check_shape(kOp, "weight", weight, {d});
  const float* w = weight.data<float>();
  for (int64_t r = 0; r < x.size(0); ++r) {
    const float* xr = x.data<float>() + r * x.strides()[0];
    const float* zr = z.data<float>() + r * z.strides()[0];
    float* o = out.data<float>() + r * out.strides()[0];
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i)
      o[i] = w[i] * (xr[i] * inv) * (zr[i] / (1.f + std::exp(-zr[i])));
  }
}

}  // namespace longctx::ops
