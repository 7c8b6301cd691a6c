// CUDA KV store (see kv_store.h). A CTA of kThreads threads is laid out as by tokens x bx lanes:
// lane x of token row y copies vectors x, x + bx, ... of that token's K row and of its V row (two
// independent loads in flight), so long rows (8 heads x 128 x bf16 = 128 16-byte vectors) take a
// whole warp-multiple per token and short rows (1 head x 16 = 2 vectors) pack many tokens per
// CTA. No integer division per element: the token comes from the block and thread indices.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/cuda/kv_store.h"
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct KvStoreArgs {
  const char* k;
  const char* v;
  char* k_cache;
  char* v_cache;
  const int64_t* slots;  // [num_tokens]
  int* error_flag;       // optional
  int64_t k_stride;      // vectors between tokens of k
  int64_t v_stride;      // vectors between tokens of v
  int64_t capacity;      // num_pages * page_size slots
  int vec_per_token;     // vectors in one token's K (or V) row
  int num_tokens;
};

// Vec: the copy unit (uint4 / uint2 / uint32_t / uint16_t). blockDim = (bx, by).
template <typename Vec>
__global__ void __launch_bounds__(kThreads) kv_store_kernel(KvStoreArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x * blockDim.y + threadIdx.y;
  if (t >= a.num_tokens) return;
  const int64_t slot = a.slots[t];
  if (slot < 0) return;  // padding token
  if (slot >= a.capacity) {
    if (threadIdx.x == 0 && a.error_flag) *a.error_flag = 1;
    return;
  }
  const Vec* k = reinterpret_cast<const Vec*>(a.k) + t * a.k_stride;
  const Vec* v = reinterpret_cast<const Vec*>(a.v) + t * a.v_stride;
  Vec* kc = reinterpret_cast<Vec*>(a.k_cache) + slot * a.vec_per_token;
  Vec* vc = reinterpret_cast<Vec*>(a.v_cache) + slot * a.vec_per_token;
  for (int e = threadIdx.x; e < a.vec_per_token; e += blockDim.x) {
    const Vec kx = k[e];
    const Vec vx = v[e];
    kc[e] = kx;
    vc[e] = vx;
  }
}

template <typename Vec>
void launch(KvStoreArgs a, cudaStream_t stream) {
  // bx: lanes per token, a power of two covering the row up to the whole CTA.
  int bx = 1;
  while (bx < a.vec_per_token && bx < kThreads) bx *= 2;
  const int by = kThreads / bx;
  const dim3 block{unsigned(bx), unsigned(by)};
  const dim3 grid{unsigned((int64_t(a.num_tokens) + by - 1) / by)};
  launch_pdl(kv_store_kernel<Vec>, grid, block, 0, stream, a);
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void kv_store_run(const KvStoreParams& p, cudaStream_t stream) {
  cpu::check_kv_store_params(p);
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kDtype, ErrorCode::kUnsupported,
                "kv store: the CUDA kernel does not write an FP8 KV cache yet");
  if (p.num_tokens == 0) return;
  const int64_t esize = int64_t(dtype_size(p.dtype));
  const int64_t row_bytes = int64_t(p.num_kv_heads) * p.head_dim * esize;
  const int64_t k_stride_bytes = p.k_token_stride * esize;
  const int64_t v_stride_bytes = p.v_token_stride * esize;
  auto fits = [&](int64_t w) {
    return row_bytes % w == 0 && k_stride_bytes % w == 0 && v_stride_bytes % w == 0 &&
           aligned(p.k, w) && aligned(p.v, w) && aligned(p.k_cache, w) && aligned(p.v_cache, w);
  };
  LONGCTX_CHECK(fits(esize), ErrorCode::kInvalidArgument,
                "kv store: k, v, k_cache and v_cache must be aligned to the {}-byte element",
                esize);
  int64_t width = esize;
  for (int64_t w : {16, 8, 4}) {
    if (w > esize && fits(w)) {
      width = w;
      break;
    }
  }
  LONGCTX_CHECK(row_bytes / width <= INT32_MAX, ErrorCode::kInvalidArgument,
                "kv store: a token row of {} bytes is too long", row_bytes);
  KvStoreArgs a{static_cast<const char*>(p.k),
                static_cast<const char*>(p.v),
                static_cast<char*>(p.k_cache),
                static_cast<char*>(p.v_cache),
                p.slot_mapping,
                p.error_flag,
                k_stride_bytes / width,
                v_stride_bytes / width,
                int64_t(p.num_pages) * p.page_size,
                int(row_bytes / width),
                p.num_tokens};
  switch (width) {
    case 16:
      return launch<uint4>(a, stream);
    case 8:
      return launch<uint2>(a, stream);
    case 4:
      return launch<uint32_t>(a, stream);
    default:
      return launch<uint16_t>(a, stream);
  }
}

}  // namespace longctx::kernels::cuda
