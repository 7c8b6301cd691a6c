// The W8A8 path of the CUDA quantized Linear (quantized_linear_w8a8_cuda.cu): activation
// quantization, then cuBLASLt's scaled FP8 GEMM on sm_90. Internal to the op's CUDA twin.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "longctx/core/tensor.h"
#include "longctx/loader/quantization.h"

namespace longctx::ops::w8a8_detail {

struct W8a8Args {
  const void* x = nullptr;  // [n, in], row stride ldx
  void* out = nullptr;      // [n, out], row stride ldo (16-byte aligned rows)
  const void* bias = nullptr;
  int64_t n = 0, ldx = 0, ldo = 0;
  DType x_dtype = DType::kBF16, out_dtype = DType::kBF16, bias_dtype = DType::kF32;
  Device device;
};

// Whether cuBLASLt has a kernel for the GEMMs of n rows of this weight ("" when it has, else
// its refusal): the chunks' row counts, the tail's 4. Plans are cached, so this is what the run
// uses.
std::string w8a8_gemm_refusal(const W8a8Args& a, const QuantizedWeight& w, const QuantConfig& q,
                              int64_t chunk_rows);

// Runs out = W8A8(x, w) (+ bias) in chunks of chunk_rows rows (w8a8_chunk_rows) in `workspace`
// (at least w8a8_layout(chunk_rows, w).bytes, 256-aligned). No allocation but the cuBLASLt
// workspace kept per (device, stream), no host sync.
void run_w8a8(const W8a8Args& a, const QuantizedWeight& w, const QuantConfig& q, int64_t chunk_rows,
              void* workspace, cudaStream_t stream);

// "w8a8 <scales> chunk R: cublasLt algo ..." for n rows.
std::string w8a8_plan(const W8a8Args& a, const QuantizedWeight& w, const QuantConfig& q,
                      int64_t chunk_rows);

}  // namespace longctx::ops::w8a8_detail
