// The cuBLASLt prefill path of moe_experts_cuda (moe_cublas_cuda.cu) and the piece of
// moe_cuda.cu it reuses. Included by CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "longctx/core/tensor.h"
#include "ops/moe.h"

namespace longctx::ops {

// The align step without padding (moe_cuda.cu's align kernel with rows = 1): expert e's slots at
// rows [counts[0] + ... + counts[e - 1], ... + counts[e]) of `sorted`, in an order the atomics
// decide.
struct MoeAlignRows {
  int32_t* counts;     // [experts]: slots per expert
  int32_t* num_tiles;  // [1]: the rows written (slots with an id in range)
  int32_t* sorted;     // [moe_max_tiles(slots, experts, 1)]: each row's slot, -1 past the end
  int32_t* inv;        // [slots]: each slot's row, -1 for an id out of range
};
void moe_align_rows(const MoeArgs& a, const MoeShape& s, const MoeAlignRows& o,
                    cudaStream_t stream);

// The experts' output rows on cuBLASLt (MoePath::kCublasLt): see moe_cublas_cuda.cu. Returns y
// [rows, hidden] in the weights' 16-bit dtype; *inv (inside `ints`, which must outlive the
// combine's launch) is each slot's row of y, -1 for none.
Tensor moe_cublas_experts(const MoeArgs& a, const MoeShape& s, cudaStream_t stream, Tensor& ints,
                          const int32_t** inv);

}  // namespace longctx::ops
