// The CPU twin of the quantized Linear: the loader's dequantize (f32, one product per weight),
// then the dense CPU linear (W8A16), or the W8A8 product the CUDA twin's FP8 GEMM computes. Also
// the format checks and the path planning both twins share.
#include <algorithm>
#include <vector>

#include "core/ceil_div.h"
#include "kernels/cpu/fp8_act_quant_cpu.h"
#include "kernels/fp8_act_quant.h"
#include "loader/quantized_weights.h"
#include "longctx/core/parallel.h"
#include "ops/linear.h"
#include "ops/op_utils.h"
#include "ops/quantized_linear.h"

namespace longctx::ops {

namespace {

void expect(const char* op, const Tensor& t, const char* name, const Shape& shape, bool dtype_ok,
            const char* dtypes, const std::string& why) {
  LONGCTX_CHECK(t.defined(), ErrorCode::kInvalidArgument, "{}: {} is missing ({} {}: {})", op, name,
                dtypes, shape_to_string(shape), why);
  LONGCTX_CHECK(t.shape() == shape, ErrorCode::kInvalidArgument,
                "{}: {} has shape {}, expected {} ({})", op, name, t.shape_str(),
                shape_to_string(shape), why);
  LONGCTX_CHECK(dtype_ok, ErrorCode::kInvalidArgument, "{}: {} is {}, expected {}", op, name,
                dtype_name(t.dtype()), dtypes);
  LONGCTX_CHECK(t.is_contiguous(), ErrorCode::kInvalidArgument, "{}: {} {} must be contiguous", op,
                name, t.str());
}

}  // namespace

void check_quantized_weight(const char* op, const QuantizedWeight& w, const QuantConfig& q) {
  LONGCTX_CHECK(w.method != QuantMethod::kNone && w.method == q.method, ErrorCode::kInvalidArgument,
                "{}: the weight is quantized as '{}' but the config says '{}'", op,
                quant_method_name(w.method), quant_method_name(q.method));
  const int64_t out = w.out_features, in = w.in_features;
  LONGCTX_CHECK(out > 0 && in > 0, ErrorCode::kInvalidArgument,
                "{}: out_features {} and in_features {} must be positive", op, out, in);
  switch (w.method) {
    case QuantMethod::kFp8Block:
    case QuantMethod::kCompressedFp8: {
      expect(op, w.qweight, "weight", {out, in},
             w.qweight.defined() && w.qweight.dtype() == DType::kFP8E4M3, "F8_E4M3", "[out, in]");
      const bool float_scale = is_float_dtype(w.scales.defined() ? w.scales.dtype() : DType::kU8);
      if (w.method == QuantMethod::kFp8Block) {
        LONGCTX_CHECK(q.block_out > 0 && q.block_in > 0, ErrorCode::kInvalidArgument,
                      "{}: weight_block_size [{}, {}] must be positive", op, q.block_out,
                      q.block_in);
        expect(op, w.scales, "weight_scale_inv",
               {ceil_div(out, q.block_out), ceil_div(in, q.block_in)}, float_scale, "f32/bf16/f16",
               LONGCTX_FORMAT("one scale per {}x{} block of [{}, {}]", q.block_out, q.block_in, out,
                              in));
      } else if (q.fp8_strategy == Fp8ScaleStrategy::kChannel) {
        expect(op, w.scales, "weight_scale", {out, 1}, float_scale, "f32/bf16/f16",
               "strategy channel: one scale per output channel");
      } else {
        LONGCTX_CHECK(
            w.scales.defined() && w.scales.numel() == 1 && w.scales.rank() <= 1 && float_scale,
            ErrorCode::kInvalidArgument,
            "{}: weight_scale is {}, expected one f32/bf16/f16 scale, [1] or [] "
            "(strategy tensor)",
            op, w.scales.defined() ? w.scales.str() : "missing");
      }
      return;
    }
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      const int64_t g = q.group_of(in);
      LONGCTX_CHECK(g > 0 && in % g == 0, ErrorCode::kInvalidArgument,
                    "{}: group_size {} does not divide in_features {}", op, g, in);
      LONGCTX_CHECK(out % 8 == 0 && in % 8 == 0, ErrorCode::kInvalidArgument,
                    "{}: [{}, {}] int4 weight: out_features and in_features must be multiples "
                    "of 8 (eight 4-bit values per int32)",
                    op, out, in);
      const bool awq = w.method == QuantMethod::kAwq;
      expect(op, w.qweight, "qweight", awq ? Shape{in, out / 8} : Shape{in / 8, out},
             w.qweight.defined() && w.qweight.dtype() == DType::kI32, "I32",
             awq ? "[in, out/8] for AWQ" : "[in/8, out] for GPTQ");
      expect(op, w.qzeros, "qzeros", {in / g, out / 8},
             w.qzeros.defined() && w.qzeros.dtype() == DType::kI32, "I32",
             LONGCTX_FORMAT("[in/group_size, out/8] with group_size {}", g));
      expect(op, w.scales, "scales", {in / g, out},
             w.scales.defined() && is_float_dtype(w.scales.dtype()), "f32/bf16/f16",
             LONGCTX_FORMAT("[in/group_size, out] with group_size {}", g));
      return;
    }
    case QuantMethod::kNone:
      break;
  }
  LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: no quantization method", op);
}

std::string w8a8_format_refusal(const QuantizedWeight& w, const QuantConfig& q) {
  if (w.method == QuantMethod::kFp8Block) {
    if (q.block_out != kernels::kFp8ActGroup || q.block_in != kernels::kFp8ActGroup)
      return LONGCTX_FORMAT("FP8 blocks {}x{} (cuBLASLt's block scales are 128x128)", q.block_out,
                            q.block_in);
  } else if (w.method != QuantMethod::kCompressedFp8) {
    return LONGCTX_FORMAT("{} weights are not FP8", quant_method_name(w.method));
  }
  if (w.in_features % 16 != 0 || w.out_features % 16 != 0)
    return LONGCTX_FORMAT("[{}, {}] not multiples of 16 (FP8 GEMM rows of 16 bytes)",
                          w.out_features, w.in_features);
  return "";
}

QuantizedLinearSchedule quantized_linear_schedule(const QuantizedLinearProblem& p,
                                                  const QuantizedWeight& w, const QuantConfig& q) {
  using P = QuantizedLinearPath;
  QuantizedLinearSchedule s;
  if (p.requested == P::kAuto && p.n <= kQuantizedGemvMaxRows && p.gemv_refusal.empty()) {
    // Decode: nothing to format (this runs per Linear per step).
    s.path = P::kGemv;
    s.w8a8_refusal = "the GEMV runs it";
    return s;
  }
  s.w8a8_refusal = w8a8_format_refusal(w, q);
  if (s.w8a8_refusal.empty() && p.sm != 90)
    s.w8a8_refusal =
        p.sm == 0
            ? "not a CUDA device"
            : LONGCTX_FORMAT("sm_{} (cuBLASLt's FP8 block and vector scales are sm_90's)", p.sm);
  if (s.w8a8_refusal.empty() && p.x_dtype != DType::kBF16 && p.x_dtype != DType::kF16)
    s.w8a8_refusal = LONGCTX_FORMAT("{} x (bf16 or f16 only)", dtype_name(p.x_dtype));
  if (s.w8a8_refusal.empty() && p.out_dtype != DType::kF32 && p.out_dtype != p.x_dtype)
    s.w8a8_refusal = LONGCTX_FORMAT("{} out", dtype_name(p.out_dtype));
  if (s.w8a8_refusal.empty() && !p.out_aligned16)
    s.w8a8_refusal = "out rows not 16-byte aligned (the FP8 GEMM's D)";
  switch (p.requested) {
    case P::kGemv:
      LONGCTX_CHECK(p.gemv_refusal.empty(), ErrorCode::kUnsupported,
                    "quantized_linear: the {} GEMV cannot run n = {}, [{}, {}]: {}",
                    quant_method_name(w.method), p.n, w.out_features, w.in_features,
                    p.gemv_refusal);
      s.path = P::kGemv;
      break;
    case P::kW8a8:
      LONGCTX_CHECK(s.w8a8_refusal.empty(), ErrorCode::kUnsupported,
                    "quantized_linear: W8A8 cannot run n = {}, [{}, {}]: {}", p.n, w.out_features,
                    w.in_features, s.w8a8_refusal);
      s.path = P::kW8a8;
      break;
    case P::kDequantGemm:
      s.path = P::kDequantGemm;
      break;
    case P::kAuto:
      s.path = p.n <= kQuantizedGemvMaxRows && p.gemv_refusal.empty() ? P::kGemv
               : s.w8a8_refusal.empty()                               ? P::kW8a8
                                                                      : P::kDequantGemm;
      break;
  }
  if (s.path != P::kW8a8 && s.w8a8_refusal.empty())
    s.w8a8_refusal = p.requested == P::kAuto ? "the GEMV runs it" : "another path was requested";
  return s;
}

W8a8Layout w8a8_layout(int64_t rows, const QuantizedWeight& w) {
  auto align = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t in = w.in_features, out = w.out_features;
  const bool block = w.method == QuantMethod::kFp8Block;
  const int64_t groups = block ? ceil_div(in, kernels::kFp8ActGroup) : 1;
  // BLK128x128_32F: K-major, the row stride (between the blocks of consecutive 128 outputs)
  // rounded up to 4 blocks.
  const int64_t weight_scales =
      block ? ceil_div(out, kernels::kFp8ActGroup) * (ceil_div(groups, 4) * 4) : out;
  W8a8Layout l;
  l.rows = rows;
  l.codes = 0;
  l.act_scales = align(rows * in);
  l.weight_scales = l.act_scales + align(groups * rows * 4);
  l.tail_out = l.weight_scales + align(weight_scales * 4);
  l.bytes = l.tail_out + align(kW8a8RowMultiple * out * 4);
  return l;
}

int64_t w8a8_chunk_rows(int64_t n, const QuantizedWeight& w, int64_t workspace_bytes) {
  auto round = [](int64_t r) {
    return r >= 128 ? r / 128 * 128 : r / kW8a8RowMultiple * kW8a8RowMultiple;
  };
  const int64_t want = std::max<int64_t>(
      kW8a8RowMultiple,
      ceil_div(std::min(n, kW8a8MaxChunkRows), kW8a8RowMultiple) * kW8a8RowMultiple);
  if (workspace_bytes <= 0) return want;
  if (w8a8_layout(want, w).bytes <= workspace_bytes) return want;
  // Past its fixed part the layout grows by at least in + 4 * groups bytes per row (alignment
  // adds more): an upper bound on the rows that fit, which the loop below brings down.
  const int64_t fixed = w8a8_layout(0, w).bytes;
  const int64_t per_row = w.in_features + 4 * ceil_div(w.in_features, kernels::kFp8ActGroup);
  int64_t rows = round(std::min(want, std::max<int64_t>(0, (workspace_bytes - fixed) / per_row)));
  while (rows > 0 && w8a8_layout(rows, w).bytes > workspace_bytes)
    rows = round(rows - (rows > 128 ? 128 : kW8a8RowMultiple));
  return rows;
}

int64_t quantized_linear_workspace_bytes(int64_t n, const QuantizedWeight& w, DType x_dtype,
                                         QuantizedLinearPath path) {
  using P = QuantizedLinearPath;
  const bool gemv = path == P::kGemv || (path == P::kAuto && n <= kQuantizedGemvMaxRows);
  const int64_t partials =
      kQuantizedMaxSplits * std::clamp<int64_t>(n, 1, kQuantizedGemvPassRows) * w.out_features * 4;
  const int64_t scratch = w.out_features * w.in_features * int64_t(dtype_size(x_dtype));
  const bool fp8 = w.method == QuantMethod::kFp8Block || w.method == QuantMethod::kCompressedFp8;
  const int64_t w8a8 = fp8 ? w8a8_layout(w8a8_chunk_rows(n, w, 0), w).bytes : 0;
  switch (path) {
    case P::kGemv:
      return partials;
    case P::kDequantGemm:
      return scratch;
    case P::kW8a8:
      return w8a8;
    case P::kAuto:
      break;
  }
  // kAuto may fall back to the dequantizing path for a shape the GEMV or W8A8 does not take.
  return std::max({gemv ? partials : 0, scratch, w8a8});
}

namespace {

// The W8A8 product (the header's kW8a8): x's codes and scales from the shared quantization, the
// weight's codes decoded exactly, per group the exact products summed in fp32, times the two
// scales, the groups added in fp32.
void w8a8_cpu(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q, const Tensor& bias,
              const Tensor& out) {
  constexpr const char* kOp = "quantized_linear";
  check_dtype(kOp, "out", out, DType::kF32);
  check_rank(kOp, "out", out, 2);
  const int64_t n = x.size(0), in = w.in_features, outf = w.out_features;
  check_shape(kOp, "out", out, {n, outf});
  const RowsView xv = rows_view(kOp, "x", x), ov = rows_view(kOp, "out", out);
  const int64_t ldx = n > 1 ? xv.stride_outer : in, ldo = n > 1 ? ov.stride_outer : outf;
  LONGCTX_CHECK(ldx >= in && ldo >= outf, ErrorCode::kInvalidArgument,
                "{}: row strides of x {} ({}) and out {} ({}) must be at least their widths", kOp,
                x.str(), ldx, out.str(), ldo);
  std::vector<float> b;
  if (bias.defined()) {
    check_contiguous(kOp, "bias", bias);
    check_shape(kOp, "bias", bias, {outf});
    b.resize(outf);
    convert_to_f32(bias.data_ptr(), bias.dtype(), outf, b.data());
  }
  if (n == 0) return;
  const bool block = w.method == QuantMethod::kFp8Block;
  const int64_t group = block ? kernels::kFp8ActGroup : in, groups = ceil_div(in, group);
  std::vector<uint8_t> xq(size_t(n * in));
  std::vector<float> xs(size_t(n * groups)), xf(size_t(n * in)), wf(size_t(outf * in));
  kernels::fp8_quantize_rows_cpu(x.data<float>(), n, in, ldx, group, xq.data(), xs.data());
  for (size_t i = 0; i < xq.size(); ++i) xf[i] = fp8e4m3_to_f32(xq[i]);
  const uint8_t* wq = static_cast<const uint8_t*>(w.qweight.data_ptr());
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = fp8e4m3_to_f32(wq[i]);
  std::vector<float> ws(size_t(w.scales.numel()));
  convert_to_f32(w.scales.data_ptr(), w.scales.dtype(), w.scales.numel(), ws.data());
  const int64_t scale_cols = ceil_div(in, kernels::kFp8ActGroup);
  const bool channel = q.fp8_strategy == Fp8ScaleStrategy::kChannel;
  float* os = out.data<float>();
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t o = 0; o < outf; ++o) {
        const float* xr = xf.data() + j * in;
        const float* wr = wf.data() + o * in;
        float acc = 0.f;
        for (int64_t g = 0; g < groups; ++g) {
          float part = 0.f;
          for (int64_t k = g * group; k < std::min(in, (g + 1) * group); ++k) part += xr[k] * wr[k];
          const float sw = block     ? ws[(o / kernels::kFp8ActGroup) * scale_cols + g]
                           : channel ? ws[o]
                                     : ws[0];
          acc += part * (xs[j * groups + g] * sw);
        }
        os[j * ldo + o] = acc + (b.empty() ? 0.f : b[o]);
      }
  });
}

}  // namespace

void quantized_linear_cpu(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                          const Tensor& bias, const Tensor& out, QuantizedLinearPath path) {
  constexpr const char* kOp = "quantized_linear";
  check_quantized_weight(kOp, w, q);
  check_dtype(kOp, "x", x, DType::kF32);
  check_rank(kOp, "x", x, 2);
  LONGCTX_CHECK(x.size(1) == w.in_features, ErrorCode::kInvalidArgument,
                "{}: x {} does not match the weight's in_features {}", kOp, x.str(), w.in_features);
  for (const Tensor* t : {&w.qweight, &w.scales, &w.qzeros})
    LONGCTX_CHECK(!t->defined() || t->device().is_cpu(), ErrorCode::kInvalidArgument,
                  "quantized_linear_cpu: packed tensor {} is on {}", t->str(), t->device().str());
  if (path == QuantizedLinearPath::kW8a8) {
    const std::string why = w8a8_format_refusal(w, q);
    LONGCTX_CHECK(why.empty(), ErrorCode::kUnsupported, "{}: W8A8 cannot run [{}, {}]: {}", kOp,
                  w.out_features, w.in_features, why);
    return w8a8_cpu(x, w, q, bias, out);
  }
  // dequantize reads f32 bits of every float dtype; the dense op checks x, bias and out.
  linear_cpu(x, dequantize(w, q, DType::kF32), bias, out);
}

}  // namespace longctx::ops
