// CUDA KV store (see kv_store.h). A CTA of kThreads threads is laid out as by tokens x bx lanes:
// lane x of token row y copies vectors x, x + bx, ... of that token's K row and of its V row (two
// independent loads in flight), so long rows (8 heads x 128 x bf16 = 128 16-byte vectors) take a
// whole warp-multiple per token and short rows (1 head x 16 = 2 vectors) pack many tokens per
// CTA. No integer division per element: the token comes from the block and thread indices.
//
// FP8 (kv_format kFp8E4M3): one CTA of kFp8Threads per (run of the step's tokens on one page, KV
// head, K or V). A run starts at a token whose previous real token (padding and slots past the
// pool skipped) lies on another page; every other token's CTA exits at once. The run's CTA then
// does the CPU reference's steps row by row, in token order: the row's amax over finite values
// (a block reduction), the page scale (restarted at offset 0), the raise that re-encodes the
// page's earlier rows of this head, the row's codes. Thread i owns elements i, i + kFp8Threads,
// ... of every row, the re-encoded ones included, so a row it wrote is re-read by the same thread
// (no barrier between rows beyond the reduction's). The codes and scales are bit-identical to
// kernels/cpu/kv_store_cpu.cpp (fp8_device.cuh's encoder is its bit operations).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/kv_store_cpu.h"
#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
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

constexpr int kFp8Threads = 128;

struct Fp8StoreArgs {
  const void* src[2];  // k, v
  int64_t stride[2];   // elements between tokens of k / v
  uint8_t* cache[2];   // k_cache, v_cache codes
  float* scale[2];     // k_scale, v_scale [num_pages, num_kv_heads]
  const int64_t* slots;
  int* error_flag;
  int64_t capacity;
  int num_tokens, num_kv_heads, head_dim, page_size;
};

// The page of token t's slot, or -1 for a token the store skips (padding, past the pool).
__device__ __forceinline__ int64_t store_page(const Fp8StoreArgs& a, int t) {
  const int64_t s = a.slots[t];
  return s >= 0 && s < a.capacity ? s / a.page_size : -1;
}

// The sign bit of a source element (an f16 NaN's sign may not survive the conversion to fp32).
template <typename T>
__device__ __forceinline__ bool sign_of(const T* p) {
  if constexpr (sizeof(T) == 4)
    return (*reinterpret_cast<const uint32_t*>(p) >> 31) != 0;
  else
    return (*reinterpret_cast<const uint16_t*>(p) >> 15) != 0;
}

// grid (num_tokens, num_kv_heads, 2: K then V); dynamic shared memory: head_dim floats.
template <typename T>
__global__ void __launch_bounds__(kFp8Threads) kv_store_fp8_kernel(Fp8StoreArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float row[];
  __shared__ float warp_max[kFp8Threads / 32];
  const int t0 = blockIdx.x, h = blockIdx.y, kv = blockIdx.z;
  const int64_t page = store_page(a, t0);
  if (page < 0) {
    if (a.slots[t0] >= a.capacity && threadIdx.x == 0 && kv == 0 && h == 0 && a.error_flag)
      *a.error_flag = 1;
    return;
  }
  // Not the run's first token: an earlier CTA writes this row. The look-back passes skipped tokens.
  for (int p = t0 - 1; p >= 0; --p) {
    const int64_t pp = store_page(a, p);
    if (pp == page) return;
    if (pp >= 0) break;
  }
  const int d = a.head_dim, hkv = a.num_kv_heads;
  const T* src = static_cast<const T*>(a.src[kv]);
  uint8_t* codes = a.cache[kv];
  float* scale_at = a.scale[kv] + page * hkv + h;
  auto row_codes = [&](int64_t off) { return codes + ((page * a.page_size + off) * hkv + h) * d; };
  float scale = *scale_at;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = t0; t < a.num_tokens; ++t) {
    const int64_t pg = store_page(a, t);
    if (pg < 0) continue;  // skipped inside the run
    if (pg != page) break;
    const int64_t off = a.slots[t] % a.page_size;
    if (off == 0) scale = 0.f;
    const T* x = src + t * a.stride[kv] + int64_t(h) * d;
    float amax = 0.f;
    for (int c = threadIdx.x; c < d; c += kFp8Threads) {
      const float v = detail::to_f32(x[c]);
      row[c] = v;
      if (isfinite(v)) amax = fmaxf(amax, fabsf(v));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kFp8Threads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    __syncthreads();  // warp_max is rewritten by the next row
    const float need = fp8_page_scale(amax);
    if (need > scale) {
      if (scale > 0.f) {  // a power-of-two ratio: exact while the codes stay normal
        const float ratio = scale / need;
        for (int64_t r = 0; r < off; ++r) {
          uint8_t* q = row_codes(r);
          for (int c = threadIdx.x; c < d; c += kFp8Threads) {
            const uint8_t old = q[c];
            // A NaN code stays itself (its sign through the multiply is not guaranteed here).
            if ((old & 0x7fu) != 0x7fu)
              q[c] = detail::fp8e4m3_encode(detail::fp8e4m3_decode(old) * ratio);
          }
        }
      }
      scale = need;
    }
    const float inv = scale > 0.f ? 1.f / scale : 1.f;  // 0: the row is zeros or not finite
    uint8_t* q = row_codes(off);
    for (int c = threadIdx.x; c < d; c += kFp8Threads) {
      const float v = row[c];
      q[c] = isnan(v) ? uint8_t((sign_of(x + c) ? 0x80u : 0u) | 0x7fu)
                      : detail::fp8e4m3_encode(v * inv);
    }
  }
  if (threadIdx.x == 0) *scale_at = scale;
}

template <typename T>
void launch_fp8(const KvStoreParams& p, cudaStream_t stream) {
  Fp8StoreArgs a{{p.k, p.v},
                 {p.k_token_stride, p.v_token_stride},
                 {static_cast<uint8_t*>(p.k_cache), static_cast<uint8_t*>(p.v_cache)},
                 {p.k_scale, p.v_scale},
                 p.slot_mapping,
                 p.error_flag,
                 int64_t(p.num_pages) * p.page_size,
                 p.num_tokens,
                 p.num_kv_heads,
                 p.head_dim,
                 p.page_size};
  const dim3 grid(unsigned(p.num_tokens), unsigned(p.num_kv_heads), 2u);
  launch_pdl(kv_store_fp8_kernel<T>, grid, dim3(kFp8Threads), size_t(p.head_dim) * sizeof(float),
             stream, a);
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void kv_store_run(const KvStoreParams& p, cudaStream_t stream) {
  cpu::check_kv_store_params(p);
  if (p.num_tokens == 0) return;
  const int64_t esize = int64_t(dtype_size(p.dtype));
  if (p.kv_format == KvCacheFormat::kFp8E4M3) {
    LONGCTX_CHECK(aligned(p.k, esize) && aligned(p.v, esize), ErrorCode::kInvalidArgument,
                  "kv store: k and v must be aligned to the {}-byte element", esize);
    LONGCTX_CHECK(p.head_dim <= 12 * 1024, ErrorCode::kInvalidArgument,
                  "kv store: head_dim {} too large for an FP8 row in shared memory", p.head_dim);
    switch (p.dtype) {
      case DType::kBF16:
        return launch_fp8<__nv_bfloat16>(p, stream);
      case DType::kF16:
        return launch_fp8<__half>(p, stream);
      default:
        return launch_fp8<float>(p, stream);
    }
  }
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
