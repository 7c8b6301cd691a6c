#include "core/strided_copy.h"

#include <cstdint>
#include <cstring>

#include "longctx/core/error.h"

namespace longctx::detail {

StridedCopyParams make_strided_copy_params(void* dst, const int64_t* dst_strides, const void* src,
                                           const int64_t* src_strides, const int64_t* shape,
                                           int rank, size_t elem_size) {
  LONGCTX_CHECK(elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8,
                ErrorCode::kUnsupported, "strided copy: element size {} (1, 2, 4 or 8 bytes)",
                elem_size);
  StridedCopyParams p;
  p.dst = dst;
  p.src = src;
  p.elem_size = static_cast<int>(elem_size);
  p.numel = 1;
  for (int d = 0; d < rank; ++d) p.numel *= shape[d];
  if (p.numel == 0) return p;
  LONGCTX_CHECK(reinterpret_cast<uintptr_t>(dst) % elem_size == 0 &&
                    reinterpret_cast<uintptr_t>(src) % elem_size == 0,
                ErrorCode::kInvalidArgument,
                "strided copy: pointers {} / {} are not aligned to the {}-byte element", dst, src,
                elem_size);
  // Outer to inner: a dim folds into the previous kept one when, in both views, one step of the
  // previous dim is exactly a full run of this one.
  int64_t sh[64], ds[64], ss[64];
  int n = 0;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1) continue;
    if (n > 0 && ds[n - 1] == dst_strides[d] * shape[d] && ss[n - 1] == src_strides[d] * shape[d]) {
      sh[n - 1] *= shape[d];
      ds[n - 1] = dst_strides[d];
      ss[n - 1] = src_strides[d];
      continue;
    }
    LONGCTX_CHECK(n < 64, ErrorCode::kUnsupported, "strided copy: rank {} tensor", rank);
    sh[n] = shape[d];
    ds[n] = dst_strides[d];
    ss[n] = src_strides[d];
    ++n;
  }
  if (n == 0) {  // every dim is 1: one element
    sh[0] = 1;
    ds[0] = ss[0] = 1;
    n = 1;
  }
  LONGCTX_CHECK(n <= kMaxStridedCopyRank, ErrorCode::kUnsupported,
                "strided copy: {} dims remain after merging contiguous ones (at most {})", n,
                kMaxStridedCopyRank);
  p.rank = n;
  for (int d = 0; d < n; ++d) {
    p.shape[d] = sh[d];
    p.dst_strides[d] = ds[d];
    p.src_strides[d] = ss[d];
  }
  return p;
}

void strided_copy_cpu(const StridedCopyParams& p) {
  if (p.numel == 0) return;
  const int r = p.rank;
  const int64_t es = p.elem_size;
  const int64_t inner = p.shape[r - 1];
  const int64_t di = p.dst_strides[r - 1], si = p.src_strides[r - 1];
  int64_t idx[kMaxStridedCopyRank] = {};
  auto* dst = static_cast<char*>(p.dst);
  const auto* src = static_cast<const char*>(p.src);
  for (int64_t row = 0; row < p.numel / inner; ++row) {
    int64_t doff = 0, soff = 0;
    for (int d = 0; d < r - 1; ++d) {
      doff += idx[d] * p.dst_strides[d];
      soff += idx[d] * p.src_strides[d];
    }
    if (di == 1 && si == 1) {
      std::memcpy(dst + doff * es, src + soff * es, inner * es);
    } else {
      for (int64_t j = 0; j < inner; ++j)
        std::memcpy(dst + (doff + j * di) * es, src + (soff + j * si) * es, es);
    }
    for (int d = r - 2; d >= 0; --d) {
      if (++idx[d] < p.shape[d]) break;
      idx[d] = 0;
    }
  }
}

#ifndef LONGCTX_WITH_CUDA
void strided_copy_cuda(const StridedCopyParams&, int) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "strided copy on CUDA: this build of longctx has no CUDA backend");
}
#endif

}  // namespace longctx::detail
