// Internal: element-wise copy between two strided views of the same shape (the gather behind
// Tensor::contiguous() and the general case of Tensor::copy_from()), on raw pointers + a params
// struct; a CPU reference and a CUDA kernel share the params.
#pragma once

#include <cstddef>
#include <cstdint>

namespace longctx::detail {

inline constexpr int kMaxStridedCopyRank = 6;

struct StridedCopyParams {
  void* dst = nullptr;
  const void* src = nullptr;
  int rank = 0;                                   // >= 1 after make_strided_copy_params
  int64_t shape[kMaxStridedCopyRank] = {};        // [rank]
  int64_t dst_strides[kMaxStridedCopyRank] = {};  // [rank], in elements
  int64_t src_strides[kMaxStridedCopyRank] = {};  // [rank], in elements
  int64_t numel = 0;
  int elem_size = 0;  // 1, 2, 4 or 8 bytes
};

// Drops size-1 dims and merges dims that are contiguous in both views, so e.g. a slice of a
// contiguous tensor becomes a rank-2 copy. shape/strides: [rank]. Throws Error(kUnsupported) when
// more than kMaxStridedCopyRank dims remain or the element size is not 1/2/4/8, and
// Error(kInvalidArgument) for a pointer not aligned to the element size.
StridedCopyParams make_strided_copy_params(void* dst, const int64_t* dst_strides, const void* src,
                                           const int64_t* src_strides, const int64_t* shape,
                                           int rank, size_t elem_size);

// The CPU reference (host pointers).
void strided_copy_cpu(const StridedCopyParams& p);
// The CUDA kernel, enqueued on current_stream(device) (device pointers of `device`).
// Throws Error(kUnsupported) in a build without CUDA.
void strided_copy_cuda(const StridedCopyParams& p, int device);

}  // namespace longctx::detail
