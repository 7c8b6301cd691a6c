// Linear over a quantized weight kept packed as its checkpoint stores it (QuantizedWeight, the
// layouts in include/longctx/loader/quantization.h): out = x @ W^T (+ bias), W = dequantize(w).
// Decode streams the packed bytes (a quarter of bf16's for int4, half for FP8); the CPU twin is
// the readable reference (the loader's dequantize, then the dense CPU linear).
#pragma once

#include <cstdint>
#include <string>

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
// the dense linear_cpu (sequential fp32 sums).
// CUDA: x bf16, f16 or f32; out f32 or x's dtype; fp32 accumulation. For n <=
// kQuantizedGemvMaxRows, a GEMV per format reads the packed weight once per 8 rows (16-byte loads;
// int4 decoded in registers to the exact (q - z) in half2, times x in fp32, the group's scale
// applied once per group (AWQ) or per 8 inputs (GPTQ); FP8 E4M3 -> f16 -> f32, the block scale per
// 16 inputs, a channel scale at the end), split over K across CTAs when out is small: each split
// writes fp32 partials to the workspace and one kernel adds them in split order (deterministic).
// Otherwise (n > 64, or a shape the GEMV does not take) W is dequantized into a scratch [out, in]
// in x's dtype (one kernel, f32 arithmetic, one rounding) and the dense linear_cuda (cuBLASLt) runs
// on it. Launches on current_stream(device), no host sync.
void quantized_linear(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                      const Tensor& bias, const Tensor& out, const Tensor& workspace = Tensor());
void quantized_linear_cpu(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                          const Tensor& bias, const Tensor& out);

// Which CUDA path runs: kAuto as described above; kGemv throws Error(kUnsupported) naming the
// reason when the GEMV cannot run the arguments; kDequantGemm always dequantizes.
enum class QuantizedLinearPath { kAuto, kGemv, kDequantGemm };

// The rows up to which kAuto runs the GEMV, kQuantizedGemvPassRows at a time (each pass reads the
// packed weight once: up to 64 rows that is still fewer bytes than dequantizing it and reading
// the dense copy, and batched decode stays on the GEMV).
constexpr int64_t kQuantizedGemvMaxRows = 64;
constexpr int64_t kQuantizedGemvPassRows = 8;
// Split-K partitions at most (bounds the GEMV's workspace).
constexpr int64_t kQuantizedMaxSplits = 64;

// Device bytes the CUDA twin's workspace needs for n rows of x in `x_dtype` on `path`: the
// GEMV's fp32 partials (kQuantizedMaxSplits x min(n, 8) x out at most), or the dequantized scratch
// out x in x dtype_size(x_dtype) (the prefill path: one layer's largest weight, reusable by
// every Linear of a step since the ops of one stream run in order).
int64_t quantized_linear_workspace_bytes(int64_t n, const QuantizedWeight& w, DType x_dtype,
                                         QuantizedLinearPath path = QuantizedLinearPath::kAuto);

// The CUDA twin. `workspace`: a u8 device tensor of at least quantized_linear_workspace_bytes
// (what CUDA-graph capture needs: nothing is allocated then), or undefined: a buffer per (device,
// stream) kept by the op, grown when a call needs more (the stream is synchronized first, so
// not while capturing: that throws Error(kInvalidArgument) asking for a workspace).
void quantized_linear_cuda(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                           const Tensor& bias, const Tensor& out,
                           const Tensor& workspace = Tensor(),
                           QuantizedLinearPath path = QuantizedLinearPath::kAuto);
// What quantized_linear_cuda runs for these arguments, for benchmarks and tests: "gemv
// <format> splits S ..." or "dequant + <linear_cuda's plan>".
std::string quantized_linear_cuda_plan(const Tensor& x, const QuantizedWeight& w,
                                       const QuantConfig& q, const Tensor& bias, const Tensor& out,
                                       QuantizedLinearPath path = QuantizedLinearPath::kAuto);

// Checks w against q's format: method, positive sizes, each tensor's shape and dtype, a group
// size that divides in_features, out_features a multiple of 8 for int4. Throws
// Error(kInvalidArgument) naming the tensor and what was expected. Both twins call it.
void check_quantized_weight(const char* op, const QuantizedWeight& w, const QuantConfig& q);

}  // namespace longctx::ops
