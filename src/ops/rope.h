// Rotary position embedding, non-interleaved ("rotate_half") convention of transformers:
//   out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[d/2:], x[:d/2]),
//   cos/sin = cos/sin(cat(freqs, freqs)),  freqs[i] = float(position) * inv_freq[i]  (float32).
// inv_freq comes from rope_inv_freq(), which follows transformers' rope initializers exactly.
//
// Both twins compute cos/sin per (token, i) from the exact float32 angle, the CPU in double then
// rounded, CUDA with full-precision sincosf (not __sinf; within 2 ulp of those), and combine with
// separately rounded products and sum as the tensor ops do (no fused multiply-add). There is no
// precomputed cos/sin table: at 1M positions x 64 frequencies a float32 cos + sin table is
// 512 MB, and the in-kernel sincosf of the same float32 angles gives the same values (torch on a
// GPU evaluates cos/sin of that angle with the same libdevice functions).
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/model_config.h"
#include "ops/op_params.h"

namespace longctx::ops {

// The rope frequencies [head_dim / 2] in float32, computed with the float32 operations of
// transformers' _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters and
// _compute_llama3_parameters. Throws Error(kInvalidArgument) for an odd head_dim.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim);

// rope_inv_freq() as a transformers model loaded in `model_dtype` holds it: inv_freq is a module
// buffer, so loading a bf16/f16 checkpoint at its dtype rounds it to that dtype (the rotary
// embedding upcasts it back to float32 before use). This rounding moves logits visibly at long
// positions; see ModelBuildOptions::rope_inv_freq_dtype. kF32 gives rope_inv_freq() unchanged.
std::vector<float> rope_inv_freq_as_transformers(const RopeConfig& rope, int64_t head_dim,
                                                 DType model_dtype);

// In place. x: [n, heads, head_dim] f32/bf16/f16 with any strides but a contiguous last dim
// (q and k are views into the fused qkv GEMM output); positions: [n] i64; inv_freq:
// [head_dim / 2] f32; all on one device (for CUDA, inv_freq and positions are device memory).
// CUDA takes head_dim <= 1024.
void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);
void rope_cpu(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);
void rope_cuda(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);

struct RopeParams {
  RowsView x;  // [n * heads, head_dim]: token t, head h is row t * heads + h (x.inner = heads)
  int64_t n = 0, heads = 0, head_dim = 0;
  const int64_t* positions = nullptr;  // [n]
  const float* inv_freq = nullptr;     // [head_dim / 2]
  Device device;
};
RopeParams rope_params(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);

}  // namespace longctx::ops
