// Linear attention (Qwen3-Next's Gated DeltaNet): the gated delta rule and the short causal
// conv1d before it, each over a batch of sequences that continue from their own states (kernels
// and their math: kernels/linear_attention_params.h). fp32 state and accumulation; the CPU
// reference (kernels/cpu/linear_attention_cpu.cpp) takes f32 activations, the CUDA twins
// (linear_attention_cuda.cu, kernels/cuda/linear_attention.h) f32, bf16 or f16 ones (one dtype
// per call: q/k/v/out, x/out, b/a, x/z/out), g, beta, weights and states f32 everywhere. The
// CUDA twins upload the host arrays (qo_indptr, the state pointers) on every call (a graph
// captured over them would replay stale arrays), or take device arrays (SeqDeviceArrays) that the
// caller refreshes before each replay.
#pragma once

#include <cstdint>
#include <span>

#include "longctx/core/tensor.h"

namespace longctx::ops {

// The sequence arrays already on the device (the CUDA paged backend's per-step copy, which CUDA
// graphs replay): the op uploads nothing and reads them from the kernels. The caller vouches for
// them (qo_indptr from 0 to the rows, non-decreasing; one live state of the op's shape per
// sequence); qo_indptr and states stay empty then.
struct SeqDeviceArrays {
  const int32_t* qo_indptr = nullptr;  // [num_seqs + 1] device
  float* const* states = nullptr;      // [num_seqs] device pointers to device states
  int64_t num_seqs = 0;
  bool defined() const { return qo_indptr != nullptr; }
};

// kRecurrent: token by token (decode); kChunked: the chunk-parallel WY form (prefill). Equal up
// to rounding (tests/ops/test_linear_attention.cpp bounds the difference).
enum class DeltaRuleForm { kRecurrent, kChunked };

// The CUDA kernel of the recurrent form (kernels/cuda/linear_attention.h): kColumnSplit (the
// state's columns over CTAs, in registers), or kPerHead, the first kernel (a CTA per sequence and
// value head), kept for one comparison on the GPU. The CPU twin has one.
enum class RecurrentKernel { kColumnSplit, kPerHead };

struct GatedDeltaRuleArgs {
  Tensor q, k;     // [T, Hk, k_dim], last dim contiguous (views of the conv output)
  Tensor v;        // [T, Hv, v_dim], Hv a multiple of Hk
  Tensor g, beta;  // [T, Hv] f32: log decay, write strength
  Tensor out;      // [T, Hv, v_dim]
  std::span<const int32_t> qo_indptr;  // [S + 1] host: sequence s owns rows [qo[s], qo[s + 1])
  std::span<const Tensor> states;      // [S] [Hv, k_dim, v_dim] f32 contiguous, updated in place
  SeqDeviceArrays device;              // instead of qo_indptr and states (CUDA only)
  float scale = 0.f;                   // of the l2-normalized q (0: k_dim^-0.5)
  DeltaRuleForm form = DeltaRuleForm::kChunked;
  RecurrentKernel recurrent_kernel = RecurrentKernel::kColumnSplit;  // CUDA, kRecurrent
  int64_t chunk_size = 64;
};
void gated_delta_rule(const GatedDeltaRuleArgs& a);
void gated_delta_rule_cpu(const GatedDeltaRuleArgs& a);
void gated_delta_rule_cuda(const GatedDeltaRuleArgs& a);

struct CausalConv1dArgs {
  Tensor x;       // [T, C], rows strided, last dim contiguous
  Tensor weight;  // [C, K] f32 contiguous (a depthwise Conv1d's [C, 1, K] weight, viewed)
  Tensor out;     // [T, C], not overlapping x
  std::span<const int32_t> qo_indptr;  // [S + 1] host
  std::span<const Tensor> states;      // [S] [K - 1, C] f32 contiguous, updated in place
  SeqDeviceArrays device;              // instead of qo_indptr and states (CUDA only)
  bool silu = true;                    // silu after the conv (Qwen3-Next), else none
};
void causal_conv1d(const CausalConv1dArgs& a);
void causal_conv1d_cpu(const CausalConv1dArgs& a);
void causal_conv1d_cuda(const CausalConv1dArgs& a);

// Qwen3NextGatedDeltaNet's per-head gates from in_proj_ba's halves b, a [T, Hv] (rows strided):
//   beta = sigmoid(b);  g = a_neg * softplus(a + dt_bias)
// with a_neg = -exp(A_log) and dt_bias [Hv] f32; g, beta [T, Hv] f32 contiguous.
void delta_rule_gates(const Tensor& b, const Tensor& a, const Tensor& a_neg, const Tensor& dt_bias,
                      const Tensor& g, const Tensor& beta);
void delta_rule_gates_cpu(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                          const Tensor& dt_bias, const Tensor& g, const Tensor& beta);
void delta_rule_gates_cuda(const Tensor& b, const Tensor& a, const Tensor& a_neg,
                           const Tensor& dt_bias, const Tensor& g, const Tensor& beta);

// Qwen3NextRMSNormGated over each row of x [rows, d] (f32): the plain RMSNorm (weight not
// zero-centred), then times silu(z): out = x / sqrt(mean(x^2) + eps) * weight * silu(z).
// weight f32.
// z, out [rows, d] (rows strided, last dim contiguous); out may be x.
void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                    const Tensor& out);
void rms_norm_gated_cpu(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                        const Tensor& out);
void rms_norm_gated_cuda(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                         const Tensor& out);

}  // namespace longctx::ops
