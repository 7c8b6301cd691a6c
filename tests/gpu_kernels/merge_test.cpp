// CUDA merge of attention states (two states, and N states in one fused kernel, strided or
// through a device pointer array) against the CPU merge reference. lse values span [-30, 30]
// with -inf states and rows whose every state is -inf. Tolerances: output max-abs <= 1e-5 (f32
// out), 8e-3 (bf16 out), 1e-3 (f16 out) (one rounding; __expf vs expf); lse max-abs <= 1e-4.
#include "kernels/cuda/merge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <sstream>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/merge_cpu.h"
#include "kernels/decode_test_util.h"
#include "longctx/core/tensor.h"

namespace longctx::gpu_test {
namespace {

struct MergeShape {
  int states, rows, heads, dim;
  DType in, out;
  bool pointer_array = false;
  bool two_state_api = false;  // merge_two_states (in == out)
  uint32_t seed = 1;
};

class MergeCase : public OpCase {
 public:
  explicit MergeCase(MergeShape s) : s_(s) {}
  std::string name() const override {
    std::ostringstream os;
    os << (s_.two_state_api ? "merge_two" : "merge_states") << "(N=" << s_.states
       << " n=" << s_.rows << " h=" << s_.heads << " d=" << s_.dim << " " << dtype_name(s_.in)
       << "->" << dtype_name(s_.out) << (s_.pointer_array ? " ptrs" : "") << ")";
    return os.str();
  }
  bool supported() const override { return true; }

  void prepare(cudaStream_t) override {
    const int64_t per = int64_t(s_.rows) * s_.heads * s_.dim;
    const int64_t nl = int64_t(s_.rows) * s_.heads;
    std::mt19937 rng(s_.seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f), ul(-30.f, 30.f);
    o_in_.resize(s_.states * per * dtype_size(s_.in));
    for (int64_t i = 0; i < s_.states * per; ++i) {
      float x = u(rng);
      if (s_.in == DType::kF32)
        reinterpret_cast<float*>(o_in_.data())[i] = x;
      else
        reinterpret_cast<uint16_t*>(o_in_.data())[i] =
            s_.in == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
    }
    lse_in_.resize(s_.states * nl);
    for (int64_t i = 0; i < int64_t(lse_in_.size()); ++i) {
      const int64_t r = i % nl;
      lse_in_[i] = (r % 7 == 3 || rng() % 5 == 0) ? -INFINITY : ul(rng);  // r%7==3: all empty
    }
    d_o_in_ = GuardedBuffer(o_in_.size(), 0);
    d_o_in_.upload(o_in_.data());
    d_lse_in_ = GuardedBuffer(lse_in_.size() * 4, 0);
    d_lse_in_.upload(lse_in_.data());
    d_o_ = GuardedBuffer(per * dtype_size(s_.out), 0xFF);
    d_lse_ = GuardedBuffer(nl * 4, 0xFF);
    if (s_.pointer_array) {
      std::vector<const void*> op;
      std::vector<const float*> lp;
      for (int st = 0; st < s_.states; ++st) {
        op.push_back(static_cast<const char*>(d_o_in_.data()) + st * per * dtype_size(s_.in));
        lp.push_back(static_cast<const float*>(d_lse_in_.data()) + st * nl);
      }
      d_optrs_ = GuardedBuffer(op.size() * sizeof(void*), 0);
      d_optrs_.upload(op.data());
      d_lptrs_ = GuardedBuffer(lp.size() * sizeof(void*), 0);
      d_lptrs_.upload(lp.data());
    }
  }
  kernels::MergeParams params(const void* o_in, const float* lse_in, const void* const* optrs,
                              const float* const* lptrs, void* o, float* lse) const {
    kernels::MergeParams p;
    if (optrs) {
      p.o_ptrs = optrs;
      p.lse_ptrs = lptrs;
    } else {
      p.o_in = o_in;
      p.lse_in = lse_in;
    }
    p.state_stride_o = int64_t(s_.rows) * s_.heads * s_.dim;
    p.state_stride_lse = int64_t(s_.rows) * s_.heads;
    p.o_out = o;
    p.lse_out = lse;
    p.num_states = s_.states;
    p.num_rows = s_.rows;
    p.num_heads = s_.heads;
    p.head_dim = s_.dim;
    p.in_dtype = s_.in;
    p.out_dtype = s_.out;
    return p;
  }
  void launch(cudaStream_t stream) override {
    if (s_.two_state_api) {
      const int64_t per = int64_t(s_.rows) * s_.heads * s_.dim;
      const int64_t nl = int64_t(s_.rows) * s_.heads;
      kernels::cuda::merge_two_states(
          d_o_in_.data(), static_cast<const float*>(d_lse_in_.data()),
          static_cast<const char*>(d_o_in_.data()) + per * dtype_size(s_.in),
          static_cast<const float*>(d_lse_in_.data()) + nl, d_o_.data(),
          static_cast<float*>(d_lse_.data()), s_.rows, s_.heads, s_.dim, s_.in, stream);
      return;
    }
    kernels::cuda::merge_states(
        params(d_o_in_.data(), static_cast<const float*>(d_lse_in_.data()),
               s_.pointer_array ? static_cast<const void* const*>(d_optrs_.data()) : nullptr,
               s_.pointer_array ? static_cast<const float* const*>(d_lptrs_.data()) : nullptr,
               d_o_.data(), static_cast<float*>(d_lse_.data())),
        stream);
  }
  CaseResult check() override {
    const int64_t per = int64_t(s_.rows) * s_.heads * s_.dim;
    std::vector<uint8_t> o_ref(per * dtype_size(s_.out));
    std::vector<float> lse_ref(int64_t(s_.rows) * s_.heads);
    kernels::cpu::merge_states(
        params(o_in_.data(), lse_in_.data(), nullptr, nullptr, o_ref.data(), lse_ref.data()));
    std::vector<uint8_t> o = d_o_.download<uint8_t>();
    std::vector<float> lse = d_lse_.download<float>();
    CaseResult r;
    std::ostringstream why;
    bool ok = true;
    int64_t non_finite = 0;
    for (int64_t i = 0; i < per; ++i) {
      float g, w;
      if (s_.out == DType::kF32) {
        g = reinterpret_cast<float*>(o.data())[i];
        w = reinterpret_cast<float*>(o_ref.data())[i];
      } else {
        g = half_bits_to_f32(reinterpret_cast<uint16_t*>(o.data())[i], s_.out);
        w = half_bits_to_f32(reinterpret_cast<uint16_t*>(o_ref.data())[i], s_.out);
      }
      non_finite += !std::isfinite(g);
      r.max_abs_out = std::max(r.max_abs_out, double(std::abs(g - w)));
    }
    const double tol = s_.out == DType::kF32 ? 1e-5 : s_.out == DType::kBF16 ? 8e-3 : 1e-3;
    if (non_finite) ok = false, why << non_finite << " non-finite outputs; ";
    if (r.max_abs_out > tol) ok = false, why << "out max-abs " << r.max_abs_out << "; ";
    LseCompare cl = compare_lse_rows(lse, lse_ref, 1, {});
    r.max_abs_lse = cl.max_abs;
    if (cl.bad) ok = false, why << cl.bad << " bad lse; ";
    if (cl.max_abs > 1e-4) ok = false, why << "lse max-abs " << cl.max_abs << "; ";
    if (!d_o_.guards_intact() || !d_lse_.guards_intact()) ok = false, why << "guards; ";
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }
  double flops() const override { return 2.0 * s_.states * s_.rows * s_.heads * s_.dim; }

 private:
  MergeShape s_;
  std::vector<uint8_t> o_in_;
  std::vector<float> lse_in_;
  GuardedBuffer d_o_in_, d_lse_in_, d_o_, d_lse_, d_optrs_, d_lptrs_;
};

TEST(MergeGpu, TwoAndNStates) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint32_t seed = 1;
  const DType all[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (DType in : all)
    for (DType out : all)
      cases.push_back(
          std::make_unique<MergeCase>(MergeShape{5, 37, 8, 128, in, out, false, false, seed++}));
  for (DType dt : all) {
    cases.push_back(
        std::make_unique<MergeCase>(MergeShape{2, 100, 32, 128, dt, dt, false, true, seed++}));
    cases.push_back(
        std::make_unique<MergeCase>(MergeShape{2, 3, 4, 64, dt, dt, false, true, seed++}));
  }
  cases.push_back(std::make_unique<MergeCase>(
      MergeShape{16, 33, 4, 64, DType::kF32, DType::kBF16, true, false, seed++}));
  cases.push_back(std::make_unique<MergeCase>(
      MergeShape{3, 1000, 32, 128, DType::kBF16, DType::kBF16, true, false, seed++}));
  cases.push_back(std::make_unique<MergeCase>(
      MergeShape{1, 10, 2, 40, DType::kF16, DType::kF32, false, false, seed++}));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 18);
}

TEST(MergeGpu, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(std::make_unique<MergeCase>(
      MergeShape{2, 5, 4, 128, DType::kBF16, DType::kBF16, false, true, 1}));
  cases.push_back(std::make_unique<MergeCase>(
      MergeShape{4, 7, 3, 64, DType::kF32, DType::kF16, true, false, 2}));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 2);
}

// accumulate_state on the device against the CPU reference: bf16 / f16 / f32 partial states
// folded one by one into an fp32 state, empty (-inf) rows included.
TEST(MergeGpu, AccumulateStateMatchesTheReference) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int rows = 77, heads = 8, dim = 128, states = 4;
    const size_t n = size_t(rows) * heads * dim, m = size_t(rows) * heads;
    std::vector<float> ref_o(n, 0.f), ref_lse(m, 0.f);
    Tensor d_acc = Tensor::empty({int64_t(n)}, DType::kF32, Device::cuda(0));
    Tensor d_lse = Tensor::empty({int64_t(m)}, DType::kF32, Device::cuda(0));
    for (int st = 0; st < states; ++st) {
      std::vector<uint8_t> o(n * dtype_size(dt));
      std::vector<float> lse(m);
      for (size_t i = 0; i < n; ++i) kernels::cpu::store_elem(o.data(), i, dt, u(rng));
      for (size_t i = 0; i < m; ++i) lse[i] = (i % 11 == 0) ? -INFINITY : 4 * u(rng);
      Tensor d_o = Tensor::empty({int64_t(o.size())}, DType::kU8, Device::cuda(0));
      Tensor d_l = Tensor::empty({int64_t(m)}, DType::kF32, Device::cuda(0));
      d_o.copy_from(Tensor::from_blob(o.data(), {int64_t(o.size())}, DType::kU8));
      d_l.copy_from(Tensor::from_blob(lse.data(), {int64_t(m)}, DType::kF32));
      kernels::StateAccumulateParams a;
      a.num_rows = rows;
      a.num_heads = heads;
      a.head_dim = dim;
      a.dtype = dt;
      a.init = st == 0;
      a.acc_o = ref_o.data();
      a.acc_lse = ref_lse.data();
      a.o = o.data();
      a.lse = lse.data();
      kernels::cpu::accumulate_state(a);
      a.acc_o = d_acc.data<float>();
      a.acc_lse = d_lse.data<float>();
      a.o = d_o.data_ptr();
      a.lse = d_l.data<float>();
      kernels::cuda::accumulate_state(a, nullptr);
    }
    const Tensor got_o = d_acc.to(Device::cpu()), got_lse = d_lse.to(Device::cpu());
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(got_o.data<float>()[i])) << i;
      worst = std::max<double>(worst, std::fabs(got_o.data<float>()[i] - ref_o[i]));
    }
    for (size_t i = 0; i < m; ++i) {
      if (std::isinf(ref_lse[i]))
        EXPECT_EQ(got_lse.data<float>()[i], ref_lse[i]) << i;
      else
        EXPECT_NEAR(got_lse.data<float>()[i], ref_lse[i], 1e-4) << i;
    }
    EXPECT_LT(worst, 1e-4) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace longctx::gpu_test
