#include "loader/quantized_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <set>

#include "core/ceil_div.h"
#include "longctx/core/error.h"
#include "longctx/core/parallel.h"

namespace longctx {

namespace {

// AWQ's GEMM layout puts output column 8p + kAwqOrder[k] in nibble k of word p ...
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
// ... so column 8p + c sits in nibble kAwqNibble[c].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

bool is_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

uint32_t word(const Tensor& t, int64_t i) { return std::bit_cast<uint32_t>(t.data<int32_t>()[i]); }

// The f32 [rows, cols] buffer's contents in `dtype`.
Tensor to_output(Tensor f32, DType dtype) {
  return dtype == DType::kF32 ? f32 : f32.to_dtype(dtype);
}

void expect_tensor(const Tensor& t, const std::string& name, const Shape& shape,
                   bool (*dtype_ok)(DType), const char* dtypes, const std::string& why,
                   const std::string& where) {
  LONGCTX_CHECK(t.defined(), ErrorCode::kInvalidArgument,
                "{}: tensor '{}' is missing ({} {} expected: {})", where, name, dtypes,
                shape_to_string(shape), why);
  LONGCTX_CHECK(t.shape() == shape, ErrorCode::kInvalidArgument,
                "{}: tensor '{}' has shape {}, expected {} ({})", where, name, t.shape_str(),
                shape_to_string(shape), why);
  LONGCTX_CHECK(dtype_ok(t.dtype()), ErrorCode::kInvalidArgument,
                "{}: tensor '{}' is {}, expected {}", where, name, dtype_name(t.dtype()), dtypes);
}

bool is_i32(DType d) { return d == DType::kI32; }
bool is_fp8(DType d) { return d == DType::kFP8E4M3; }

// Checks the packed tensors of `w` against the format (shapes, dtypes, group size, g_idx).
void validate(const QuantizedWeight& w, const QuantConfig& q, const std::string& module,
              const std::string& where) {
  const int64_t out = w.out_features, in = w.in_features;
  switch (w.method) {
    case QuantMethod::kFp8Block:
      expect_tensor(w.qweight, module + ".weight", {out, in}, is_fp8, "F8_E4M3", "[out, in]",
                    where);
      expect_tensor(
          w.scales, module + ".weight_scale_inv",
          {ceil_div(out, q.block_out), ceil_div(in, q.block_in)}, is_float, "float",
          fmt::format("one scale per {}x{} block of [{}, {}]", q.block_out, q.block_in, out, in),
          where);
      return;
    case QuantMethod::kCompressedFp8: {
      expect_tensor(w.qweight, module + ".weight", {out, in}, is_fp8, "F8_E4M3", "[out, in]",
                    where);
      const std::string name = module + ".weight_scale";
      if (q.fp8_strategy == Fp8ScaleStrategy::kChannel) {
        expect_tensor(w.scales, name, {out, 1}, is_float, "float",
                      "strategy channel: one scale per output channel, [out, 1]", where);
      } else {
        LONGCTX_CHECK(w.scales.defined() && w.scales.numel() == 1 && w.scales.rank() <= 1,
                      ErrorCode::kInvalidArgument,
                      "{}: tensor '{}' has shape {}, expected [1] or [] (strategy tensor)", where,
                      name, w.scales.defined() ? w.scales.shape_str() : "(missing)");
        expect_tensor(w.scales, name, w.scales.shape(), is_float, "float", "", where);
      }
      return;
    }
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      const int64_t g = q.group_of(in);
      LONGCTX_CHECK(in % g == 0, ErrorCode::kInvalidArgument,
                    "{}: '{}': group_size {} does not divide in_features {}", where, module, g, in);
      LONGCTX_CHECK(out % 8 == 0, ErrorCode::kInvalidArgument,
                    "{}: '{}': out_features {} is not a multiple of 8 (eight 4-bit zero points "
                    "per int32)",
                    where, module, out);
      const bool awq = w.method == QuantMethod::kAwq;
      const std::string fmt_name = awq ? "AWQ" : "GPTQ";
      const Shape qshape = awq ? Shape{in, out / 8} : Shape{in / 8, out};
      expect_tensor(w.qweight, module + ".qweight", qshape, is_i32, "I32",
                    awq ? "[in, out/8] for AWQ" : "[in/8, out] for GPTQ", where);
      expect_tensor(w.qzeros, module + ".qzeros", {in / g, out / 8}, is_i32, "I32",
                    fmt::format("[in/group_size, out/8] for {} with group_size {}", fmt_name, g),
                    where);
      expect_tensor(w.scales, module + ".scales", {in / g, out}, is_float, "float",
                    fmt::format("[in/group_size, out] for {} with group_size {}", fmt_name, g),
                    where);
      if (w.g_idx.defined()) {
        expect_tensor(w.g_idx, module + ".g_idx", {in}, is_i32, "I32", "[in]", where);
        const int32_t* gi = w.g_idx.data<int32_t>();
        for (int64_t i = 0; i < in; ++i)
          LONGCTX_CHECK(gi[i] == i / g, ErrorCode::kUnsupported,
                        "{}: tensor '{}.g_idx' maps input {} to group {}, not {} = {} / {}: "
                        "act-order (desc_act) checkpoints are not supported",
                        where, module, i, gi[i], i / g, i, g);
      }
      return;
    }
    case QuantMethod::kNone:
      break;
  }
  LONGCTX_THROW(ErrorCode::kInternal, "validate: no quantization method");
}

}  // namespace

Tensor dequantize(const QuantizedWeight& w, const QuantConfig& q, DType dtype) {
  const int64_t out = w.out_features, in = w.in_features;
  Tensor dense = Tensor::empty({out, in}, DType::kF32);
  float* d = dense.data<float>();
  const Tensor scales = w.scales.to_dtype(DType::kF32);
  const float* s = scales.data<float>();
  switch (w.method) {
    case QuantMethod::kFp8Block:
    case QuantMethod::kCompressedFp8: {
      const uint8_t* qw = w.qweight.data<uint8_t>();
      const bool block = w.method == QuantMethod::kFp8Block;
      const bool channel = q.fp8_strategy == Fp8ScaleStrategy::kChannel;
      const int64_t scale_cols = block ? ceil_div(in, q.block_in) : 0;
      parallel_for(out, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = 0; c < in; ++c) {
            const float scale = block     ? s[(r / q.block_out) * scale_cols + c / q.block_in]
                                : channel ? s[r]
                                          : s[0];
            d[r * in + c] = fp8e4m3_to_f32(qw[r * in + c]) * scale;
          }
      });
      break;
    }
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      const bool awq = w.method == QuantMethod::kAwq;
      const int64_t g = q.group_of(in);
      const int zero_offset = !awq && q.gptq_zero_minus_one ? 1 : 0;
      parallel_for(out, [&](int64_t o0, int64_t o1) {
        for (int64_t o = o0; o < o1; ++o)
          for (int64_t i = 0; i < in; ++i) {
            const int64_t grp = i / g;
            uint32_t qv, zv;
            if (awq) {
              qv = word(w.qweight, i * (out / 8) + o / 8) >> (4 * kAwqNibble[o % 8]);
              zv = word(w.qzeros, grp * (out / 8) + o / 8) >> (4 * kAwqNibble[o % 8]);
            } else {
              qv = word(w.qweight, (i / 8) * out + o) >> (4 * (i % 8));
              zv = word(w.qzeros, grp * (out / 8) + o / 8) >> (4 * (o % 8));
            }
            const int z = int(zv & 0xf) + zero_offset;
            d[o * in + i] = float(int(qv & 0xf) - z) * s[grp * out + o];
          }
      });
      break;
    }
    case QuantMethod::kNone:
      LONGCTX_THROW(ErrorCode::kInternal, "dequantize: no quantization method");
  }
  return to_output(dense, dtype);
}

WeightStore extract_quantized(const WeightStore& raw, const QuantConfig& q,
                              std::map<std::string, QuantizedWeight>& quantized,
                              const std::string& where) {
  const bool int4 = q.method == QuantMethod::kAwq || q.method == QuantMethod::kGptq;
  const bool fp8 = q.method == QuantMethod::kFp8Block || q.method == QuantMethod::kCompressedFp8;
  auto opt = [&](const std::string& name) { return raw.has(name) ? raw.get(name) : Tensor(); };
  std::set<std::string> consumed;
  WeightStore out;
  for (const auto& [name, t] : raw.all()) {
    std::string module;
    QuantizedWeight w;
    w.method = q.method;
    if (name.ends_with(".qweight")) {
      module = name.substr(0, name.size() - 8);
      LONGCTX_CHECK(int4, ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' is a packed int4 weight but config.json's "
                    "quantization_config is '{}' (awq or gptq expected)",
                    where, name, quant_method_name(q.method));
      LONGCTX_CHECK(t.rank() == 2, ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' has shape {}, expected a matrix", where, name, t.shape_str());
      w.qweight = t;
      w.qzeros = opt(module + ".qzeros");
      w.scales = opt(module + ".scales");
      w.g_idx = opt(module + ".g_idx");
      const bool awq = q.method == QuantMethod::kAwq;
      w.in_features = awq ? t.size(0) : t.size(0) * 8;
      w.out_features = awq ? t.size(1) * 8 : t.size(1);
      for (const char* s : {".qweight", ".qzeros", ".scales", ".g_idx"})
        consumed.insert(module + s);
    } else if (t.dtype() == DType::kFP8E4M3) {
      LONGCTX_CHECK(name.ends_with(".weight") && t.rank() == 2, ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' is F8_E4M3 {} but only Linear weights ([out, in] "
                    "'<layer>.weight') may be FP8",
                    where, name, t.shape_str());
      module = name.substr(0, name.size() - 7);
      LONGCTX_CHECK(fp8, ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' is F8_E4M3 but config.json's quantization_config is '{}' "
                    "(fp8 or compressed-tensors expected)",
                    where, name, quant_method_name(q.method));
      LONGCTX_CHECK(!q.ignores(module), ErrorCode::kInvalidArgument,
                    "{}: tensor '{}' is F8_E4M3 but quantization_config's ignore list names "
                    "layer '{}' (left unquantized)",
                    where, name, module);
      w.qweight = t;
      const char* scale_name =
          q.method == QuantMethod::kFp8Block ? ".weight_scale_inv" : ".weight_scale";
      w.scales = opt(module + scale_name);
      w.out_features = t.size(0);
      w.in_features = t.size(1);
      consumed.insert(name);
      consumed.insert(module + scale_name);
    } else {
      continue;
    }
    validate(w, q, module, where);
    quantized.emplace(module + ".weight", std::move(w));
  }
  for (const auto& [name, t] : raw.all()) {
    if (consumed.count(name)) continue;
    LONGCTX_CHECK(!quantized.count(name), ErrorCode::kInvalidArgument,
                  "{}: tensor '{}' is a dense weight beside the packed tensors of the same layer "
                  "('{}qweight'): one of them must go",
                  where, name, name.substr(0, name.size() - 6));
    out.add(name, t);
  }
  return out;
}

QuantizedWeight quantized_layout(int64_t out, int64_t in, const QuantConfig& q,
                                 const std::string& name) {
  QuantizedWeight w;
  w.method = q.method;
  w.out_features = out;
  w.in_features = in;
  switch (q.method) {
    case QuantMethod::kFp8Block:
      w.qweight = Tensor::empty({out, in}, DType::kFP8E4M3);
      w.scales = Tensor::empty({ceil_div(out, q.block_out), ceil_div(in, q.block_in)}, DType::kF32);
      return w;
    case QuantMethod::kCompressedFp8:
      w.qweight = Tensor::empty({out, in}, DType::kFP8E4M3);
      w.scales = Tensor::empty(
          q.fp8_strategy == Fp8ScaleStrategy::kChannel ? Shape{out, 1} : Shape{1}, DType::kF32);
      return w;
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      const int64_t g = q.group_of(in);
      LONGCTX_CHECK(in % g == 0 && in % 8 == 0 && out % 8 == 0, ErrorCode::kInvalidArgument,
                    "quantize: '{}' [{}, {}] does not fit {} with group_size {} (in_features a "
                    "multiple of the group size, both dimensions multiples of 8)",
                    name, out, in, quant_method_name(q.method), g);
      const bool awq = q.method == QuantMethod::kAwq;
      w.qweight = Tensor::zeros(awq ? Shape{in, out / 8} : Shape{in / 8, out}, DType::kI32);
      w.qzeros = Tensor::zeros({in / g, out / 8}, DType::kI32);
      w.scales = Tensor::empty({in / g, out}, DType::kF16);
      if (!awq) w.g_idx = Tensor::empty({in}, DType::kI32);
      return w;
    }
    case QuantMethod::kNone:
      break;
  }
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "quantize: no quantization method for '{}'", name);
}

QuantizedWeight quantize_rtn(const Tensor& weight, const QuantConfig& q, const std::string& name) {
  LONGCTX_CHECK(weight.rank() == 2 && is_float(weight.dtype()), ErrorCode::kInvalidArgument,
                "quantize: '{}' is {} {}, expected a float matrix", name,
                dtype_name(weight.dtype()), weight.shape_str());
  const int64_t out = weight.size(0), in = weight.size(1);
  QuantizedWeight w = quantized_layout(out, in, q, name);
  const Tensor wf = weight.to_dtype(DType::kF32);
  const float* src = wf.data<float>();
  switch (q.method) {
    case QuantMethod::kFp8Block:
    case QuantMethod::kCompressedFp8: {
      const bool block = q.method == QuantMethod::kFp8Block;
      const bool channel = q.fp8_strategy == Fp8ScaleStrategy::kChannel;
      // Scale tiles of W: blocks, rows, or the whole matrix.
      const int64_t bo = block ? q.block_out : channel ? 1 : out;
      const int64_t bi = block ? q.block_in : in;
      const int64_t so = ceil_div(out, bo), si = ceil_div(in, bi);
      uint8_t* qw = w.qweight.data<uint8_t>();
      float* s = w.scales.data<float>();
      for (int64_t a = 0; a < so; ++a)
        for (int64_t b = 0; b < si; ++b) {
          const int64_t r1 = std::min(out, (a + 1) * bo), c1 = std::min(in, (b + 1) * bi);
          float amax = 0;
          for (int64_t r = a * bo; r < r1; ++r)
            for (int64_t c = b * bi; c < c1; ++c) amax = std::max(amax, std::fabs(src[r * in + c]));
          const float scale = amax > 0 ? amax / 448.0f : 1.0f;
          s[a * si + b] = scale;
          for (int64_t r = a * bo; r < r1; ++r)
            for (int64_t c = b * bi; c < c1; ++c)
              qw[r * in + c] = f32_to_fp8e4m3(src[r * in + c] / scale);
        }
      return w;
    }
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      const bool awq = q.method == QuantMethod::kAwq;
      const int64_t g = q.group_of(in);
      const int64_t groups = in / g;
      std::vector<uint8_t> qv(out * in), zv(groups * out);
      std::vector<uint16_t> sv(groups * out);
      const bool sym = !awq && q.symmetric;
      const bool v1 = !awq && q.gptq_zero_minus_one;
      for (int64_t o = 0; o < out; ++o)
        for (int64_t gi = 0; gi < groups; ++gi) {
          const float* x = src + o * in + gi * g;
          // The range always holds 0, so a zero weight stays exact.
          float lo = 0, hi = 0;
          for (int64_t k = 0; k < g; ++k) lo = std::min(lo, x[k]), hi = std::max(hi, x[k]);
          float scale;
          int zero;
          if (sym) {
            scale = 2 * std::max(-lo, hi) / 15;
            zero = 8;
          } else {
            scale = (hi - lo) / 15;
            zero = scale > 0 ? int(std::nearbyint(-lo / scale)) : 0;
            // v1 stores z - 1 in four bits: z = 0 cannot be written, so such a group (no weight
            // below -scale/2) takes z = 1 and a scale that reaches its maximum with q = 15.
            if (v1 && zero < 1) scale = hi / 14, zero = 1;
          }
          // Quantize against the scale the checkpoint will hold (f16).
          uint16_t s16 = f32_to_f16(scale > 0 ? scale : 1.0f);
          if (f16_to_f32(s16) == 0) s16 = 1;  // the smallest f16 subnormal
          const float sq = f16_to_f32(s16);
          sv[gi * out + o] = s16;
          zv[gi * out + o] = uint8_t(zero);
          for (int64_t k = 0; k < g; ++k) {
            const float v = std::nearbyint(x[k] / sq) + float(zero);
            qv[o * in + gi * g + k] = uint8_t(std::clamp(v, 0.0f, 15.0f));
          }
        }
      std::copy(sv.begin(), sv.end(), w.scales.data<uint16_t>());
      uint32_t* qz = reinterpret_cast<uint32_t*>(w.qzeros.data<int32_t>());
      for (int64_t gi = 0; gi < groups; ++gi)
        for (int64_t o = 0; o < out; ++o) {
          const uint32_t z = uint32_t(zv[gi * out + o] - (v1 ? 1 : 0)) & 0xf;
          const int nibble = awq ? kAwqNibble[o % 8] : int(o % 8);
          qz[gi * (out / 8) + o / 8] |= z << (4 * nibble);
        }
      if (awq) {
        uint32_t* p = reinterpret_cast<uint32_t*>(w.qweight.data<int32_t>());
        for (int64_t i = 0; i < in; ++i)
          for (int64_t col = 0; col < out / 8; ++col)
            for (int k = 0; k < 8; ++k)
              p[i * (out / 8) + col] |= uint32_t(qv[(col * 8 + kAwqOrder[k]) * in + i]) << (4 * k);
      } else {
        uint32_t* p = reinterpret_cast<uint32_t*>(w.qweight.data<int32_t>());
        for (int64_t r = 0; r < in / 8; ++r)
          for (int64_t o = 0; o < out; ++o)
            for (int k = 0; k < 8; ++k)
              p[r * out + o] |= uint32_t(qv[o * in + r * 8 + k]) << (4 * k);
        for (int64_t i = 0; i < in; ++i) w.g_idx.data<int32_t>()[i] = int32_t(i / g);
      }
      return w;
    }
    case QuantMethod::kNone:
      break;
  }
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "quantize: no quantization method for '{}'", name);
}

namespace {

// parts[i] stacked along `dim` (every other dim equal): one host tensor.
Tensor stack_along(const std::vector<Tensor>& parts, int64_t dim) {
  Shape shape = parts[0].shape();
  shape[dim] = 0;
  for (const Tensor& t : parts) shape[dim] += t.size(dim);
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    out.slice(dim, at, at + t.size(dim)).copy_from(t);
    at += t.size(dim);
  }
  return out;
}

}  // namespace

Fp8Experts fuse_fp8_experts(const std::vector<QuantizedWeight>& gate,
                            const std::vector<QuantizedWeight>& up,
                            const std::vector<QuantizedWeight>& down, const QuantConfig& q,
                            const std::string& layer) {
  const int64_t e = static_cast<int64_t>(gate.size());
  LONGCTX_CHECK(e > 0 && up.size() == gate.size() && down.size() == gate.size(),
                ErrorCode::kInvalidArgument,
                "{}: fuse_fp8_experts needs as many gate ({}), up ({}) and down ({}) experts, > 0",
                layer, gate.size(), up.size(), down.size());
  LONGCTX_CHECK(q.method == QuantMethod::kFp8Block, ErrorCode::kInvalidArgument,
                "{}: fuse_fp8_experts takes fp8 block experts, not {}", layer,
                quant_method_name(q.method));
  const int64_t mi = gate[0].out_features, h = gate[0].in_features;
  const int64_t gate_blocks = ceil_div(mi, q.block_out);
  Fp8Experts f;
  f.gate_up = Tensor::empty({e, 2 * mi, h}, DType::kFP8E4M3);
  f.gate_up_scales = Tensor::empty({e, 2 * gate_blocks, ceil_div(h, q.block_in)}, DType::kF32);
  f.down = Tensor::empty({e, h, mi}, DType::kFP8E4M3);
  f.down_scales =
      Tensor::empty({e, ceil_div(h, q.block_out), ceil_div(mi, q.block_in)}, DType::kF32);
  // Copies w (checked: method, [out, in], its scales' shape) into expert x's part of `codes` and
  // `scales` at element offsets.
  auto put = [&](const QuantizedWeight& w, const char* proj, int64_t x, int64_t out, int64_t in,
                 const Tensor& codes, int64_t code0, const Tensor& scales, int64_t scale0) {
    const std::string name = fmt::format("{}mlp.experts.{}.{}", layer, x, proj);
    LONGCTX_CHECK(w.method == QuantMethod::kFp8Block, ErrorCode::kInvalidArgument,
                  "{}: is {}, expected fp8 block like every expert", name,
                  quant_method_name(w.method));
    validate(w, q, name, layer);
    LONGCTX_CHECK(w.out_features == out && w.in_features == in, ErrorCode::kInvalidArgument,
                  "{}: is [{}, {}], expected [{}, {}] as expert 0's", name, w.out_features,
                  w.in_features, out, in);
    const Tensor c = w.qweight.contiguous();
    std::memcpy(codes.data<uint8_t>() + code0, c.data_ptr(), c.nbytes());
    const Tensor s = w.scales.to_dtype(DType::kF32).contiguous();
    std::memcpy(scales.data<float>() + scale0, s.data_ptr(), s.nbytes());
  };
  const int64_t gu_scales = f.gate_up_scales.numel() / e, dn_scales = f.down_scales.numel() / e;
  for (int64_t x = 0; x < e; ++x) {
    put(gate[x], "gate_proj", x, mi, h, f.gate_up, x * 2 * mi * h, f.gate_up_scales, x * gu_scales);
    put(up[x], "up_proj", x, mi, h, f.gate_up, (x * 2 + 1) * mi * h, f.gate_up_scales,
        x * gu_scales + gu_scales / 2);
    put(down[x], "down_proj", x, h, mi, f.down, x * h * mi, f.down_scales, x * dn_scales);
  }
  return f;
}

QuantizedWeight stack_quantized(const std::vector<QuantizedWeight>& parts, const QuantConfig& q) {
  LONGCTX_CHECK(!parts.empty(), ErrorCode::kInvalidArgument, "stack_quantized: no parts");
  if (parts.size() == 1) return parts[0];
  QuantizedWeight none;
  const QuantizedWeight& first = parts[0];
  for (size_t i = 0; i < parts.size(); ++i) {
    const QuantizedWeight& p = parts[i];
    LONGCTX_CHECK(p.method == first.method && p.in_features == first.in_features,
                  ErrorCode::kInvalidArgument,
                  "stack_quantized: part {} is {} [{}, {}], part 0 {} [{}, {}]", i,
                  quant_method_name(p.method), p.out_features, p.in_features,
                  quant_method_name(first.method), first.out_features, first.in_features);
    const bool last = i + 1 == parts.size();
    switch (p.method) {
      case QuantMethod::kAwq:
      case QuantMethod::kGptq:
        if (p.out_features % 8 != 0) return none;
        break;
      case QuantMethod::kFp8Block:
        if (!last && p.out_features % q.block_out != 0) return none;
        break;
      case QuantMethod::kCompressedFp8:
        if (q.fp8_strategy != Fp8ScaleStrategy::kChannel) return none;
        break;
      case QuantMethod::kNone:
        return none;
    }
  }
  auto field = [&](Tensor QuantizedWeight::*f) {
    std::vector<Tensor> ts;
    for (const QuantizedWeight& p : parts) ts.push_back(p.*f);
    return ts;
  };
  QuantizedWeight w;
  w.method = first.method;
  w.in_features = first.in_features;
  for (const QuantizedWeight& p : parts) w.out_features += p.out_features;
  const bool int4 = w.method == QuantMethod::kAwq || w.method == QuantMethod::kGptq;
  // int4 tensors keep out along dim 1 ([rows, out] or [rows, out / 8]); FP8 along dim 0.
  const int64_t dim = int4 ? 1 : 0;
  w.qweight = stack_along(field(&QuantizedWeight::qweight), dim);
  w.scales = stack_along(field(&QuantizedWeight::scales), dim);
  if (int4) w.qzeros = stack_along(field(&QuantizedWeight::qzeros), 1);
  if (first.g_idx.defined()) {
    for (const QuantizedWeight& p : parts)
      if (!p.g_idx.defined() || p.g_idx.nbytes() != first.g_idx.nbytes() ||
          std::memcmp(p.g_idx.data_ptr(), first.g_idx.data_ptr(), first.g_idx.nbytes()) != 0)
        return none;
    w.g_idx = first.g_idx;
  }
  return w;
}

QuantizedWeight slice_quantized(const QuantizedWeight& w, const QuantConfig& q, int64_t row0,
                                int64_t rows) {
  LONGCTX_CHECK(row0 >= 0 && rows > 0 && row0 + rows <= w.out_features, ErrorCode::kInvalidArgument,
                "slice_quantized: rows [{}, {}) of a [{}, {}] weight", row0, row0 + rows,
                w.out_features, w.in_features);
  if (row0 == 0 && rows == w.out_features) return w;
  QuantizedWeight none, s = w;
  s.out_features = rows;
  const int64_t end = row0 + rows;
  switch (w.method) {
    case QuantMethod::kFp8Block: {
      const int64_t bo = q.block_out;
      if (row0 % bo != 0 || (end % bo != 0 && end != w.out_features)) return none;
      s.qweight = w.qweight.slice(0, row0, end);
      s.scales = w.scales.slice(0, row0 / bo, ceil_div(end, bo));
      return s;
    }
    case QuantMethod::kCompressedFp8:
      s.qweight = w.qweight.slice(0, row0, end);
      // One scale per tensor applies to any rows of it.
      if (q.fp8_strategy == Fp8ScaleStrategy::kChannel) s.scales = w.scales.slice(0, row0, end);
      return s;
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      if (row0 % 8 != 0 || rows % 8 != 0) return none;
      // Output features run along dim 1 (whole int32 words of 8 for qzeros and AWQ's qweight).
      const bool awq = w.method == QuantMethod::kAwq;
      s.qweight = (awq ? w.qweight.slice(1, row0 / 8, end / 8) : w.qweight.slice(1, row0, end))
                      .contiguous();
      s.qzeros = w.qzeros.slice(1, row0 / 8, end / 8).contiguous();
      s.scales = w.scales.slice(1, row0, end).contiguous();
      return s;
    }
    case QuantMethod::kNone:
      break;
  }
  return none;
}

int64_t quantized_bytes(const QuantizedWeight& w) {
  int64_t n = 0;
  for (const Tensor* t : {&w.qweight, &w.scales, &w.qzeros, &w.g_idx})
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  return n;
}

int64_t quantized_bytes(int64_t out, int64_t in, const QuantConfig& q) {
  switch (q.method) {
    case QuantMethod::kFp8Block:
      return out * in + ceil_div(out, q.block_out) * ceil_div(in, q.block_in) * 4;
    case QuantMethod::kCompressedFp8:
      return out * in + (q.fp8_strategy == Fp8ScaleStrategy::kChannel ? out : 1) * 4;
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      const int64_t groups = in / q.group_of(in);
      return out * in / 2 + groups * out / 2 + groups * out * 2 +
             (q.method == QuantMethod::kGptq ? in * 4 : 0);
    }
    case QuantMethod::kNone:
      break;
  }
  return 0;
}

std::vector<std::pair<std::string, Tensor>> quantized_tensors(const std::string& module,
                                                              const QuantizedWeight& w) {
  switch (w.method) {
    case QuantMethod::kFp8Block:
      return {{module + ".weight", w.qweight}, {module + ".weight_scale_inv", w.scales}};
    case QuantMethod::kCompressedFp8:
      return {{module + ".weight", w.qweight}, {module + ".weight_scale", w.scales}};
    case QuantMethod::kAwq:
      return {{module + ".qweight", w.qweight},
              {module + ".qzeros", w.qzeros},
              {module + ".scales", w.scales}};
    case QuantMethod::kGptq:
      return {{module + ".qweight", w.qweight},
              {module + ".qzeros", w.qzeros},
              {module + ".scales", w.scales},
              {module + ".g_idx", w.g_idx}};
    case QuantMethod::kNone:
      break;
  }
  return {};
}

}  // namespace longctx
