#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/fp8_stage.h"
#include "kernels/cuda/func_attributes.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// A thread per 16-code chunk of the call's pages (grid-stride): K's and V's chunk at the same
// place, both loads in flight before either converts; 16-byte loads, two 16-byte stores each.
// Consecutive threads take consecutive chunks of a page: coalesced reads and writes.
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_stage_kernel(Fp8StageParams p) {
  const int64_t chunks_per_page = int64_t(p.page_size) * p.num_kv_heads * p.head_dim / 16;
  const int64_t total = p.num_pages * chunks_per_page;
  const int row_chunks = p.head_dim / 16;  // chunks of one head's row
  for (int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * kThreads) {
    const int64_t j = c / chunks_per_page, within = c - j * chunks_per_page;
    const int64_t page = p.kv_indices[j];
    const int head = int((within / row_chunks) % p.num_kv_heads);
    const int64_t src = page * chunks_per_page + within;
    const uint4 kc = __ldg(reinterpret_cast<const uint4*>(p.k_codes) + src);
    const uint4 vc = __ldg(reinterpret_cast<const uint4*>(p.v_codes) + src);
    const float ks = __ldg(p.k_scale + page * p.num_kv_heads + head);
    const float vs = __ldg(p.v_scale + page * p.num_kv_heads + head);
    uint4 lo, hi;
    detail::fp8x16_to_elements<T>(kc, ks, lo, hi);
    uint4* k_out = reinterpret_cast<uint4*>(p.k_out) + 2 * c;
    k_out[0] = lo;
    k_out[1] = hi;
    detail::fp8x16_to_elements<T>(vc, vs, lo, hi);
    uint4* v_out = reinterpret_cast<uint4*>(p.v_out) + 2 * c;
    v_out[0] = lo;
    v_out[1] = hi;
    if (p.iota_out != nullptr && within == 0) p.iota_out[j] = int32_t(j);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void fp8_stage_run(const Fp8StageParams& p, cudaStream_t stream) {
  check_fp8_stage_params(p);
  if (p.num_pages == 0) return;
  LONGCTX_CHECK(
      aligned16(p.k_codes) && aligned16(p.v_codes) && aligned16(p.k_out) && aligned16(p.v_out),
      ErrorCode::kInvalidArgument,
      "fp8 stage: the codes and the staging pool must be 16-byte aligned");
  const int64_t chunks = p.num_pages * p.page_size * p.num_kv_heads * p.head_dim / 16;
  // Enough CTAs to keep every SM's loads in flight; the grid-stride loop takes the rest.
  const int64_t most = int64_t(std::max(current_sm_count(), 1)) * 16;
  const int blocks = int(std::min<int64_t>((chunks + kThreads - 1) / kThreads, most));
  if (p.dtype == DType::kBF16)
    fp8_stage_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p);
  else
    fp8_stage_kernel<__half><<<blocks, kThreads, 0, stream>>>(p);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

PagedPrefillParams fp8_stage_prefill(const PagedPrefillParams& p, int64_t num_pages, void* pool,
                                     cudaStream_t stream) {
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kFp8E4M3, ErrorCode::kInvalidArgument,
                "fp8 stage: the call's cache is not FP8");
  const Fp8StageLayout l =
      fp8_stage_layout(num_pages, p.page_size, p.num_kv_heads, p.head_dim, p.dtype);
  auto* base = static_cast<char*>(pool);
  Fp8StageParams f;
  f.k_codes = static_cast<const uint8_t*>(p.k_cache);
  f.v_codes = static_cast<const uint8_t*>(p.v_cache);
  f.k_scale = p.k_scale;
  f.v_scale = p.v_scale;
  f.kv_indices = p.kv_indices;
  f.k_out = base + l.k;
  f.v_out = base + l.v;
  f.iota_out = reinterpret_cast<int32_t*>(base + l.iota);
  f.num_pages = num_pages;
  f.page_size = p.page_size;
  f.num_kv_heads = p.num_kv_heads;
  f.head_dim = p.head_dim;
  f.dtype = p.dtype;
  fp8_stage_run(f, stream);
  PagedPrefillParams s = p;
  s.k_cache = f.k_out;
  s.v_cache = f.v_out;
  s.kv_indices = f.iota_out;
  s.kv_contiguous = true;
  s.kv_format = KvCacheFormat::kDtype;
  s.k_scale = s.v_scale = nullptr;
  return s;
}

}  // namespace longctx::kernels::cuda
