// Rotary position embedding, non-interleaved ("rotate_half") convention of transformers:
//   out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[d/2:], x[:d/2]),
//   cos/sin = cos/sin(cat(freqs, freqs)) * attention_scaling,
//   freqs[i] = float(position) * inv_freq[i]  (float32).
// inv_freq comes from rope_frequencies(), which follows transformers' rope initializers exactly.
// With a partial rotary factor only the first rotary_dim dims of each head rotate (d above is
// rotary_dim) and the rest pass through, as transformers' apply_rotary_pos_emb with
// `q[..., :rotary_dim]` / `q[..., rotary_dim:]` (Phi-3, Phi-4-mini, GLM, Qwen3-Next).
//
// Both twins compute cos/sin per (token, i) from the exact float32 angle, the CPU in double then
// rounded, CUDA with full-precision sincosf (not __sinf; within 2 ulp of those), multiply them by
// attention_scaling in float32 (`emb.cos() * self.attention_scaling`: exact for 1.0), and combine
// with separately rounded products and sum as the tensor ops do (no fused multiply-add). There
// is no precomputed cos/sin table: at 1M positions x 64 frequencies a float32 cos + sin table is
// 512 MB, and the in-kernel sincosf of the same float32 angles gives the same values (torch on a
// GPU evaluates cos/sin of that angle with the same libdevice functions).
//
// Frequencies that depend on the sequence (longrope's short/long lists, dynamic NTK's base) are
// chosen per token from its `len`: the length of the token's sequence at the end of the step
// (its largest position in the step + 1). transformers chooses once per forward call from
// max(position_ids) + 1; longctx's step holds several sequences, so it chooses per sequence,
// which is that call for a batch of one (see docs/architecture.md, "RoPE variants"). Keys
// already in the KV keep the rotation of the step that wrote them, as transformers' cache does.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/model_config.h"
#include "ops/op_params.h"
#include "ops/rope_math.h"

namespace longctx::ops {

// How a token's frequencies are chosen.
enum class RopeSelect : int32_t {
  kFixed,     // inv_freq row 0 for every token
  kLongrope,  // row 0 (short_factor) up to switch_len, row 1 (long_factor) past it
  kDynamic,   // row 0 up to switch_len; past it recomputed from the token's len (dynamic NTK)
};

// A model's rope, resolved once from its RopeConfig and head_dim on the host.
struct RopeFrequencies {
  int64_t rotary_dim = 0;          // the first rotary_dim dims of a head rotate
  float attention_scaling = 1.0f;  // multiplies cos and sin (yarn's mscale, longrope's factor)
  RopeSelect select = RopeSelect::kFixed;
  int64_t switch_len =
      0;           // longrope: original_max_position_embeddings; dynamic: max_position_embeddings
  DynamicNtk ntk;  // dynamic only
  std::vector<float> inv_freq;  // [tables, rotary_dim / 2]: 1 table, 2 for longrope (short, long)
  int64_t tables() const { return select == RopeSelect::kLongrope ? 2 : 1; }
};

// The rope of `rope` for heads of head_dim, every float32 step as transformers' initializers
// (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters, _compute_yarn_parameters, _compute_longrope_parameters,
// _compute_dynamic_ntk_parameters) take it. Throws Error(kInvalidArgument) for an odd head_dim
// or rotary dim, or longrope lists of the wrong length.
RopeFrequencies rope_frequencies(const RopeConfig& rope, int64_t head_dim);

// Row 0 of rope_frequencies(rope, head_dim).inv_freq [rotary_dim / 2]: the frequencies of a
// sequence within the original context.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim);

// The attention scaling of `rope` (1 unless yarn or longrope), as transformers' initializers
// return it: a Python float; the ops round it to float32 where it meets cos and sin.
double rope_attention_scaling(const RopeConfig& rope);

// Dynamic NTK's frequencies [rotary_dim / 2] for a sequence of seq_len tokens (> the switch
// length; row 0 otherwise), as the dynamic update of transformers recomputes them.
std::vector<float> rope_dynamic_inv_freq(const RopeFrequencies& f, int64_t seq_len);

// rope_inv_freq() as a transformers model loaded in `model_dtype` holds it: inv_freq is a module
// buffer, so loading a bf16/f16 checkpoint at its dtype rounds it to that dtype (the rotary
// embedding upcasts it back to float32 before use). This rounding moves logits visibly at long
// positions; see ModelBuildOptions::rope_inv_freq_dtype. kF32 gives rope_inv_freq() unchanged.
std::vector<float> rope_inv_freq_as_transformers(const RopeConfig& rope, int64_t head_dim,
                                                 DType model_dtype);
// rope_frequencies() with that rounding applied where transformers applies it: to row 0 only
// (the buffer made at init); longrope's long table and dynamic NTK's recomputed frequencies are
// made at forward time in float32 and never cast.
RopeFrequencies rope_frequencies_as_transformers(const RopeConfig& rope, int64_t head_dim,
                                                 DType model_dtype);

// The op's inputs besides x and positions. The defaults are plain RoPE over the whole head.
struct RopeArgs {
  Tensor inv_freq;  // [tables, rotary_dim / 2] or [rotary_dim / 2] f32
  Tensor lens;      // [n] i64: each token's sequence length in the step; undefined: position + 1
  int64_t rotary_dim = 0;  // 0: head_dim
  float attention_scaling = 1.0f;
  RopeSelect select = RopeSelect::kFixed;
  int64_t switch_len = 0;
  DynamicNtk ntk;
};
// The arguments for frequencies `f` whose table `inv_freq` is on the op's device.
RopeArgs rope_args(const RopeFrequencies& f, const Tensor& inv_freq, const Tensor& lens = {});

// In place. x: [n, heads, head_dim] f32/bf16/f16 with any strides but a contiguous last dim
// (q and k are views into the fused qkv GEMM output); positions: [n] i64; inv_freq:
// [head_dim / 2] f32 (or as RopeArgs says); all on one device (for CUDA, inv_freq, positions and
// lens are device memory). CUDA takes head_dim <= 1024.
void rope(const Tensor& x, const Tensor& positions, const RopeArgs& args);
void rope_cpu(const Tensor& x, const Tensor& positions, const RopeArgs& args);
void rope_cuda(const Tensor& x, const Tensor& positions, const RopeArgs& args);
// Plain RoPE over the whole head with one inv_freq [head_dim / 2].
void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);
void rope_cpu(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);
void rope_cuda(const Tensor& x, const Tensor& positions, const Tensor& inv_freq);

struct RopeParams {
  RowsView x;  // [n * heads, head_dim]: token t, head h is row t * heads + h (x.inner = heads)
  int64_t n = 0, heads = 0, head_dim = 0;
  int64_t rotary_dim = 0;              // even, <= head_dim
  const int64_t* positions = nullptr;  // [n]
  const int64_t* lens = nullptr;       // [n] or null (position + 1)
  const float* inv_freq = nullptr;     // [tables, rotary_dim / 2]
  float attention_scaling = 1.0f;
  RopeSelect select = RopeSelect::kFixed;
  int64_t switch_len = 0;
  DynamicNtk ntk;
  Device device;
};
RopeParams rope_params(const Tensor& x, const Tensor& positions, const RopeArgs& args);

// The table row token t reads: 0, or 1 for a longrope token past the switch; -1 for a dynamic
// token past it (frequencies recomputed from len).
LONGCTX_HD_INLINE int rope_row(const RopeParams& p, int64_t t) {
  if (p.select == RopeSelect::kFixed) return 0;
  const int64_t len = p.lens ? p.lens[t] : p.positions[t] + 1;
  if (len <= p.switch_len) return 0;
  return p.select == RopeSelect::kLongrope ? 1 : -1;
}

}  // namespace longctx::ops
