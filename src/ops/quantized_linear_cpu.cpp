// The CPU twin of the quantized Linear: the loader's dequantize (f32, one product per weight),
// then the dense CPU linear. Also the format checks both twins share.
#include <algorithm>

#include "loader/quantized_weights.h"
#include "ops/linear.h"
#include "ops/op_utils.h"
#include "ops/quantized_linear.h"

namespace longctx::ops {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

int64_t quantized_linear_workspace_bytes(int64_t n, const QuantizedWeight& w, DType x_dtype,
                                         QuantizedLinearPath path) {
  const bool gemv = path == QuantizedLinearPath::kGemv ||
                    (path == QuantizedLinearPath::kAuto && n <= kQuantizedGemvMaxRows);
  const int64_t partials =
      kQuantizedMaxSplits * std::clamp<int64_t>(n, 1, kQuantizedGemvPassRows) * w.out_features * 4;
  const int64_t scratch = w.out_features * w.in_features * int64_t(dtype_size(x_dtype));
  // kAuto may fall back to the dequantizing path for a shape the GEMV does not take.
  return path == QuantizedLinearPath::kAuto && gemv ? std::max(partials, scratch)
         : gemv                                     ? partials
                                                    : scratch;
}

void quantized_linear_cpu(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                          const Tensor& bias, const Tensor& out) {
  constexpr const char* kOp = "quantized_linear";
  check_quantized_weight(kOp, w, q);
  check_dtype(kOp, "x", x, DType::kF32);
  check_rank(kOp, "x", x, 2);
  LONGCTX_CHECK(x.size(1) == w.in_features, ErrorCode::kInvalidArgument,
                "{}: x {} does not match the weight's in_features {}", kOp, x.str(), w.in_features);
  for (const Tensor* t : {&w.qweight, &w.scales, &w.qzeros})
    LONGCTX_CHECK(!t->defined() || t->device().is_cpu(), ErrorCode::kInvalidArgument,
                  "quantized_linear_cpu: packed tensor {} is on {}", t->str(), t->device().str());
  // dequantize reads f32 bits of every float dtype; the dense op checks x, bias and out.
  linear_cpu(x, dequantize(w, q, DType::kF32), bias, out);
}

}  // namespace longctx::ops
