#include <cmath>
#include <numbers>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/op_utils.h"
#include "ops/rope.h"

namespace longctx::ops {

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim) {
  LONGCTX_CHECK(head_dim > 0 && head_dim % 2 == 0, ErrorCode::kInvalidArgument,
                "rope: head_dim must be positive and even, got {}", head_dim);
  const int64_t half = head_dim / 2;
  // _compute_default_rope_parameters:
  //   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
  // every step a float32 tensor op (the power rounded once to float32).
  std::vector<float> inv_freq(half);
  const float base = static_cast<float>(rope.theta);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power = static_cast<float>(std::pow(double(base), double(exponent)));
    inv_freq[i] = 1.0f / power;
  }
  switch (rope.type) {
    case RopeType::kDefault:
      return inv_freq;
    case RopeType::kLinear: {
      // _compute_linear_scaling_rope_parameters: inv_freq /= factor
      const float factor = static_cast<float>(rope.factor);
      for (float& f : inv_freq) f /= factor;
      return inv_freq;
    }
    case RopeType::kLlama3: {
      // _compute_llama3_parameters, op by op in float32. Python scalars meet float32 tensors,
      // so they are rounded to float32 first; `scalar / tensor` is tensor.reciprocal() * scalar.
      const float factor = static_cast<float>(rope.factor);
      const float low_freq_factor = static_cast<float>(rope.low_freq_factor);
      const float high_freq_factor = static_cast<float>(rope.high_freq_factor);
      const double old_context_len = static_cast<double>(rope.original_max_position_embeddings);
      const float low_freq_wavelen = static_cast<float>(old_context_len / rope.low_freq_factor);
      const float high_freq_wavelen = static_cast<float>(old_context_len / rope.high_freq_factor);
      const float two_pi = static_cast<float>(2 * std::numbers::pi);
      const float old_len_f = static_cast<float>(old_context_len);
      for (float& f : inv_freq) {
        const float wavelen = (1.0f / f) * two_pi;
        // wavelen > low_freq_wavelen: divide by factor; wavelen < high_freq_wavelen: keep.
        const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const float smooth = ((1.0f / wavelen) * old_len_f - low_freq_factor) /
                               (high_freq_factor - low_freq_factor);
          f = (1.0f - smooth) * scaled / factor + smooth * scaled;
        } else {
          f = scaled;
        }
      }
      return inv_freq;
    }
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "rope: unknown rope type {}", int(rope.type));
}

std::vector<float> rope_inv_freq_as_transformers(const RopeConfig& rope, int64_t head_dim,
                                                 DType model_dtype) {
  std::vector<float> inv_freq = rope_inv_freq(rope, head_dim);
  if (model_dtype == DType::kBF16)
    for (float& f : inv_freq) f = bf16_to_f32(f32_to_bf16(f));
  else if (model_dtype == DType::kF16)
    for (float& f : inv_freq) f = f16_to_f32(f32_to_f16(f));
  return inv_freq;
}

RopeParams rope_params(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  constexpr const char* kOp = "rope";
  check_contiguous(kOp, "positions", positions);
  check_contiguous(kOp, "inv_freq", inv_freq);
  check_float_activation(kOp, "x", x);
  check_dtype(kOp, "positions", positions, DType::kI64);
  check_dtype(kOp, "inv_freq", inv_freq, DType::kF32);
  check_rank(kOp, "x", x, 3);
  RopeParams p;
  p.n = x.size(0);
  p.heads = x.size(1);
  p.head_dim = x.size(2);
  LONGCTX_CHECK(p.head_dim % 2 == 0, ErrorCode::kInvalidArgument, "rope: odd head_dim in {}",
                x.str());
  check_shape(kOp, "positions", positions, {p.n});
  check_shape(kOp, "inv_freq", inv_freq, {p.head_dim / 2});
  p.x = rows_view(kOp, "x", x);
  p.positions = static_cast<const int64_t*>(positions.data_ptr());
  p.inv_freq = static_cast<const float*>(inv_freq.data_ptr());
  p.device = common_device(kOp, {&x, &positions, &inv_freq});
  return p;
}

void rope_cpu(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  const RopeParams p = rope_params(x, positions, inv_freq);
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument, "rope_cpu: tensors are on {}",
                p.device.str());
  const int64_t heads = p.heads, d = p.head_dim, half = d / 2;
  const int64_t* pos = p.positions;
  const float* inv = p.inv_freq;
  parallel_for(
      p.n,
      [&](int64_t b, int64_t e) {
        std::vector<float> cos_t(half), sin_t(half), buf(d), rotated(d);
        for (int64_t t = b; t < e; ++t) {
          // freqs = inv_freq @ position in float32 (one rounded product), as transformers does.
          const float pf = static_cast<float>(pos[t]);
          for (int64_t i = 0; i < half; ++i) {
            const float angle = pf * inv[i];
            cos_t[i] = static_cast<float>(std::cos(double(angle)));
            sin_t[i] = static_cast<float>(std::sin(double(angle)));
          }
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t row = t * heads + h;
            const float* src = load_row_f32(p.x, row, buf.data());
            float* v = rotated.data();
            for (int64_t i = 0; i < half; ++i) {
              const float x1 = src[i], x2 = src[i + half];
              v[i] = x1 * cos_t[i] + (-x2) * sin_t[i];
              v[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
            }
            store_row_f32(p.x, row, v);
          }
        }
      },
      8);
}

}  // namespace longctx::ops
