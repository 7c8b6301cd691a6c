#include <cuda_runtime.h>

#include "kernels/cuda/tensor_map.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                             cudaEnableDefault, &status);
    LONGCTX_CHECK(err == cudaSuccess && status == cudaDriverEntryPointSuccess && p != nullptr,
                  ErrorCode::kUnsupported,
                  "TMA: the driver has no cuTensorMapEncodeTiled ({}, status {})",
                  cudaGetErrorString(err), static_cast<int>(status));
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

}  // namespace

bool tma_supported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major == 9;
}

CUtensorMap kv_cache_tensor_map(const void* cache, int64_t num_slots, int num_kv_heads,
                                int head_dim, int box_tokens, DType dtype) {
  LONGCTX_CHECK(dtype == DType::kBF16 || dtype == DType::kF16, ErrorCode::kUnsupported,
                "TMA KV map: dtype {} not bf16/f16", dtype_name(dtype));
  LONGCTX_CHECK(head_dim % 64 == 0 && box_tokens >= 1 && box_tokens <= 256 && num_slots >= 1 &&
                    num_kv_heads >= 1,
                ErrorCode::kInvalidArgument,
                "TMA KV map: head_dim {} / box {} / slots {} / kv heads {} invalid", head_dim,
                box_tokens, num_slots, num_kv_heads);
  CUtensorMap map;
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(num_kv_heads),
                              cuuint64_t(num_slots)};
  const cuuint64_t strides[2] = {cuuint64_t(head_dim) * 2, cuuint64_t(num_kv_heads) * head_dim * 2};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_tokens)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encoder()(
      &map,
      dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(cache), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LONGCTX_CHECK(r == CUDA_SUCCESS, ErrorCode::kUnsupported,
                "TMA KV map: cuTensorMapEncodeTiled failed with CUresult {} (cache {}, {} slots x "
                "{} kv heads x {} dims)",
                static_cast<int>(r), cache, num_slots, num_kv_heads, head_dim);
  return map;
}

}  // namespace longctx::kernels::cuda
