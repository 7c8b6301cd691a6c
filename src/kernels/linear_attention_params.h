// Raw-pointer descriptions of the linear-attention kernels (Qwen3-Next's Gated DeltaNet), shared
// by the CPU reference (kernels/cpu/linear_attention_cpu.cpp) and a CUDA twin. A batch holds
// sequences at different positions: each sequence's rows are [qo_indptr[s], qo_indptr[s + 1])
// and each has its own state, continued in place (a prefill chunk starts from the state the
// previous chunk left; a decode row from the previous step's).
#pragma once

#include <cstdint>

#include "longctx/core/dtype.h"

namespace longctx::kernels {

// The gated delta rule, per value head h of a sequence (key head h / (Hv / Hk), as transformers'
// repeat_interleave), over l2-normalized q and k (q then scaled by `scale`):
//   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
// with S [k_dim, v_dim] fp32. q, k, v and out hold `dtype` elements (f32 for the CPU reference;
// f32, bf16 or f16 for the CUDA kernels, which convert in registers); g, beta and the states are
// fp32. The head dim of each tensor is contiguous.
struct GatedDeltaRuleParams {
  const void* q = nullptr;      // [T, Hk, k_dim]
  const void* k = nullptr;      // [T, Hk, k_dim]
  const void* v = nullptr;      // [T, Hv, v_dim]
  const float* g = nullptr;     // [T, Hv] log decay (<= 0)
  const float* beta = nullptr;  // [T, Hv] write strength in (0, 1)
  void* out = nullptr;          // [T, Hv, v_dim]
  DType dtype = DType::kF32;    // of q, k, v, out
  // Elements between tokens (t) and heads (h) of each tensor.
  int64_t q_stride_t = 0, q_stride_h = 0;
  int64_t k_stride_t = 0, k_stride_h = 0;
  int64_t v_stride_t = 0, v_stride_h = 0;
  int64_t g_stride_t = 0, beta_stride_t = 0;
  int64_t out_stride_t = 0, out_stride_h = 0;
  // Host arrays for the CPU reference, device arrays for the CUDA kernels.
  const int32_t* qo_indptr = nullptr;  // [num_seqs + 1]
  int64_t num_seqs = 0;
  float* const* states = nullptr;  // [num_seqs] -> [Hv, k_dim, v_dim] each, read and updated
  int64_t num_k_heads = 0, num_v_heads = 0, k_dim = 0, v_dim = 0;
  float scale = 1.f;         // of q, after its l2 norm (transformers: k_dim^-0.5)
  float l2norm_eps = 1e-6f;  // x / sqrt(sum x^2 + eps), as fla's l2norm
  int64_t chunk_size = 64;   // the chunked form's chunk (WY representation within it)
};

// Depthwise causal conv1d over each sequence's rows, continuing from its state (the last
// kernel - 1 inputs before the rows, oldest first; zeros for a fresh sequence):
//   out[t, c] = act(sum_j weight[c, j] x[t - (kernel - 1) + j, c])
// then the state holds the last kernel - 1 inputs. A decode step is one row per sequence.
// x and out hold `dtype` elements (f32 for the CPU reference; f32, bf16 or f16 for CUDA); the
// weight and the states are fp32, and so is the sum.
struct CausalConv1dParams {
  const void* x = nullptr;  // [T, channels]
  int64_t x_stride_t = 0;
  const float* weight = nullptr;  // [channels, kernel] contiguous
  void* out = nullptr;            // [T, channels] (may not overlap x)
  int64_t out_stride_t = 0;
  DType dtype = DType::kF32;  // of x and out
  // Host arrays for the CPU reference, device arrays for the CUDA kernels.
  const int32_t* qo_indptr = nullptr;  // [num_seqs + 1]
  int64_t num_seqs = 0;
  float* const* states = nullptr;  // [num_seqs] -> [kernel - 1, channels] each
  int64_t channels = 0, kernel = 0;
  bool silu = true;  // act = silu (Qwen3-Next), else identity
};

}  // namespace longctx::kernels
