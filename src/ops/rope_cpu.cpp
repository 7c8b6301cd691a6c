#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "longctx/core/parallel.h"
#include "ops/op_utils.h"
#include "ops/rope.h"

namespace longctx::ops {

namespace {

using namespace rope_math;

// The rotary dim of every transformers initializer: int(head_dim * partial_rotary_factor).
int64_t rotary_dim_of(const RopeConfig& rope, int64_t head_dim) {
  LONGCTX_CHECK(head_dim > 0 && head_dim % 2 == 0, ErrorCode::kInvalidArgument,
                "rope: head_dim must be positive and even, got {}", head_dim);
  const int64_t dim = static_cast<int64_t>(double(head_dim) * rope.partial_rotary_factor);
  LONGCTX_CHECK(dim >= 2 && dim % 2 == 0 && dim <= head_dim, ErrorCode::kInvalidArgument,
                "rope: partial_rotary_factor {} gives rotary_dim {} of head_dim {} (must be even, "
                "in [2, head_dim])",
                rope.partial_rotary_factor, dim, head_dim);
  return dim;
}

// _compute_default_rope_parameters over `dim` from a Python-float base:
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
// every step a float32 tensor op (the base rounded to float32 as it meets the tensor).
std::vector<float> default_table(double base, int64_t dim) {
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) inv[i] = default_inv_freq(static_cast<float>(base), i, dim);
  return inv;
}

// _compute_llama3_parameters, op by op in float32. Python scalars meet float32 tensors, so they
// are rounded to float32 first; `scalar / tensor` is tensor.reciprocal() * scalar.
void llama3_scale(const RopeConfig& rope, std::vector<float>& inv_freq) {
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
      const float smooth =
          ((1.0f / wavelen) * old_len_f - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = (1.0f - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
}

// _compute_yarn_parameters (dim = rotary dim, base = rope_theta, both Python numbers):
//   pos_freqs = base ** (arange(0, dim, 2).float() / dim)               float32
//   inv_freq_extrapolation = 1.0 / pos_freqs                             float32
//   inv_freq_interpolation = 1.0 / (factor * pos_freqs)                  float32
//   find_correction_dim(r) = dim * log(orig / (r * 2 pi)) / (2 log(base))  Python float
//   low = find_correction_dim(beta_fast), high = find_correction_dim(beta_slow); with truncate
//   floor(low), ceil(high); then max(low, 0), min(high, dim - 1)          Python numbers
//   ramp = clamp((arange(dim // 2).float() - low) / (high - low), 0, 1)   float32 (high += 0.001
//   when low == high)
//   extrapolation_factor = 1 - ramp                                       float32
//   inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
// so dims before `low` (many rotations over the original context) keep their frequency, dims
// past `high` are interpolated (divided by factor), and the ramp blends those between.
std::vector<float> yarn_table(const RopeConfig& rope, int64_t dim) {
  const double base = rope.theta;
  const float factor = static_cast<float>(rope.factor);
  const double orig = static_cast<double>(rope.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (double(dim) * std::log(orig / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor: prevent the singularity
  const float low_f = static_cast<float>(low);
  const float span_f = static_cast<float>(high - low);
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq = pow_f32(static_cast<float>(base), div(float(2 * i), float(dim)));
    const float extrapolation = div(1.0f, pos_freq);
    const float interpolation = div(1.0f, mul(factor, pos_freq));
    const float ramp = std::clamp(div(sub(float(i), low_f), span_f), 0.0f, 1.0f);
    const float extrapolation_factor = sub(1.0f, ramp);
    const float a = mul(interpolation, sub(1.0f, extrapolation_factor));
    const float b = mul(extrapolation, extrapolation_factor);
    inv[i] = a + b;
  }
  return inv;
}

// _compute_longrope_parameters for one list of ext_factors (short or long):
//   inv_freq = 1.0 / (ext_factors * base ** (arange(0, dim, 2).float() / dim))   float32
// with ext_factors = torch.tensor(list, dtype=float32).
std::vector<float> longrope_table(const RopeConfig& rope, int64_t dim,
                                  const std::vector<double>& ext_factors) {
  LONGCTX_CHECK(int64_t(ext_factors.size()) == dim / 2, ErrorCode::kInvalidArgument,
                "rope: longrope factor lists need rotary_dim / 2 = {} entries, got {}", dim / 2,
                ext_factors.size());
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq = pow_f32(static_cast<float>(rope.theta), div(float(2 * i), float(dim)));
    inv[i] = div(1.0f, mul(static_cast<float>(ext_factors[i]), pos_freq));
  }
  return inv;
}

// yarn's get_mscale: 0.1 * mscale * log(scale) + 1.0 for scale > 1, else 1 (Python floats).
double get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

double rope_attention_scaling(const RopeConfig& rope) {
  switch (rope.type) {
    case RopeType::kYarn:
      // attention_factor when given; else get_mscale(factor, mscale) /
      // get_mscale(factor, mscale_all_dim) when both are set (DeepSeek: equal, so 1), else
      // get_mscale(factor) = 0.1 ln(factor) + 1.
      if (!std::isnan(rope.attention_factor)) return rope.attention_factor;
      if (rope.mscale != 0 && rope.mscale_all_dim != 0)
        return get_mscale(rope.factor, rope.mscale) / get_mscale(rope.factor, rope.mscale_all_dim);
      return get_mscale(rope.factor, 1.0);
    case RopeType::kLongrope:
      // attention_factor when given; else sqrt(1 + log(factor) / log(original)) for factor > 1.
      if (!std::isnan(rope.attention_factor)) return rope.attention_factor;
      if (rope.factor <= 1.0) return 1.0;
      return std::sqrt(1 + std::log(rope.factor) /
                               std::log(double(rope.original_max_position_embeddings)));
    default:
      return 1.0;
  }
}

RopeFrequencies rope_frequencies(const RopeConfig& rope, int64_t head_dim) {
  RopeFrequencies f;
  const int64_t dim = rotary_dim_of(rope, head_dim);
  f.rotary_dim = dim;
  f.attention_scaling = static_cast<float>(rope_attention_scaling(rope));
  switch (rope.type) {
    case RopeType::kDefault:
      f.inv_freq = default_table(rope.theta, dim);
      return f;
    case RopeType::kLinear: {
      // _compute_linear_scaling_rope_parameters: inv_freq /= factor
      f.inv_freq = default_table(rope.theta, dim);
      const float factor = static_cast<float>(rope.factor);
      for (float& v : f.inv_freq) v /= factor;
      return f;
    }
    case RopeType::kLlama3:
      f.inv_freq = default_table(rope.theta, dim);
      llama3_scale(rope, f.inv_freq);
      return f;
    case RopeType::kYarn:
      f.inv_freq = yarn_table(rope, dim);
      return f;
    case RopeType::kLongrope: {
      // The init buffer holds the short factors (seq_len None); longrope_frequency_update swaps
      // in the long ones (computed with seq_len = original + 1) for a forward whose
      // max(position_ids) + 1 exceeds original_max_position_embeddings.
      f.select = RopeSelect::kLongrope;
      f.switch_len = rope.original_max_position_embeddings;
      f.inv_freq = longrope_table(rope, dim, rope.short_factor);
      std::vector<float> long_table = longrope_table(rope, dim, rope.long_factor);
      f.inv_freq.insert(f.inv_freq.end(), long_table.begin(), long_table.end());
      return f;
    }
    case RopeType::kDynamic: {
      LONGCTX_CHECK(dim > 2, ErrorCode::kInvalidArgument,
                    "rope: dynamic NTK needs a rotary dim above 2 (dim / (dim - 2)), got {}", dim);
      // dynamic_frequency_update recomputes for a forward whose max(position_ids) + 1 exceeds
      // max_position_embeddings; the init buffer is _compute_dynamic_ntk_parameters at
      // seq_len = max_position_embeddings, a Python int, so that base is computed in double:
      //   base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2)).
      f.select = RopeSelect::kDynamic;
      f.switch_len = rope.max_position_embeddings;
      f.ntk = {rope.theta, rope.factor, rope.max_position_embeddings, dim};
      const double max_pos = double(rope.max_position_embeddings);
      const double grown = (rope.factor * max_pos / max_pos) - (rope.factor - 1);
      f.inv_freq = default_table(rope.theta * std::pow(grown, double(dim) / double(dim - 2)), dim);
      return f;
    }
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, "rope: unknown rope type {}", int(rope.type));
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim) {
  RopeFrequencies f = rope_frequencies(rope, head_dim);
  f.inv_freq.resize(f.rotary_dim / 2);
  return f.inv_freq;
}

std::vector<float> rope_dynamic_inv_freq(const RopeFrequencies& f, int64_t seq_len) {
  const int64_t half = f.rotary_dim / 2;
  std::vector<float> inv(f.inv_freq.begin(), f.inv_freq.begin() + half);
  if (f.select != RopeSelect::kDynamic || seq_len <= f.switch_len) return inv;
  const float base = dynamic_ntk_base(f.ntk, seq_len);
  for (int64_t i = 0; i < half; ++i) inv[i] = default_inv_freq(base, i, f.rotary_dim);
  return inv;
}

RopeFrequencies rope_frequencies_as_transformers(const RopeConfig& rope, int64_t head_dim,
                                                 DType model_dtype) {
  RopeFrequencies f = rope_frequencies(rope, head_dim);
  const int64_t half = f.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float& v = f.inv_freq[i];
    if (model_dtype == DType::kBF16)
      v = bf16_to_f32(f32_to_bf16(v));
    else if (model_dtype == DType::kF16)
      v = f16_to_f32(f32_to_f16(v));
  }
  return f;
}

std::vector<float> rope_inv_freq_as_transformers(const RopeConfig& rope, int64_t head_dim,
                                                 DType model_dtype) {
  RopeFrequencies f = rope_frequencies_as_transformers(rope, head_dim, model_dtype);
  f.inv_freq.resize(f.rotary_dim / 2);
  return f.inv_freq;
}

RopeArgs rope_args(const RopeFrequencies& f, const Tensor& inv_freq, const Tensor& lens) {
  RopeArgs a;
  a.inv_freq = inv_freq;
  a.lens = lens;
  a.rotary_dim = f.rotary_dim;
  a.attention_scaling = f.attention_scaling;
  a.select = f.select;
  a.switch_len = f.switch_len;
  a.ntk = f.ntk;
  return a;
}

RopeParams rope_params(const Tensor& x, const Tensor& positions, const RopeArgs& args) {
  constexpr const char* kOp = "rope";
  const Tensor& inv_freq = args.inv_freq;
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
  p.rotary_dim = args.rotary_dim == 0 ? p.head_dim : args.rotary_dim;
  LONGCTX_CHECK(p.rotary_dim >= 2 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim,
                ErrorCode::kInvalidArgument,
                "rope: rotary_dim {} must be even and in [2, head_dim {}]", p.rotary_dim,
                p.head_dim);
  const int64_t half = p.rotary_dim / 2;
  const int64_t tables = args.select == RopeSelect::kLongrope ? 2 : 1;
  check_shape(kOp, "positions", positions, {p.n});
  if (inv_freq.rank() == 1)
    check_shape(kOp, "inv_freq", inv_freq, {tables * half});
  else
    check_shape(kOp, "inv_freq", inv_freq, {tables, half});
  if (args.lens.defined()) {
    check_contiguous(kOp, "lens", args.lens);
    check_dtype(kOp, "lens", args.lens, DType::kI64);
    check_shape(kOp, "lens", args.lens, {p.n});
    p.lens = static_cast<const int64_t*>(args.lens.data_ptr());
  }
  if (args.select == RopeSelect::kDynamic)
    LONGCTX_CHECK(args.ntk.dim == p.rotary_dim && args.ntk.max_position_embeddings > 0,
                  ErrorCode::kInvalidArgument,
                  "rope: dynamic NTK of dim {} / max_position_embeddings {} for rotary_dim {}",
                  args.ntk.dim, args.ntk.max_position_embeddings, p.rotary_dim);
  LONGCTX_CHECK(std::isfinite(args.attention_scaling), ErrorCode::kInvalidArgument,
                "rope: attention_scaling {} is not finite", args.attention_scaling);
  p.x = rows_view(kOp, "x", x);
  p.positions = static_cast<const int64_t*>(positions.data_ptr());
  p.inv_freq = static_cast<const float*>(inv_freq.data_ptr());
  p.attention_scaling = args.attention_scaling;
  p.select = args.select;
  p.switch_len = args.switch_len;
  p.ntk = args.ntk;
  p.device = common_device(kOp, {&x, &positions, &inv_freq, &args.lens});
  return p;
}

void rope_cpu(const Tensor& x, const Tensor& positions, const RopeArgs& args) {
  const RopeParams p = rope_params(x, positions, args);
  LONGCTX_CHECK(p.device.is_cpu(), ErrorCode::kInvalidArgument, "rope_cpu: tensors are on {}",
                p.device.str());
  const int64_t heads = p.heads, d = p.head_dim, rd = p.rotary_dim, half = rd / 2;
  const int64_t* pos = p.positions;
  const float scaling = p.attention_scaling;
  parallel_for(
      p.n,
      [&](int64_t b, int64_t e) {
        std::vector<float> cos_t(half), sin_t(half), buf(d), rotated(d), dynamic(half);
        int64_t dynamic_len = -1;  // the len `dynamic` holds (tokens of a sequence share it)
        for (int64_t t = b; t < e; ++t) {
          const int row = rope_row(p, t);
          const float* inv = p.inv_freq + std::max(row, 0) * half;
          if (row < 0) {
            const int64_t len = p.lens ? p.lens[t] : pos[t] + 1;
            if (len != dynamic_len) {
              const float base = dynamic_ntk_base(p.ntk, len);
              for (int64_t i = 0; i < half; ++i) dynamic[i] = default_inv_freq(base, i, rd);
              dynamic_len = len;
            }
            inv = dynamic.data();
          }
          // freqs = inv_freq @ position in float32 (one rounded product), as transformers does;
          // cos = emb.cos() * attention_scaling in float32.
          const float pf = static_cast<float>(pos[t]);
          for (int64_t i = 0; i < half; ++i) {
            const float angle = pf * inv[i];
            cos_t[i] = static_cast<float>(std::cos(double(angle))) * scaling;
            sin_t[i] = static_cast<float>(std::sin(double(angle))) * scaling;
          }
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t row_index = t * heads + h;
            const float* src = load_row_f32(p.x, row_index, buf.data());
            float* v = rotated.data();
            for (int64_t i = 0; i < half; ++i) {
              const float x1 = src[i], x2 = src[i + half];
              v[i] = x1 * cos_t[i] + (-x2) * sin_t[i];
              v[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
            }
            std::copy(src + rd, src + d, v + rd);  // the pass-through dims of a partial rotary
            store_row_f32(p.x, row_index, v);
          }
        }
      },
      8);
}

void rope_cpu(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  RopeArgs a;
  a.inv_freq = inv_freq;
  rope_cpu(x, positions, a);
}

}  // namespace longctx::ops
