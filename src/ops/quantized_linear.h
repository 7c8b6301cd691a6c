// Linear over a quantized weight kept packed as its checkpoint stores it (QuantizedWeight, the
// layouts in include/longctx/loader/quantization.h): out = x @ W^T (+ bias), W = dequantize(w).
// Decode streams the packed bytes (a quarter of bf16's for int4, half for FP8); the CPU twin is
// the readable reference (the loader's dequantize, then the dense CPU linear).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/quantized_gemv_params.h"
#include "longctx/core/tensor.h"
#include "longctx/loader/quantization.h"

namespace longctx::ops {

// Shapes (both twins): x [n, in] (any row stride >= in, contiguous last dim); w's tensors as the
// format stores them (qweight, scales, qzeros; g_idx is not read: the loader refuses act-order
// checkpoints, so the group of input i is i / group_size), contiguous, on the op's device, with
// w.method == q.method; bias [out] f32/bf16/f16 or undefined; out [n, out] (any row stride >=
// out), not overlapping x. Formats: kAwq, kGptq (v1 z - 1 and v2, symmetric or not: the zero
// points are read from qzeros either way), kFp8Block, kCompressedFp8 (channel or tensor scales).
//
// CPU: x f32, out f32; W dequantized to f32 (one f32 product per weight, exact for int4), then
// the dense linear_cpu (sequential fp32 sums): W8A16, the reference. With path kW8a8 (FP8 formats)
// the CPU twin computes what the CUDA W8A8 GEMM computes: x quantized per token (and group) as
// kernels/fp8_act_quant.h says, then per group of 128 inputs (FP8 block) or per row (channel /
// tensor scales) the exact code products summed in fp32, times the activation's and the weight's
// scales, added in fp32.
// CUDA: x bf16, f16 or f32; out f32 or x's dtype; fp32 accumulation. For n <=
// kQuantizedGemvMaxRows, a GEMV per format reads the packed weight once per 8 rows
// (kernels/cuda/quantized_gemv.h: int4 decoded in registers to the exact (q - z), multiplied by x
// on the tensor cores or in fp32, each group's sum scaled in fp32; FP8 E4M3 -> f16 -> f32, the
// block scale per 16 inputs, a channel scale at the end), split over K across CTAs when out is
// small: each split writes fp32 partials to the workspace and one kernel adds them in split
// order (deterministic).
// Otherwise (n > 64, or a shape the GEMV does not take), for the FP8 formats on sm_90 (Hopper),
// W8A8: x is quantized to E4M3 per token (per 128-input group for the block format, per row for
// channel / tensor scales; kernels/cuda/fp8_act_quant.h) and cuBLASLt's FP8 GEMM runs on the
// packed weight with its scales (block format: weight BLK128x128_32F, x VEC128_32F; channel and
// tensor: OUTER_VEC_32F on both), fp32 accumulation (no fast accumulation), out in out's dtype,
// in chunks of rows the workspace holds (quantized_linear_schedule). Everything else (int4, other
// GPUs: cuBLASLt has these scale modes on sm_90 only, FP8 blocks other than 128x128, widths that
// are not multiples of 16) dequantizes W into a scratch [out, in] in x's dtype (one kernel, f32
// arithmetic, one rounding) and runs the dense linear_cuda (cuBLASLt) on it: W8A16. Launches on
// current_stream(device), no host sync.
void quantized_linear(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                      const Tensor& bias, const Tensor& out, const Tensor& workspace = Tensor());

// Which path runs: kAuto as described above; kGemv and kW8a8 throw Error(kUnsupported) naming
// the reason when they cannot run the arguments; kDequantGemm always dequantizes (W8A16).
enum class QuantizedLinearPath { kAuto, kGemv, kDequantGemm, kW8a8 };

// The GEMV's kernel family (kernels/quantized_gemv_params.h): kAuto (a tensor-core kernel for
// int4 where one runs, else the CUDA-core one), or one forced (tests and benchmarks compare them;
// a forced kernel that cannot run the arguments is the GEMV's refusal).
using QuantizedGemvKernel = kernels::QuantizedGemvKernel;
using QuantizedGemvReduce = kernels::QuantizedGemvReduce;
using QuantizedGemvPrefetch = kernels::QuantizedGemvPrefetch;

// The GEMV's tuning (defaults: the schedule's choice).
struct QuantizedGemvOptions {
  QuantizedGemvKernel kernel = QuantizedGemvKernel::kAuto;
  int ctas_per_sm = 0;  // the K split's target (kernels::QuantizedGemvProblem::ctas_per_sm)
  int64_t splits = 0;   // K slices forced (kernels::QuantizedGemvProblem::splits; 0: the target's)
  QuantizedGemvReduce reduce = QuantizedGemvReduce::kAuto;       // the slices' reduction
  QuantizedGemvPrefetch prefetch = QuantizedGemvPrefetch::kOff;  // the weights' L2 prefetch
};

// The CPU twin: kAuto, kGemv and kDequantGemm compute W8A16 (the reference); kW8a8 the W8A8
// product (throws Error(kUnsupported) where w8a8_format_refusal says why not).
void quantized_linear_cpu(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                          const Tensor& bias, const Tensor& out,
                          QuantizedLinearPath path = QuantizedLinearPath::kAuto);

// The rows up to which kAuto runs the GEMV, kQuantizedGemvPassRows at a time (each pass reads the
// packed weight once: up to 64 rows that is still fewer bytes than dequantizing it and reading
// the dense copy, and batched decode stays on the GEMV).
constexpr int64_t kQuantizedGemvMaxRows = 64;
constexpr int64_t kQuantizedGemvPassRows = kernels::kQuantizedGemvPassRows;
// Split-K partitions at most (bounds the GEMV's workspace).
constexpr int64_t kQuantizedMaxSplits = kernels::kQuantizedGemvMaxSplits;

// ---------------------------------------------------------------------------------------------
// The W8A8 path's planning (host code, tested on the CPU).

// Rows of x quantized and multiplied per W8A8 GEMM at most (larger n runs in chunks: the
// workspace holds one chunk's codes and scales).
constexpr int64_t kW8a8MaxChunkRows = 16384;
// cuBLASLt's FP8 scale layouts want the GEMM's N (rows of x) a multiple of 4: a chunk's rows are
// (a tail of 1-3 rows runs padded to 4 into a scratch, then copied out).
constexpr int64_t kW8a8RowMultiple = 4;

// Why w's format cannot run W8A8 ("" when it can): the FP8 block format with 128x128 blocks, or
// compressed-tensors FP8 (channel or tensor scales), in_features and out_features multiples of
// 16 (FP8 rows of 16 bytes, cuBLASLt's TN layout). Both twins' kW8a8 check it.
std::string w8a8_format_refusal(const QuantizedWeight& w, const QuantConfig& q);

// The inputs of the path choice: the problem and the device (compute capability major * 10 +
// minor; 0 for the CPU twin).
struct QuantizedLinearProblem {
  int64_t n = 0;
  DType x_dtype = DType::kBF16, out_dtype = DType::kBF16;
  int sm = 0;
  QuantizedLinearPath requested = QuantizedLinearPath::kAuto;
  std::string gemv_refusal;   // why the GEMV cannot run it ("" when it can; CUDA's plan_gemv)
  bool out_aligned16 = true;  // out's address and row stride are multiples of 16 bytes
};

struct QuantizedLinearSchedule {
  QuantizedLinearPath path = QuantizedLinearPath::kDequantGemm;  // kGemv, kDequantGemm or kW8a8
  std::string w8a8_refusal;  // why W8A8 does not run ("" when it does)
};

// The CUDA twin's path: the GEMV for n <= kQuantizedGemvMaxRows where it can run; else W8A8 for
// the FP8 formats on sm_90 with bf16 or f16 x (an f32 x keeps the dequantized weight's precision);
// else the dequantizing path. A requested kGemv or kW8a8 that cannot run throws
// Error(kUnsupported) with the reason.
QuantizedLinearSchedule quantized_linear_schedule(const QuantizedLinearProblem& p,
                                                  const QuantizedWeight& w, const QuantConfig& q);

// Where a W8A8 chunk of `rows` rows (a multiple of kW8a8RowMultiple) keeps its parts in the
// workspace, byte offsets from its start (each 256-aligned): the codes [rows, in], the scales
// ([ceil(in/128), rows] or [rows] f32), the weight's scales converted for cuBLASLt where the
// checkpoint's cannot be read as they are (f32, K-major with a row stride padded to 4 blocks for
// the block format; [out] f32 otherwise), and a [4, out] scratch (4 bytes an element: any out
// dtype) for the tail rows.
struct W8a8Layout {
  int64_t rows = 0;
  int64_t codes = 0, act_scales = 0, weight_scales = 0, tail_out = 0, bytes = 0;
};
W8a8Layout w8a8_layout(int64_t rows, const QuantizedWeight& w);

// The rows per W8A8 chunk for n rows in a workspace of `workspace_bytes` (<= 0: the op's own,
// sized for min(n, kW8a8MaxChunkRows)): a multiple of 128 when n allows (whole GEMM tiles), else
// of 4; 0 when not even 4 rows fit.
int64_t w8a8_chunk_rows(int64_t n, const QuantizedWeight& w, int64_t workspace_bytes);

// Device bytes the CUDA twin's workspace needs for n rows of x in `x_dtype` on `path`: the
// GEMV's fp32 partials (kQuantizedMaxSplits x min(n, 8) x out at most), the dequantized scratch
// out x in x dtype_size(x_dtype) (the prefill path: one layer's largest weight, reusable by
// every Linear of a step since the ops of one stream run in order), or W8A8's chunk
// (w8a8_layout of min(n, kW8a8MaxChunkRows) rows, rounded up to 4). kAuto: the largest of those
// the device may take (the op needs no more: a smaller workspace still fits W8A8's chunks of
// fewer rows, as long as 4 rows fit).
int64_t quantized_linear_workspace_bytes(int64_t n, const QuantizedWeight& w, DType x_dtype,
                                         QuantizedLinearPath path = QuantizedLinearPath::kAuto);

// The CUDA twin. `workspace`: a u8 device tensor of at least quantized_linear_workspace_bytes
// (what CUDA-graph capture needs: nothing is allocated then), or undefined: a buffer per (device,
// stream) kept by the op, grown when a call needs more (the stream is synchronized first, so
// not while capturing: that throws Error(kInvalidArgument) asking for a workspace).
void quantized_linear_cuda(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                           const Tensor& bias, const Tensor& out,
                           const Tensor& workspace = Tensor(),
                           QuantizedLinearPath path = QuantizedLinearPath::kAuto,
                           const QuantizedGemvOptions& gemv = {});
// What quantized_linear_cuda runs for these arguments, for benchmarks and tests: "gemv
// <format> <kernel> tile T splits S ...", "w8a8 ..." or "dequant + <linear_cuda's plan>".
std::string quantized_linear_cuda_plan(const Tensor& x, const QuantizedWeight& w,
                                       const QuantConfig& q, const Tensor& bias, const Tensor& out,
                                       QuantizedLinearPath path = QuantizedLinearPath::kAuto,
                                       const QuantizedGemvOptions& gemv = {});

// Checks w against q's format: method, positive sizes, each tensor's shape and dtype, a group
// size that divides in_features, out_features a multiple of 8 for int4. Throws
// Error(kInvalidArgument) naming the tensor and what was expected. Both twins call it.
void check_quantized_weight(const char* op, const QuantizedWeight& w, const QuantConfig& q);

}  // namespace longctx::ops
