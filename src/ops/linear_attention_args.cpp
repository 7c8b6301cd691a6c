#include "ops/linear_attention_args.h"

#include <cmath>

#include "ops/op_utils.h"

namespace longctx::ops {

namespace {

// An activation [rows, ...] on `device` whose last dim is contiguous: f32 on the CPU, f32, bf16
// or f16 on CUDA.
void check_act(const char* op, const char* arg, const Tensor& t, int64_t rank, Device device) {
  check_rank(op, arg, t, rank);
  if (device.is_cpu())
    check_dtype(op, arg, t, DType::kF32);
  else
    check_float_activation(op, arg, t);
  LONGCTX_CHECK(t.strides()[rank - 1] == 1, ErrorCode::kInvalidArgument,
                "{}: {} {} must have a contiguous last dim", op, arg, t.str());
  LONGCTX_CHECK(t.device() == device, ErrorCode::kInvalidArgument, "{}: {} is on {}, not {}", op,
                arg, t.device().str(), device.str());
}

// An f32 tensor on `device` (gates, weights, states).
void check_f32(const char* op, const char* arg, const Tensor& t, int64_t rank, Device device) {
  check_rank(op, arg, t, rank);
  check_dtype(op, arg, t, DType::kF32);
  LONGCTX_CHECK(t.strides()[rank - 1] == 1, ErrorCode::kInvalidArgument,
                "{}: {} {} must have a contiguous last dim", op, arg, t.str());
  LONGCTX_CHECK(t.device() == device, ErrorCode::kInvalidArgument, "{}: {} is on {}, not {}", op,
                arg, t.device().str(), device.str());
}

void check_same_dtype(const char* op, const char* arg, const Tensor& t, const Tensor& first) {
  LONGCTX_CHECK(t.dtype() == first.dtype(), ErrorCode::kInvalidArgument,
                "{}: {} is {}, the other activations {}", op, arg, dtype_name(t.dtype()),
                dtype_name(first.dtype()));
}

// qo_indptr from 0 to `rows`, non-decreasing, with one state per sequence of `state_shape`.
std::vector<float*> check_seqs(const char* op, std::span<const int32_t> qo, int64_t rows,
                               std::span<const Tensor> states, const SeqDeviceArrays& dev,
                               const Shape& state_shape, Device device) {
  if (dev.defined()) {
    // Device arrays: only what the host knows is checked (their contents are the caller's).
    LONGCTX_CHECK(device.is_cuda(), ErrorCode::kInvalidArgument,
                  "{}: device sequence arrays on {} (the CPU op takes host arrays)", op,
                  device.str());
    LONGCTX_CHECK(qo.empty() && states.empty(), ErrorCode::kInvalidArgument,
                  "{}: both host and device sequence arrays given", op);
    LONGCTX_CHECK(dev.states != nullptr && dev.num_seqs >= 1, ErrorCode::kInvalidArgument,
                  "{}: device sequence arrays need states and at least one sequence (got {})", op,
                  dev.num_seqs);
    return {};
  }
  LONGCTX_CHECK(qo.size() >= 2 && qo.front() == 0 && qo.back() == rows, ErrorCode::kInvalidArgument,
                "{}: qo_indptr must run from 0 to the {} rows over at least one sequence", op,
                rows);
  for (size_t s = 0; s + 1 < qo.size(); ++s)
    LONGCTX_CHECK(qo[s] <= qo[s + 1], ErrorCode::kInvalidArgument,
                  "{}: qo_indptr decreases at sequence {}", op, s);
  LONGCTX_CHECK(states.size() == qo.size() - 1, ErrorCode::kInvalidArgument,
                "{}: {} states for {} sequences", op, states.size(), qo.size() - 1);
  std::vector<float*> ptrs;
  ptrs.reserve(states.size());
  for (const Tensor& st : states) {
    check_contiguous(op, "state", st);
    check_dtype(op, "state", st, DType::kF32);
    check_shape(op, "state", st, state_shape);
    LONGCTX_CHECK(st.device() == device, ErrorCode::kInvalidArgument,
                  "{}: a state is on {}, not {}", op, st.device().str(), device.str());
    ptrs.push_back(st.data<float>());
  }
  return ptrs;
}

}  // namespace

DeltaRuleCall check_gated_delta_rule(const GatedDeltaRuleArgs& a, Device device) {
  constexpr const char* kOp = "gated_delta_rule";
  check_act(kOp, "q", a.q, 3, device);
  check_act(kOp, "v", a.v, 3, device);
  const int64_t t = a.q.size(0), hk = a.q.size(1), dk = a.q.size(2);
  const int64_t hv = a.v.size(1), dv = a.v.size(2);
  check_act(kOp, "k", a.k, 3, device);
  check_shape(kOp, "k", a.k, a.q.shape());
  check_shape(kOp, "v", a.v, {t, hv, dv});
  for (auto [name, x] : {std::pair{"g", &a.g}, {"beta", &a.beta}}) {
    check_f32(kOp, name, *x, 2, device);
    check_shape(kOp, name, *x, {t, hv});
  }
  check_act(kOp, "out", a.out, 3, device);
  check_shape(kOp, "out", a.out, {t, hv, dv});
  for (auto [name, x] : {std::pair{"k", &a.k}, {"v", &a.v}, {"out", &a.out}})
    check_same_dtype(kOp, name, *x, a.q);
  LONGCTX_CHECK(hk > 0 && hv % hk == 0 && dk > 0 && dv > 0, ErrorCode::kInvalidArgument,
                "{}: {} value heads must be a multiple of {} key heads (dims {}, {})", kOp, hv, hk,
                dk, dv);
  LONGCTX_CHECK(a.chunk_size > 0, ErrorCode::kInvalidArgument, "{}: chunk size {}", kOp,
                a.chunk_size);
  DeltaRuleCall call;
  call.states = check_seqs(kOp, a.qo_indptr, t, a.states, a.device, {hv, dk, dv}, device);
  kernels::GatedDeltaRuleParams& p = call.params;
  p.q = a.q.data_ptr();
  p.k = a.k.data_ptr();
  p.v = a.v.data_ptr();
  p.g = a.g.data<float>();
  p.beta = a.beta.data<float>();
  p.out = a.out.data_ptr();
  p.dtype = a.q.dtype();
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
  p.num_seqs = a.device.defined() ? a.device.num_seqs : static_cast<int64_t>(call.states.size());
  p.num_k_heads = hk;
  p.num_v_heads = hv;
  p.k_dim = dk;
  p.v_dim = dv;
  p.scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(dk));
  p.chunk_size = a.chunk_size;
  return call;
}

ConvCall check_causal_conv1d(const CausalConv1dArgs& a, Device device) {
  constexpr const char* kOp = "causal_conv1d";
  check_act(kOp, "x", a.x, 2, device);
  check_act(kOp, "out", a.out, 2, device);
  check_same_dtype(kOp, "out", a.out, a.x);
  check_shape(kOp, "out", a.out, a.x.shape());
  check_contiguous(kOp, "weight", a.weight);
  check_f32(kOp, "weight", a.weight, 2, device);
  const int64_t t = a.x.size(0), c = a.x.size(1), kw = a.weight.size(1);
  LONGCTX_CHECK(a.weight.size(0) == c && kw >= 1, ErrorCode::kInvalidArgument,
                "{}: weight {} must be [{} channels, kernel >= 1]", kOp, a.weight.str(), c);
  const int64_t es = static_cast<int64_t>(a.x.element_size());
  const char* x0 = static_cast<const char*>(a.x.data_ptr());
  const char* o0 = static_cast<const char*>(a.out.data_ptr());
  LONGCTX_CHECK(t == 0 || o0 + ((t - 1) * a.out.strides()[0] + c) * es <= x0 ||
                    x0 + ((t - 1) * a.x.strides()[0] + c) * es <= o0,
                ErrorCode::kInvalidArgument, "{}: out must not overlap x", kOp);
  ConvCall call;
  call.states = check_seqs(kOp, a.qo_indptr, t, a.states, a.device, {kw - 1, c}, device);
  kernels::CausalConv1dParams& p = call.params;
  p.x = a.x.data_ptr();
  p.x_stride_t = a.x.strides()[0];
  p.weight = a.weight.data<float>();
  p.out = a.out.data_ptr();
  p.out_stride_t = a.out.strides()[0];
  p.dtype = a.x.dtype();
  p.num_seqs = a.device.defined() ? a.device.num_seqs : static_cast<int64_t>(call.states.size());
  p.channels = c;
  p.kernel = kw;
  p.silu = a.silu;
  return call;
}

DeltaRuleGatesParams check_delta_rule_gates(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                                            const Tensor& dt_bias, const Tensor& g,
                                            const Tensor& beta, Device device) {
  constexpr const char* kOp = "delta_rule_gates";
  check_act(kOp, "b", b, 2, device);
  const int64_t hv = b.size(1);
  check_act(kOp, "a", a, 2, device);
  check_same_dtype(kOp, "a", a, b);
  check_shape(kOp, "a", a, b.shape());
  for (auto [name, x] : {std::pair{"a_neg", &a_neg}, {"dt_bias", &dt_bias}}) {
    check_contiguous(kOp, name, *x);
    check_f32(kOp, name, *x, 1, device);
    check_shape(kOp, name, *x, {hv});
  }
  for (auto [name, x] : {std::pair{"g", &g}, {"beta", &beta}}) {
    check_contiguous(kOp, name, *x);
    check_f32(kOp, name, *x, 2, device);
    check_shape(kOp, name, *x, b.shape());
  }
  DeltaRuleGatesParams p;
  p.b = rows_view(kOp, "b", b);
  p.a = rows_view(kOp, "a", a);
  p.a_neg = a_neg.data<float>();
  p.dt_bias = dt_bias.data<float>();
  p.g = g.data<float>();
  p.beta = beta.data<float>();
  return p;
}

RmsNormGatedParams check_rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight,
                                        float eps, const Tensor& out, Device device) {
  constexpr const char* kOp = "rms_norm_gated";
  check_act(kOp, "x", x, 2, device);
  check_act(kOp, "z", z, 2, device);
  check_act(kOp, "out", out, 2, device);
  check_same_dtype(kOp, "z", z, x);
  check_same_dtype(kOp, "out", out, x);
  check_shape(kOp, "z", z, x.shape());
  check_shape(kOp, "out", out, x.shape());
  check_contiguous(kOp, "weight", weight);
  check_f32(kOp, "weight", weight, 1, device);
  check_shape(kOp, "weight", weight, {x.size(1)});
  RmsNormGatedParams p;
  p.x = rows_view(kOp, "x", x);
  p.z = rows_view(kOp, "z", z);
  p.out = rows_view(kOp, "out", out);
  p.weight = weight.data<float>();
  p.eps = eps;
  return p;
}

}  // namespace longctx::ops
