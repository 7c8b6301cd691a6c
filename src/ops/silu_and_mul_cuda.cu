// CUDA silu_and_mul: out = g / (1 + expf(-g)) * u in fp32 (expf, not __expf),
// gelu_tanh_and_mul with tanhf, and sigmoid_and_mul as u / (1 + expf(-g)); one thread per kVec (or
// 1) elements of a row; out may be gate or up exactly (same thread reads and writes).
#include "longctx/core/stream.h"
#include "ops/ops_device.cuh"
#include "ops/silu_and_mul.h"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

template <GatedAct kAct, int N, typename TG, typename TU, typename TO>
struct SiluAndMulRow {
  SiluAndMulParams p;
  __device__ void operator()(int64_t r, int64_t chunk) const {
    const int64_t col = chunk * N;
    float g[N], u[N], o[N];
    load<N>(row_of<const TG>(p.gate, r) + col, g);
    load<N>(row_of<const TU>(p.up, r) + col, u);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (kAct == GatedAct::kSilu) {
        o[i] = __fmul_rn(__fdiv_rn(g[i], 1.0f + expf(-g[i])), u[i]);
      } else if constexpr (kAct == GatedAct::kSigmoid) {
        o[i] = __fdiv_rn(u[i], 1.0f + expf(-g[i]));
      } else {
        constexpr float kSqrt2OverPi = 0.7978845608028654f;
        const float x = g[i], inner = kSqrt2OverPi * (x + 0.044715f * x * x * x);
        o[i] = __fmul_rn(0.5f * x * (1.0f + tanhf(inner)), u[i]);
      }
    }
    store<N>(row_of<TO>(p.out, r) + col, o);
  }
};

template <GatedAct kAct>
void gated_act_cuda(const SiluAndMulParams& p) {
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "silu_and_mul");
  const int64_t rows = p.gate.rows, cols = p.gate.cols;
  const bool vec =
      cols % kVec == 0 && rows_aligned16(p.gate) && rows_aligned16(p.up) && rows_aligned16(p.out);
  visit_float(p.gate.dtype, "silu_and_mul", [&](auto tg) {
    visit_float(p.up.dtype, "silu_and_mul", [&](auto tu) {
      visit_float(p.out.dtype, "silu_and_mul", [&](auto to) {
        using TG = decltype(tg);
        using TU = decltype(tu);
        using TO = decltype(to);
        if (vec)
          launch_rows(SiluAndMulRow<kAct, kVec, TG, TU, TO>{p}, rows, cols / kVec, stream);
        else
          launch_rows(SiluAndMulRow<kAct, 1, TG, TU, TO>{p}, rows, cols, stream);
      });
    });
  });
}

}  // namespace

void silu_and_mul_cuda(const Tensor& gate, const Tensor& up, const Tensor& out) {
  gated_act_cuda<GatedAct::kSilu>(silu_and_mul_params(gate, up, out));
}

void gelu_tanh_and_mul_cuda(const Tensor& gate, const Tensor& up, const Tensor& out) {
  gated_act_cuda<GatedAct::kGeluTanh>(silu_and_mul_params(gate, up, out));
}

void sigmoid_and_mul_cuda(const Tensor& gate, const Tensor& up, const Tensor& out) {
  gated_act_cuda<GatedAct::kSigmoid>(silu_and_mul_params(gate, up, out));
}

}  // namespace longctx::ops
