// The quantized decode GEMVs' schedule (kernels/quantized_gemv_params.h): host code, no CUDA.
#include <algorithm>

#include "core/ceil_div.h"
#include "kernels/quantized_gemv_params.h"
#include "longctx/core/error.h"

namespace longctx::kernels {

namespace {

// CTAs the int4 kernels' split aims for per SM by default (a few resident at once hide each
// other's prologue and tail).
constexpr int64_t kInt4CtasPerSm = 4;
// The SIMT int4 kernels stage their K slice of x in shared memory: at most this many inputs.
constexpr int64_t kSimtSliceK = 1024;
// Outputs per CTA of the kMma kernels (4 warps, each all of the tile's outputs over a quarter of
// the CTA's K slice), and the inputs of one warp step (GPTQ: 4 words of 8 inputs per output;
// AWQ: 16 rows).
constexpr int64_t kMmaTile = 128;
constexpr int64_t kMmaStepGptq = 32, kMmaStepAwq = 16;

std::string mma_refusal(const QuantizedGemvProblem& p) {
  if (p.format != QuantizedGemvFormat::kGptq && p.format != QuantizedGemvFormat::kAwq)
    return "the mma GEMV takes int4 formats only";
  if (p.in % 32 != 0 || p.group % 32 != 0)
    return LONGCTX_FORMAT("in {} or group {} not a multiple of 32", p.in, p.group);
  if (!p.x_aligned16) return "x rows not 16-byte aligned";
  if (!p.qweight_aligned16) return "qweight not 16-byte aligned";
  if (p.format == QuantizedGemvFormat::kAwq && p.out % 16 != 0)
    return LONGCTX_FORMAT("AWQ out {} not a multiple of 16", p.out);
  return "";
}

std::string async_refusal(const QuantizedGemvProblem& p) {
  std::string r = mma_refusal(p);
  if (!r.empty()) return r;
  if (p.scale_dtype != DType::kF16 && p.scale_dtype != DType::kBF16)
    return LONGCTX_FORMAT("{} scales (16-bit only)", dtype_name(p.scale_dtype));
  if (!p.params_aligned) return "scales not 16-byte or qzeros not 8-byte aligned";
  return "";
}

std::string simt_refusal(const QuantizedGemvProblem& p) {
  if (!p.qweight_aligned16) return "qweight not 16-byte aligned";
  switch (p.format) {
    case QuantizedGemvFormat::kGptq:
      if (p.group % 8 != 0)
        return LONGCTX_FORMAT("GPTQ group size {} not a multiple of 8", p.group);
      return "";
    case QuantizedGemvFormat::kAwq:
      return "";
    default:
      if (p.in % 16 != 0) return LONGCTX_FORMAT("in_features {} not a multiple of 16", p.in);
      if (p.format == QuantizedGemvFormat::kFp8Block && p.block_in % 16 != 0)
        return LONGCTX_FORMAT("block width {} not a multiple of 16 (a chunk's one scale)",
                              p.block_in);
      if (!p.x_aligned16) return "x rows not 16-byte aligned";
      return "";
  }
}

// Splits of K so that col_tiles x splits reaches ctas_per_sm CTAs per SM (or p.splits), each
// slice a multiple of `unit`.
void split_k(const QuantizedGemvProblem& p, int64_t ctas_per_sm, int64_t unit, int64_t min_splits,
             int64_t max_splits, QuantizedGemvSchedule& s) {
  s.col_tiles = ceil_div(p.out, s.tile);
  const int64_t target =
      (p.ctas_per_sm > 0 ? p.ctas_per_sm : ctas_per_sm) * std::max(p.sm_count, 1);
  const int64_t want = p.splits > 0 ? p.splits : ceil_div(target, s.col_tiles);
  const int64_t splits = std::max(min_splits, std::min(max_splits, want));
  s.k_per_split = ceil_div(ceil_div(p.in, splits), unit) * unit;
  s.splits = ceil_div(p.in, s.k_per_split);
  if (s.splits > kQuantizedGemvMaxSplits)
    s.refusal = LONGCTX_FORMAT("in_features {} needs {} K slices (at most {})", p.in, s.splits,
                               kQuantizedGemvMaxSplits);
  else if (s.col_tiles > 0x7fffffff)
    s.refusal = "too many output tiles";
  if (s.splits == 1) return;
  const bool fits = s.col_tiles <= kQuantizedGemvMaxTileCounters;
  if (p.reduce == QuantizedGemvReduce::kLastCta && !fits)
    s.refusal = LONGCTX_FORMAT("{} output tiles for the last-CTA reduction (at most {})",
                               s.col_tiles, kQuantizedGemvMaxTileCounters);
  s.reduce = p.reduce == QuantizedGemvReduce::kKernel || !fits ? QuantizedGemvReduce::kKernel
                                                               : QuantizedGemvReduce::kLastCta;
}

}  // namespace

QuantizedGemvSchedule quantized_gemv_schedule(const QuantizedGemvProblem& p) {
  QuantizedGemvSchedule s;
  s.prefetch = p.prefetch;
  if (p.x_dtype != DType::kBF16 && p.x_dtype != DType::kF16) {
    s.refusal = LONGCTX_FORMAT("{} x (bf16 or f16 only)", dtype_name(p.x_dtype));
    return s;
  }
  if (p.n < 1 || p.n > kQuantizedGemvPassRows) {
    s.refusal = LONGCTX_FORMAT("n = {} outside [1, {}]", p.n, kQuantizedGemvPassRows);
    return s;
  }
  if (p.in <= 0 || p.out <= 0) {
    s.refusal = "empty weight";
    return s;
  }
  const std::string mma = mma_refusal(p), async = async_refusal(p);
  if (p.kernel == QuantizedGemvKernel::kMma && !mma.empty()) {
    s.refusal = "mma kernel: " + mma;
    return s;
  }
  if (p.kernel == QuantizedGemvKernel::kMmaAsync && !async.empty()) {
    s.refusal = "mma-async kernel: " + async;
    return s;
  }
  // kAuto, as measured on an H100 (Llama-3.1-8B shapes, n = 1, 4, 8): GPTQ at one row on the
  // CUDA-core kernel (gate_up 1658 GB/s against 1368 for kMma, down 1157 against 1058), above it
  // on kMma (n = 4: 1331 against 967; kMmaAsync 1234); AWQ on kMmaAsync (gate_up 1100 against
  // 1026 for kMma and 521 for the CUDA-core kernel).
  const bool automatic = p.kernel == QuantizedGemvKernel::kAuto;
  const bool gptq = p.format == QuantizedGemvFormat::kGptq;
  const bool simt_first = automatic && gptq && p.n == 1 && simt_refusal(p).empty();
  const bool use_async =
      !simt_first && async.empty() &&
      ((automatic && !(gptq && mma.empty())) || p.kernel == QuantizedGemvKernel::kMmaAsync);
  const bool use_mma =
      !simt_first && mma.empty() && (automatic || p.kernel == QuantizedGemvKernel::kMma);
  if (use_async || use_mma) {
    s.kernel = use_async ? QuantizedGemvKernel::kMmaAsync : QuantizedGemvKernel::kMma;
    s.tile = kMmaTile;
    split_k(p, kInt4CtasPerSm, p.format == QuantizedGemvFormat::kGptq ? kMmaStepGptq : kMmaStepAwq,
            1, kQuantizedGemvMaxSplits, s);
    s.partial_bytes = s.splits > 1 ? s.splits * p.n * p.out * 4 : 0;
    return s;
  }
  s.kernel = QuantizedGemvKernel::kSimt;
  s.refusal = simt_refusal(p);
  if (!s.refusal.empty()) return s;
  switch (p.format) {
    case QuantizedGemvFormat::kGptq:
      s.tile = 32 * 4;
      split_k(p, kInt4CtasPerSm, 8, ceil_div(p.in, kSimtSliceK), kQuantizedGemvMaxSplits, s);
      break;
    case QuantizedGemvFormat::kAwq:
      s.awq_words = p.n == 1 && p.out % 32 == 0 ? 4 : p.n <= 2 && p.out % 16 == 0 ? 2 : 1;
      s.tile = 32 * 8 * s.awq_words;
      split_k(p, kInt4CtasPerSm, 8, ceil_div(p.in, kSimtSliceK), kQuantizedGemvMaxSplits, s);
      break;
    default:
      s.tile = 8 * 2;  // 8 warps of 2 rows
      // One CTA per SM by default: a split adds the partials and the reduction kernel, which
      // measured slower than fewer CTAs on every Llama-3.1-8B shape but none (qkv at 2 splits:
      // 1778 GB/s, the unsplit bf16 GEMV 2750).
      // A forced split may go down to one 16-input chunk a slice.
      split_k(p, 1, 16, 1,
              std::max<int64_t>(
                  1, std::min(kQuantizedGemvMaxSplits, p.splits > 0 ? p.in / 16 : p.in / 1024)),
              s);
      break;
  }
  s.partial_bytes = s.splits > 1 ? s.splits * p.n * p.out * 4 : 0;
  return s;
}

std::string quantized_gemv_name(const QuantizedGemvProblem& p, const QuantizedGemvSchedule& s) {
  const char* f = p.format == QuantizedGemvFormat::kGptq       ? "gptq"
                  : p.format == QuantizedGemvFormat::kAwq      ? "awq"
                  : p.format == QuantizedGemvFormat::kFp8Block ? "fp8-block"
                                                               : "fp8-channel";
  const bool simt_awq =
      s.kernel == QuantizedGemvKernel::kSimt && p.format == QuantizedGemvFormat::kAwq;
  const char* reduce = s.reduce == QuantizedGemvReduce::kLastCta  ? " reduce last-cta"
                       : s.reduce == QuantizedGemvReduce::kKernel ? " reduce kernel"
                                                                  : "";
  return LONGCTX_FORMAT("gemv {} {} tile {} splits {} ({} inputs each){}{}{}", f,
                        s.kernel == QuantizedGemvKernel::kMma        ? "mma"
                        : s.kernel == QuantizedGemvKernel::kMmaAsync ? "mma-async"
                                                                     : "simt",
                        s.tile, s.splits, s.k_per_split,
                        simt_awq ? LONGCTX_FORMAT(" awq words {}", s.awq_words) : std::string(),
                        reduce,
                        s.prefetch == QuantizedGemvPrefetch::kAfterWait    ? " prefetch after-wait"
                        : s.prefetch == QuantizedGemvPrefetch::kBeforeWait ? " prefetch before-wait"
                                                                           : "");
}

}  // namespace longctx::kernels
