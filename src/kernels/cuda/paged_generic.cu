// Generic paged attention (see paged_generic.h). Layout of one CTA (128 threads, 4 warps):
//   a key's head_dim is spread over LPT lanes (the power of two >= head_dim / 8; lanes past
//   head_dim / 8 idle), 8 elements = 16 bytes per lane, so a warp holds 32 / LPT lane groups;
//   lane group j walks kTile consecutive keys per step (independent loads in flight) and keeps its
//   own online softmax (max, sum, accumulator slice) for each of the CTA's GT q heads; the q.k
//   partial dots of a key are summed over its LPT lanes by xor shuffles. At the end the lane
//   groups' states are merged through shared memory into o / lse.
// Scores live in the log2 domain (q pre-scaled by sm_scale * log2(e)); P stays fp32, the output is
// rounded once.
// FP8 caches (kFp8 = true): a lane loads its 8 codes (8 bytes) of a key's K and V row and the
// page's K and V scales, and dequantizes them to fp32 in registers (exact: a code times a power of
// two); everything after the load is the 16-bit path's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/merge_device.cuh"
#include "kernels/cuda/paged_generic.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;  // q heads per CTA (larger GQA groups take several CTAs)
constexpr int kMaxGridY = 65535;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct GenericArgs {
  const void* q;                     // [total_q, num_qo_heads, head_dim]
  const void* k;                     // [num_pages, page_size, num_kv_heads, head_dim]
  const void* v;                     // [num_pages, page_size, num_kv_heads, head_dim]
  void* o;                           // [total_q, num_qo_heads, head_dim] (unless o_f32)
  float* o_f32;                      // [total_q, num_qo_heads, head_dim] or nullptr
  float* lse;                        // [total_q, num_qo_heads] or nullptr
  const int32_t* qo_indptr;          // [batch_size + 1]
  const int32_t* kv_indptr;          // [batch_size + 1]
  const int32_t* kv_indices;         // [kv_indptr[batch_size]]
  const int32_t* kv_last_page_len;   // [batch_size]
  const uint8_t* block_mask;         // nullptr = dense
  const int64_t* block_mask_indptr;  // [batch_size + 1]
  int block_mask_heads;
  int batch_size, num_qo_heads, num_kv_heads, head_dim, group, head_tiles, page_size;
  bool causal;
  int window;            // causal only: keys a row sees (0: all)
  float scale_log2;      // sm_scale * log2(e)
  const float* k_scale;  // FP8: [num_pages, num_kv_heads]
  const float* v_scale;
};

__device__ __forceinline__ void unpack8(const uint4& r, float* f, const __nv_bfloat16*) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack8(const uint4& r, float* f, const __half*) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// 8 FP8 codes (r.x, r.y) times `scale`.
__device__ __forceinline__ void unpack8_fp8(const uint4& r, float scale, float* f) {
  const uint32_t w[2] = {r.x, r.y};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 x = detail::fp8e4m3x2_to_float2(uint16_t(w[i] >> (16 * h)));
      f[4 * i + 2 * h] = x.x * scale;
      f[4 * i + 2 * h + 1] = x.y * scale;
    }
  }
}

// grid = (total_q, num_kv_heads * head_tiles): blockIdx.x is the query token, blockIdx.y the
// (kv head, q-head tile).
template <typename T, int LPT, int GT, bool kFp8>
__global__ void __launch_bounds__(kThreads) paged_generic_kernel(GenericArgs a) {
  // Keys per lane group per step: 4 loads in flight, 2 with 8 q heads (register budget).
  constexpr int kTile = GT >= 8 ? 2 : 4;
  constexpr int TPW = 32 / LPT;          // lane groups per warp
  constexpr int NG = kWarps * TPW;       // lane groups per CTA
  constexpr int STEP = NG * kTile;       // keys per CTA step
  constexpr int DMAX = LPT * 8;          // head_dim <= DMAX
  __shared__ float s_m[NG][GT];          // per lane group and q head: running max (log2)
  __shared__ float s_l[NG][GT];          // running sum of exp2
  __shared__ float s_acc[NG][GT][DMAX];  // running sum of p * v

  // The request owning token t: the last b with qo_indptr[b] <= t (empty requests own none).
  const int t = blockIdx.x;
  int lo = 0, hi = a.batch_size;  // qo_indptr[lo] <= t < qo_indptr[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (a.qo_indptr[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int b = lo;
  const int q_start = a.qo_indptr[b], q_len = a.qo_indptr[b + 1] - q_start;
  const int i = t - q_start;  // position inside the segment
  if (i >= q_len) return;     // t past qo_indptr[batch_size]: not a row of this batch
  const int num_pages = a.kv_indptr[b + 1] - a.kv_indptr[b];
  const int kv_len = num_pages == 0 ? 0 : (num_pages - 1) * a.page_size + a.kv_last_page_len[b];
  int n_keys = kv_len;  // the row sees keys [0, n_keys) (and, block-sparse, only kept blocks)
  // and from k_first: a sliding window's first key (the loop starts there: earlier keys are
  // never read, so a trimmed or dropped page before it is never looked up)
  int k_first = 0;
  if (a.causal) {
    n_keys = max(0, min(kv_len, kv_len - q_len + i + 1));
    k_first = window_first_key(kv_len - q_len + i, a.window);
  }

  const int kvh = blockIdx.y / a.head_tiles;
  const int tile = blockIdx.y % a.head_tiles;
  const int h0 = kvh * a.group + tile * GT;
  const int nh = min(GT, a.group - tile * GT);
  const int D = a.head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int li = lane % LPT;
  const int grp = warp * TPW + lane / LPT;
  const bool active = li * 8 < D;  // this lane holds elements [li * 8, li * 8 + 8) of a row
  const T* q = static_cast<const T*>(a.q);
  using KV = std::conditional_t<kFp8, uint8_t, T>;  // a cache element
  const KV* kc = static_cast<const KV*>(a.k);
  const KV* vc = static_cast<const KV*>(a.v);

  // Block-sparse: the mask row of this query's block for q head h0; q head h0 + g's row is
  // mask_row + g * mask_head_stride (0 when the mask is shared by all heads).
  const uint8_t* mask_row = nullptr;
  int64_t mask_head_stride = 0;
  if (a.block_mask) {
    const int64_t nqb = (q_len + kSparseBlock - 1) / kSparseBlock;
    const int64_t nkb = (kv_len + kSparseBlock - 1) / kSparseBlock;
    const bool per_head = a.block_mask_heads != 1;
    mask_row = a.block_mask + a.block_mask_indptr[b] +
               ((per_head ? h0 : 0) * nqb + i / kSparseBlock) * nkb;
    mask_head_stride = per_head ? nqb * nkb : 0;
  }

  float qf[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (g < nh && active) {
      const uint4 r =
          *reinterpret_cast<const uint4*>(q + (int64_t(t) * a.num_qo_heads + h0 + g) * D + li * 8);
      unpack8(r, qf[g], q);
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[g][e] *= a.scale_log2;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) qf[g][e] = 0.f;
    }
  }
  float m[GT], l[GT], acc[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  const int32_t* pages = a.kv_indices + a.kv_indptr[b];
  const int ps = a.page_size;
  // The loop bound is warp-uniform (the warp's first key), so every lane reaches the shuffles;
  // lane groups past n_keys see masked keys.
  const int warp_first = k_first + warp * TPW * kTile;
  const int grp_off = (lane / LPT) * kTile;
  for (int jw = warp_first; jw < n_keys; jw += STEP) {
    const int j0 = jw + grp_off;
    uint4 kr[kTile], vr[kTile];
    float ks[kTile], vs[kTile];  // FP8: the keys' page scales
#pragma unroll
    for (int u = 0; u < kTile; ++u) {
      const int j = j0 + u;
      ks[u] = vs[u] = 0.f;
      if (j < n_keys && active) {
        const int64_t page = pages[j / ps];
        const int64_t off = ((page * ps + j % ps) * a.num_kv_heads + kvh) * D + li * 8;
        if constexpr (kFp8) {
          const uint2 k8 = __ldg(reinterpret_cast<const uint2*>(kc + off));
          const uint2 v8 = __ldg(reinterpret_cast<const uint2*>(vc + off));
          kr[u] = make_uint4(k8.x, k8.y, 0, 0);
          vr[u] = make_uint4(v8.x, v8.y, 0, 0);
          ks[u] = __ldg(a.k_scale + page * a.num_kv_heads + kvh);
          vs[u] = __ldg(a.v_scale + page * a.num_kv_heads + kvh);
        } else {
          kr[u] = __ldg(reinterpret_cast<const uint4*>(kc + off));
          vr[u] = __ldg(reinterpret_cast<const uint4*>(vc + off));
        }
      } else {
        kr[u] = make_uint4(0, 0, 0, 0);
        vr[u] = make_uint4(0, 0, 0, 0);
      }
    }
    float s[GT][kTile];
#pragma unroll
    for (int u = 0; u < kTile; ++u) {
      float kf[8];
      if constexpr (kFp8)
        unpack8_fp8(kr[u], ks[u], kf);
      else
        unpack8(kr[u], kf, q);
#pragma unroll
      for (int g = 0; g < GT; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(qf[g][e], kf[e], dot);
        s[g][u] = dot;
      }
    }
#pragma unroll
    for (int g = 0; g < GT; ++g) {
#pragma unroll
      for (int u = 0; u < kTile; ++u) {
#pragma unroll
        for (int off = LPT / 2; off > 0; off >>= 1)
          s[g][u] += __shfl_xor_sync(0xffffffffu, s[g][u], off);
        const int j = j0 + u;
        const bool masked = j >= n_keys || (mask_row && g < nh &&
                                            !mask_row[g * mask_head_stride + j / kSparseBlock]);
        if (masked) s[g][u] = -INFINITY;
      }
    }
    float vf[kTile][8];
#pragma unroll
    for (int u = 0; u < kTile; ++u) {
      if constexpr (kFp8)
        unpack8_fp8(vr[u], vs[u], vf[u]);
      else
        unpack8(vr[u], vf[u], q);
    }
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kTile; ++u) mx = fmaxf(mx, s[g][u]);
      // -inf while this lane group has seen no visible key: keep exp2 away from inf - inf.
      const float base = mx == -INFINITY ? 0.f : mx;
      const float scale = exp2f(m[g] - base);
      m[g] = mx;
      float p[kTile];
      float psum = 0.f;
#pragma unroll
      for (int u = 0; u < kTile; ++u) {
        p[u] = exp2f(s[g][u] - base);
        psum += p[u];
      }
      l[g] = l[g] * scale + psum;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float x = acc[g][e] * scale;
#pragma unroll
        for (int u = 0; u < kTile; ++u) x = fmaf(p[u], vf[u][e], x);
        acc[g][e] = x;
      }
    }
  }

  // Merge the lane groups' states (idle lanes store zeros past head_dim, never read).
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (li == 0) {
      s_m[grp][g] = m[g];
      s_l[grp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) s_acc[grp][g][li * 8 + e] = acc[g][e];
  }
  __syncthreads();
  T* o = static_cast<T*>(a.o);
  for (int idx = threadIdx.x; idx < nh * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
    for (int j = 0; j < NG; ++j) mx = fmaxf(mx, s_m[j][g]);
    float sum = 0.f, out = 0.f;
    if (mx != -INFINITY) {
      for (int j = 0; j < NG; ++j) {
        const float w = exp2f(s_m[j][g] - mx);  // groups that saw nothing: exp2(-inf) = 0
        sum += s_l[j][g] * w;
        out += s_acc[j][g][d] * w;
      }
      out /= sum;
    }
    const int64_t row = int64_t(t) * a.num_qo_heads + h0 + g;
    if (a.o_f32)
      a.o_f32[row * D + d] = out;
    else
      o[row * D + d] = detail::from_f32<T>(out);
    if (d == 0 && a.lse) a.lse[row] = mx == -INFINITY ? -INFINITY : (mx + log2f(sum)) * kLn2;
  }
}

int lanes_per_key(int head_dim) {
  int lpt = 1;
  while (lpt * 8 < head_dim) lpt *= 2;
  return lpt;
}

int heads_per_cta(int group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kMaxGroup;
}

template <typename T, int LPT, bool kFp8>
void launch_lpt(const GenericArgs& a, dim3 grid, int gt, cudaStream_t stream) {
  switch (gt) {
    case 1:
      paged_generic_kernel<T, LPT, 1, kFp8><<<grid, kThreads, 0, stream>>>(a);
      break;
    case 2:
      paged_generic_kernel<T, LPT, 2, kFp8><<<grid, kThreads, 0, stream>>>(a);
      break;
    case 4:
      paged_generic_kernel<T, LPT, 4, kFp8><<<grid, kThreads, 0, stream>>>(a);
      break;
    default:
      paged_generic_kernel<T, LPT, 8, kFp8><<<grid, kThreads, 0, stream>>>(a);
      break;
  }
  LONGCTX_CUDA_CHECK_LAUNCH("paged_generic_kernel");
}

template <typename T, bool kFp8>
void launch_typed(const GenericArgs& a, dim3 grid, int gt, cudaStream_t stream) {
  switch (lanes_per_key(a.head_dim)) {
    case 1:
      return launch_lpt<T, 1, kFp8>(a, grid, gt, stream);
    case 2:
      return launch_lpt<T, 2, kFp8>(a, grid, gt, stream);
    case 4:
      return launch_lpt<T, 4, kFp8>(a, grid, gt, stream);
    case 8:
      return launch_lpt<T, 8, kFp8>(a, grid, gt, stream);
    case 16:
      return launch_lpt<T, 16, kFp8>(a, grid, gt, stream);
    default:
      return launch_lpt<T, 32, kFp8>(a, grid, gt, stream);
  }
}

template <typename T>
void launch_format(const GenericArgs& a, dim3 grid, int gt, KvCacheFormat format,
                   cudaStream_t stream) {
  switch (format) {
    case KvCacheFormat::kFp8E4M3:
      return launch_typed<T, true>(a, grid, gt, stream);
    case KvCacheFormat::kDtype:
      return launch_typed<T, false>(a, grid, gt, stream);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool paged_generic_supported(const PagedPrefillParams& p) {
  if (p.num_qo_heads <= 0 || p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0)
    return false;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int gt = heads_per_cta(group);
  const int64_t grid_y = int64_t(p.num_kv_heads) * ((group + gt - 1) / gt);
  return p.head_dim >= 8 && p.head_dim <= 256 && p.head_dim % 8 == 0 &&
         (p.dtype == DType::kBF16 || p.dtype == DType::kF16) && p.page_size >= 1 &&
         (p.mask_mode == MaskMode::kNone || p.mask_mode == MaskMode::kCausal) && p.sm_scale > 0.f &&
         p.window >= 0 && (p.window == 0 || p.mask_mode == MaskMode::kCausal) &&
         grid_y <= kMaxGridY &&
         (p.block_mask == nullptr || p.block_mask_heads == 1 ||
          p.block_mask_heads == p.num_qo_heads);
}

void paged_generic_run(const PagedPrefillParams& p, int total_q, cudaStream_t stream) {
  using E = ErrorCode;
  LONGCTX_CHECK(paged_generic_supported(p), E::kUnsupported,
                "paged generic attention: unsupported params (head_dim {}: want 8..256, a "
                "multiple of 8; dtype {}; heads {}/{}; page_size {}; sm_scale {}; "
                "block_mask_heads {})",
                p.head_dim, dtype_name(p.dtype), p.num_qo_heads, p.num_kv_heads, p.page_size,
                p.sm_scale, p.block_mask_heads);
  LONGCTX_CHECK(total_q >= 0 && p.batch_size >= 0 && (p.batch_size > 0 || total_q == 0),
                E::kInvalidArgument,
                "paged generic attention: total_q {} / batch_size {} (total_q must be "
                "qo_indptr[batch_size])",
                total_q, p.batch_size);
  if (total_q == 0) return;
  LONGCTX_CHECK(p.q && p.k_cache && p.v_cache && (p.o || p.o_f32) && p.qo_indptr && p.kv_indptr &&
                    p.kv_indices && p.kv_last_page_len && (!p.block_mask || p.block_mask_indptr),
                E::kInvalidArgument,
                "paged generic attention: q, k_cache, v_cache, o (or o_f32), the index arrays (and "
                "block_mask_indptr with a block_mask) must be non-null");
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kDtype || (p.k_scale && p.v_scale),
                E::kInvalidArgument,
                "paged generic attention: an FP8 KV cache needs k_scale and v_scale");
  LONGCTX_CHECK(aligned16(p.q) && aligned16(p.k_cache) && aligned16(p.v_cache), E::kInvalidArgument,
                "paged generic attention: q, k_cache and v_cache must be 16-byte aligned");
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int gt = heads_per_cta(group);
  const int head_tiles = (group + gt - 1) / gt;
  GenericArgs a{p.q,
                p.k_cache,
                p.v_cache,
                p.o,
                p.o_f32,
                p.lse,
                p.qo_indptr,
                p.kv_indptr,
                p.kv_indices,
                p.kv_last_page_len,
                p.block_mask,
                p.block_mask_indptr,
                p.block_mask_heads,
                p.batch_size,
                p.num_qo_heads,
                p.num_kv_heads,
                p.head_dim,
                group,
                head_tiles,
                p.page_size,
                p.mask_mode == MaskMode::kCausal,
                p.window,
                p.sm_scale * kLog2e,
                p.k_scale,
                p.v_scale};
  const dim3 grid(unsigned(total_q), unsigned(p.num_kv_heads * head_tiles));
  if (p.dtype == DType::kBF16) {
    launch_format<__nv_bfloat16>(a, grid, gt, p.kv_format, stream);
  } else {
    launch_format<__half>(a, grid, gt, p.kv_format, stream);
  }
}

}  // namespace longctx::kernels::cuda
