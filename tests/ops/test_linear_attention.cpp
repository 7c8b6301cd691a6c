// The gated delta rule (recurrent and chunked forms) and the causal conv1d against a naive
// double-precision reference written from transformers' torch_recurrent_gated_delta_rule and
// torch_causal_conv1d_update, over odd lengths, several sequences of a batch, and prefills split
// at odd continuation points (each piece continuing from the state the previous one left).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "longctx/core/error.h"
#include "ops/linear_attention.h"
#include "ops_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

struct Shapes {
  int64_t hk = 2, hv = 4, dk = 16, dv = 8;
};

// Random inputs of one run: q, k [T, Hk, dk]; v [T, Hv, dv]; g [T, Hv] (log decays, as
// -exp(A_log) softplus(a + dt_bias) gives them: <= 0); beta [T, Hv] in (0, 1).
struct DeltaInputs {
  Tensor q, k, v, g, beta;
};

DeltaInputs random_inputs(const Shapes& s, int64_t t, uint32_t seed) {
  DeltaInputs in;
  in.q = random_tensor({t, s.hk, s.dk}, DType::kF32, seed);
  in.k = random_tensor({t, s.hk, s.dk}, DType::kF32, seed + 1);
  in.v = random_tensor({t, s.hv, s.dv}, DType::kF32, seed + 2);
  in.g = random_tensor({t, s.hv}, DType::kF32, seed + 3, -1.5f, -0.01f);
  in.beta = random_tensor({t, s.hv}, DType::kF32, seed + 4, 0.05f, 0.95f);
  return in;
}

// The naive reference: one sequence's rows [b, e) of the inputs, its state [Hv, dk, dv] in
// double, out [T, Hv, dv].
void reference_delta(const Shapes& s, const DeltaInputs& in, int64_t b, int64_t e,
                     std::vector<double>& state, std::vector<double>& out) {
  const int64_t rep = s.hv / s.hk;
  auto l2 = [&](const float* x, double scale) {
    std::vector<double> r(s.dk);
    double ss = 0;
    for (int64_t i = 0; i < s.dk; ++i) ss += double(x[i]) * x[i];
    for (int64_t i = 0; i < s.dk; ++i) r[i] = x[i] / std::sqrt(ss + 1e-6) * scale;
    return r;
  };
  for (int64_t t = b; t < e; ++t) {
    for (int64_t h = 0; h < s.hv; ++h) {
      const int64_t kh = h / rep;  // repeat_interleave of q and k over the value heads
      std::vector<double> q =
          l2(in.q.data<float>() + (t * s.hk + kh) * s.dk, 1 / std::sqrt(double(s.dk)));
      std::vector<double> k = l2(in.k.data<float>() + (t * s.hk + kh) * s.dk, 1.0);
      const float* v = in.v.data<float>() + (t * s.hv + h) * s.dv;
      const double g = std::exp(double(in.g.data<float>()[t * s.hv + h]));
      const double beta = in.beta.data<float>()[t * s.hv + h];
      double* st = state.data() + h * s.dk * s.dv;
      for (int64_t i = 0; i < s.dk * s.dv; ++i) st[i] *= g;
      for (int64_t j = 0; j < s.dv; ++j) {
        double kv_mem = 0;
        for (int64_t i = 0; i < s.dk; ++i) kv_mem += st[i * s.dv + j] * k[i];
        const double delta = (v[j] - kv_mem) * beta;
        for (int64_t i = 0; i < s.dk; ++i) st[i * s.dv + j] += k[i] * delta;
      }
      for (int64_t j = 0; j < s.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < s.dk; ++i) o += st[i * s.dv + j] * q[i];
        out[(t * s.hv + h) * s.dv + j] = o;
      }
    }
  }
}

// Runs the op over rows [b, e) of the inputs for one sequence (its state continued).
void run_delta(const DeltaInputs& in, int64_t b, int64_t e, const Tensor& state, const Tensor& out,
               ops::DeltaRuleForm form, int64_t chunk) {
  ops::GatedDeltaRuleArgs a;
  a.q = in.q.slice(0, b, e);
  a.k = in.k.slice(0, b, e);
  a.v = in.v.slice(0, b, e);
  a.g = in.g.slice(0, b, e);
  a.beta = in.beta.slice(0, b, e);
  a.out = out.slice(0, b, e);
  std::vector<int32_t> qo = {0, static_cast<int32_t>(e - b)};
  a.qo_indptr = qo;
  a.states = {&state, 1};
  a.form = form;
  a.chunk_size = chunk;
  ops::gated_delta_rule(a);
}

double max_diff(const Tensor& t, const std::vector<double>& ref) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    m = std::max(m, std::abs(double(t.data<float>()[i]) - ref[i]));
  return m;
}

// Outputs are O(1) (v in [-1, 1], |q| = dk^-0.5 after the norm); fp32 accumulation over a
// state of a few hundred terms stays well inside 2e-5 of the double reference.
constexpr double kTol = 2e-5;

}  // namespace

TEST(GatedDeltaRule, RecurrentAndChunkedMatchTheNaiveReference) {
  const Shapes s;
  for (int64_t t : {1, 2, 63, 64, 65, 131, 200}) {
    DeltaInputs in = random_inputs(s, t, static_cast<uint32_t>(t));
    std::vector<double> ref_state(s.hv * s.dk * s.dv, 0.0), ref_out(t * s.hv * s.dv);
    reference_delta(s, in, 0, t, ref_state, ref_out);
    for (auto form : {ops::DeltaRuleForm::kRecurrent, ops::DeltaRuleForm::kChunked}) {
      for (int64_t chunk : {64, 16, 7}) {
        Tensor state = Tensor::zeros({s.hv, s.dk, s.dv}, DType::kF32);
        Tensor out = Tensor::empty({t, s.hv, s.dv}, DType::kF32);
        run_delta(in, 0, t, state, out, form, chunk);
        EXPECT_LE(max_diff(out, ref_out), kTol) << "T=" << t << " chunk " << chunk;
        EXPECT_LE(max_diff(state, ref_state), kTol) << "T=" << t << " chunk " << chunk;
        if (form == ops::DeltaRuleForm::kRecurrent) break;  // chunk size does not apply
      }
    }
  }
}

TEST(GatedDeltaRule, ContinuedPiecesEqualOneRun) {
  // A prefill split at odd points, the chunked form continuing each piece from the state the
  // previous left, then decode rows in the recurrent form: equal to the reference's one pass.
  const Shapes s{1, 3, 8, 12};  // three value heads per key head
  const int64_t t = 150;
  DeltaInputs in = random_inputs(s, t, 99);
  std::vector<double> ref_state(s.hv * s.dk * s.dv, 0.0), ref_out(t * s.hv * s.dv);
  reference_delta(s, in, 0, t, ref_state, ref_out);
  Tensor state = Tensor::zeros({s.hv, s.dk, s.dv}, DType::kF32);
  Tensor out = Tensor::empty({t, s.hv, s.dv}, DType::kF32);
  const std::vector<int64_t> cuts = {0, 1, 40, 105, 146, 147, 148, 149, 150};
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const auto form =
        cuts[i] >= 146 ? ops::DeltaRuleForm::kRecurrent : ops::DeltaRuleForm::kChunked;
    run_delta(in, cuts[i], cuts[i + 1], state, out, form, 64);
  }
  EXPECT_LE(max_diff(out, ref_out), kTol);
  EXPECT_LE(max_diff(state, ref_state), kTol);
}

TEST(GatedDeltaRule, BatchOfSequencesAtDifferentPointsEqualsEachAlone) {
  // Three sequences in one call: a fresh prefill, a continued one, a decode row; each with its
  // own state, against running each alone.
  const Shapes s;
  const std::vector<int64_t> lens = {70, 9, 1};
  const int64_t t = 80;
  DeltaInputs in = random_inputs(s, t, 7);
  std::vector<Tensor> states, alone;
  for (size_t q = 0; q < lens.size(); ++q) {
    Tensor st = random_tensor({s.hv, s.dk, s.dv}, DType::kF32, 50 + q, -0.3f, 0.3f);
    if (q == 0) st = Tensor::zeros(st.shape(), DType::kF32);
    states.push_back(st);
    Tensor copy = Tensor::empty(st.shape(), DType::kF32);
    copy.copy_from(st);
    alone.push_back(copy);
  }
  std::vector<int32_t> qo = {0, 70, 79, 80};
  Tensor out = Tensor::empty({t, s.hv, s.dv}, DType::kF32);
  ops::GatedDeltaRuleArgs a{in.q, in.k, in.v, in.g, in.beta, out, qo, states};
  ops::gated_delta_rule(a);
  Tensor out_alone = Tensor::empty({t, s.hv, s.dv}, DType::kF32);
  for (size_t q = 0; q < lens.size(); ++q)
    run_delta(in, qo[q], qo[q + 1], alone[q], out_alone, ops::DeltaRuleForm::kChunked, 64);
  for (int64_t i = 0; i < out.numel(); ++i)
    ASSERT_EQ(out.data<float>()[i], out_alone.data<float>()[i]) << i;
  for (size_t q = 0; q < lens.size(); ++q)
    for (int64_t i = 0; i < states[q].numel(); ++i)
      ASSERT_EQ(states[q].data<float>()[i], alone[q].data<float>()[i]);
}

TEST(GatedDeltaRule, RejectsBadArguments) {
  const Shapes s;
  DeltaInputs in = random_inputs(s, 4, 1);
  Tensor state = Tensor::zeros({s.hv, s.dk, s.dv}, DType::kF32);
  Tensor out = Tensor::empty({4, s.hv, s.dv}, DType::kF32);
  std::vector<int32_t> qo = {0, 4};
  std::vector<Tensor> states = {state};
  ops::GatedDeltaRuleArgs a{in.q, in.k, in.v, in.g, in.beta, out, qo, states};
  EXPECT_NO_THROW(ops::gated_delta_rule(a));
  auto bad = a;
  std::vector<int32_t> short_qo = {0, 3};
  bad.qo_indptr = short_qo;
  EXPECT_THROW(ops::gated_delta_rule(bad), Error);
  bad = a;
  std::vector<Tensor> wrong = {Tensor::zeros({s.hv, s.dk, s.dv + 1}, DType::kF32)};
  bad.states = wrong;
  EXPECT_THROW(ops::gated_delta_rule(bad), Error);
  bad = a;
  bad.v = random_tensor({4, 3, s.dv}, DType::kF32, 3);  // 3 value heads over 2 key heads
  bad.out = Tensor::empty({4, 3, s.dv}, DType::kF32);
  EXPECT_THROW(ops::gated_delta_rule(bad), Error);
  bad = a;
  bad.states = {};
  EXPECT_THROW(ops::gated_delta_rule(bad), Error);
  // Device sequence arrays are the CUDA twin's: the CPU op names the problem.
  bad = a;
  bad.qo_indptr = {};
  bad.states = {};
  float* state_ptr = state.data<float>();
  bad.device = {qo.data(), &state_ptr, 1};
  try {
    ops::gated_delta_rule(bad);
    ADD_FAILURE() << "device arrays accepted on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device sequence arrays"), std::string::npos) << e.what();
  }
}

namespace {

// transformers' torch_causal_conv1d_update over a state of kernel - 1 inputs: silu of the
// depthwise conv of [state, x], the state then the last kernel - 1 inputs.
void reference_conv(const Tensor& x, int64_t b, int64_t e, const Tensor& w,
                    std::vector<double>& state, std::vector<double>& out) {
  const int64_t c = x.size(1), kw = w.size(1);
  for (int64_t t = b; t < e; ++t) {
    for (int64_t ch = 0; ch < c; ++ch) {
      double acc = 0;
      for (int64_t j = 0; j < kw; ++j) {
        const int64_t back = kw - 1 - j;  // inputs before t
        const double in = back == 0 ? x.data<float>()[t * c + ch] : state[(kw - 1 - back) * c + ch];
        acc += w.data<float>()[ch * kw + j] * in;
      }
      out[t * c + ch] = acc / (1 + std::exp(-acc));
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t j = 0; j + 1 < kw - 1; ++j) state[j * c + ch] = state[(j + 1) * c + ch];
      if (kw > 1) state[(kw - 2) * c + ch] = x.data<float>()[t * c + ch];
    }
  }
}

}  // namespace

TEST(CausalConv1d, PiecesAndDecodeRowsEqualTheReference) {
  const int64_t c = 24, t = 37;
  for (int64_t kw : {1, 2, 4}) {
    Tensor x = random_tensor({t, c}, DType::kF32, 11);
    Tensor w = random_tensor({c, kw}, DType::kF32, 12);
    std::vector<double> ref_state((kw - 1) * c, 0.0), ref_out(t * c);
    reference_conv(x, 0, t, w, ref_state, ref_out);
    Tensor state = Tensor::zeros({kw - 1, c}, DType::kF32);
    Tensor out = Tensor::empty({t, c}, DType::kF32);
    // Pieces shorter than the kernel too (the state carries inputs across several pieces).
    const std::vector<int64_t> cuts = {0, 2, 3, 20, 35, 36, 37};
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      ops::CausalConv1dArgs a;
      a.x = x.slice(0, cuts[i], cuts[i + 1]);
      a.weight = w;
      a.out = out.slice(0, cuts[i], cuts[i + 1]);
      std::vector<int32_t> qo = {0, static_cast<int32_t>(cuts[i + 1] - cuts[i])};
      a.qo_indptr = qo;
      a.states = {&state, 1};
      ops::causal_conv1d(a);
    }
    EXPECT_LE(max_diff(out, ref_out), 1e-5) << "kernel " << kw;
    EXPECT_LE(max_diff(state, ref_state), 0.0) << "kernel " << kw;
  }
}

TEST(CausalConv1d, RejectsBadArguments) {
  Tensor x = random_tensor({5, 8}, DType::kF32, 1);
  Tensor w = random_tensor({8, 4}, DType::kF32, 2);
  Tensor out = Tensor::empty({5, 8}, DType::kF32);
  Tensor state = Tensor::zeros({3, 8}, DType::kF32);
  std::vector<int32_t> qo = {0, 5};
  ops::CausalConv1dArgs a{x, w, out, qo, {&state, 1}};
  EXPECT_NO_THROW(ops::causal_conv1d(a));
  auto bad = a;
  bad.out = x;  // in place is refused: a row's output would overwrite inputs still needed
  EXPECT_THROW(ops::causal_conv1d(bad), Error);
  bad = a;
  Tensor small = Tensor::zeros({2, 8}, DType::kF32);
  bad.states = {&small, 1};
  EXPECT_THROW(ops::causal_conv1d(bad), Error);
  bad = a;
  bad.weight = random_tensor({7, 4}, DType::kF32, 3);
  EXPECT_THROW(ops::causal_conv1d(bad), Error);
  bad = a;
  float* state_ptr = state.data<float>();
  bad.device = {qo.data(), &state_ptr, 1};  // with the host arrays still set, and on the CPU
  EXPECT_THROW(ops::causal_conv1d(bad), Error);
}
