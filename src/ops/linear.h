// nn.Linear: out = x @ weight^T + bias, fp32 accumulation, weight in its checkpoint dtype.
#pragma once

#include <cstdint>
#include <string>

#include "longctx/core/tensor.h"

namespace longctx::ops {

// Shapes (both twins): x [n, in]; weight [out, in] (contiguous); bias [out] f32/bf16/f16
// (contiguous) or undefined; out [n, out], must not overlap x. x and out may have any row stride
// (strides()[0] >= their width; e.g. down_proj reads the gate half of a [n, 2I] gate/up output).
//
// CPU: x f32; weight f32/bf16/f16; out f32.
// CUDA: (x, weight) bf16/bf16, f16/f16 or f32/f32; out f32 or x's dtype (fp32 logits come
// straight from the GEMM); fp32 accumulation. cuBLASLt (TN GEMM) with the bias in its BIAS
// epilogue when bias and out share a dtype, else a separate fp32 add (one more rounding of a
// 16-bit out). Any size is accepted and cuBLASLt is told each operand's actual alignment; a
// shape for which it has no kernel throws Error(kUnsupported) naming it (the model's sizes,
// multiples of 16, always have one). For n == 1 with 16-bit x/weight whose rows are 16-byte
// aligned (in % 8 == 0), a GEMV kernel that streams the weight once is used instead (measured
// on an H200 it reads the weight at up to 4.3 TB/s; at n = 4 cuBLASLt was faster).
// Launches on current_stream(device), no host sync; the first call of a shape plans it (host
// work, cached per device), so warm shapes up before capturing a CUDA graph.
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
void linear_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);

// Which CUDA path runs: kAuto as described above; the others force one (tests, benchmarks).
// kGemv throws Error(kUnsupported) when its conditions (16-bit, n <= 8, 16-byte rows) fail.
enum class LinearBackend { kAuto, kCublasLt, kGemv };
void linear_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                 LinearBackend backend = LinearBackend::kAuto);
// What linear_cuda runs for these arguments, for benchmarks: "gemv", or the cuBLASLt
// algorithm's configuration (algo id, tile, stages, split-k, ...), planning it if needed.
std::string linear_cuda_plan(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& out, LinearBackend backend = LinearBackend::kAuto);

}  // namespace longctx::ops
