// XAttention's estimate and selection (see xattention.h for the interface).
//
// The estimate is a GEMM per q head: A = the query groups with their S rows reversed, B = the key
// groups, both [groups][S * head_dim], a(r, c) = A[r] . B[c]. A CTA (8 warps, 4 x 2, each 32 rows
// x 64 columns) takes 128 rows (the q heads of one KV head x their query groups, so a K tile
// serves the whole GQA group) x 128 key groups per tile and runs the inner dimension as S slices
// of head_dim: slice s is query rows r S + S - 1 - s against key rows c S + s, gathered through
// the page table with cp.async into a 3-stage XOR-swizzled ring and multiplied with mma.sync
// m16n8k16 (ldmatrix fragments, fp32 accumulation). After a tile's last slice each row's scores
// are reduced per key block of 128 / S groups (a quad of lanes holds a row's 8 columns of an n8
// tile) to a log-sum-exp, in the log2 domain with the scale folded in. Key tiles past the tile's
// last visible group are never visited. Measured on the H200 at 128K (docs/benchmarks.md), in
// TFLOP/s of the estimate's GEMM: this tiling 170; 64 rows x 128 with 2 stages 152; 128 x 256
// with 4 stages of 64 columns 141 (fewer bytes per FLOP, but one CTA of 8 warps with 128
// accumulators each hides less latency). wgmma is the next step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/mma_device.cuh"
#include "kernels/cuda/xattention.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {
namespace {

using namespace detail;  // NOLINT: the PTX wrappers of mma_device.cuh

constexpr int kRows = kXAttnEstimateRows;  // 128 = 4 warps x 32
constexpr int kCols = 128;                 // key groups per tile = 2 warps x 64
constexpr int kThreads = 256;
constexpr int kSelectThreads = 256;
constexpr int kMaxSelectRows = 1024;  // heads_per_mask x 128 / stride rows of one selection
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ int kv_len_of(const int32_t* kv_indptr, const int32_t* last, int b,
                                         int page_size) {
  const int pages = kv_indptr[b + 1] - kv_indptr[b];
  return pages == 0 ? 0 : (pages - 1) * page_size + last[b];
}

// A pipeline stage holds one slice's 128 query rows and 128 key rows; three stages in flight
// (192 KB at head_dim 128: one CTA per SM; 96 KB at 64: two).
constexpr int kStages = 3;
template <int D, typename T>
constexpr int estimate_smem_bytes() {
  return kStages * (kRows + kCols) * D * int(sizeof(T));
}

template <int D, int S, typename T>
__global__ void __launch_bounds__(kThreads, D == 64 ? 2 : 1)
    estimate_kernel(XAttnEstimateParams p) {
  static_assert(kSparseBlock % S == 0 && kSparseBlock / S >= 8 && kSparseBlock / S <= 64);
  constexpr int kCpb = kSparseBlock / S;  // key groups per key block: whole n8 tiles of one warp
  constexpr int kTpb = kCpb / 8;          // n8 tiles per key block
  constexpr int kChunks = D / 8;          // 16-byte chunks per row
  constexpr int kStageElems = (kRows + kCols) * D;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);  // [kStages][kRows + kCols][D]

  // The tile's rows: hpt q heads of one KV head x rph query groups (row i: head hq0 + i / rph,
  // group r0 + i % rph), so each K slice feeds every q head of the group.
  const int group = p.num_qo_heads / p.num_kv_heads, hpt = xattn_heads_per_tile(group);
  const int rph = kRows / hpt;
  const int b = p.work_items[2 * blockIdx.x], tile = p.work_items[2 * blockIdx.x + 1];
  const int hq0 = blockIdx.y * hpt, h = hq0 / group;
  const int q0 = p.qo_indptr[b], n = p.qo_indptr[b + 1] - q0;
  const int kv_len = kv_len_of(p.kv_indptr, p.kv_last_page_len, b, p.page_size);
  const int p0 = kv_len - n;
  const int q_groups = (n + S - 1) / S, k_groups = (kv_len + S - 1) / S;
  const int k_blocks = (kv_len + kSparseBlock - 1) / kSparseBlock;
  const int r0 = tile * rph;
  if (r0 >= q_groups) return;
  const int r_last = min(r0 + rph, q_groups) - 1;
  const int vis_max = min(k_groups, p0 / S + r_last + 1);  // groups the last row sees
  const int num_tiles = (vis_max + kCols - 1) / kCols;
  const int total = num_tiles * S;
  const int32_t* pages = p.kv_indices + p.kv_indptr[b];
  const T* qg = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 3, wn = warp >> 2;

  // Stage idx = (key tile kt, slice s): 8 threads per 128-byte run of a row.
  auto load = [&](int idx, int stage) {
    constexpr int kRowsPerPass = kThreads / 8;
    const int kt = idx / S, s = idx - kt * S;
    T* dq = smem + stage * kStageElems;
    T* dk = dq + kRows * D;
#pragma unroll
    for (int rp = 0; rp < kRows / kRowsPerPass; ++rp) {
      const int i = (tid >> 3) + rp * kRowsPerPass, r = r0 + i % rph, qi = r * S + S - 1 - s;
      const bool ok = r < q_groups && qi < n;
      const T* src = qg + (ok ? int64_t(q0 + qi) * p.q_row_stride + int64_t(hq0 + i / rph) * D : 0);
#pragma unroll
      for (int half = 0; half < kChunks / 8; ++half) {
        const int c = (tid & 7) + 8 * half;
        cp_async_16(smem_addr(dq + swz<D>(i, c)), src + c * 8, ok ? 16 : 0);
      }
    }
#pragma unroll
    for (int rp = 0; rp < kCols / kRowsPerPass; ++rp) {
      const int i = (tid >> 3) + rp * kRowsPerPass, kj = (kt * kCols + i) * S + s;
      const bool ok = kj < kv_len;
      int64_t off = 0;
      if (ok) {
        const int64_t page = pages[kj / p.page_size];
        off = ((page * p.page_size + kj % p.page_size) * p.num_kv_heads + h) * D;
      }
#pragma unroll
      for (int half = 0; half < kChunks / 8; ++half) {
        const int c = (tid & 7) + 8 * half;
        cp_async_16(smem_addr(dk + swz<D>(i, c)), kc + off + c * 8, ok ? 16 : 0);
      }
    }
  };

  float acc[2][8][4];
  auto zero = [&] {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0;
  };
  zero();
  const float scale_log2 = p.sm_scale / S * kLog2e;
  const int g = lane >> 2, t4 = lane & 3;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < total) load(st, st);
    cp_async_commit();
  }
  for (int idx = 0; idx < total; ++idx) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage idx landed; every warp is done with stage idx - 1's buffer
    if (idx + kStages - 1 < total) load(idx + kStages - 1, (idx + kStages - 1) % kStages);
    cp_async_commit();
    const T* sq = smem + (idx % kStages) * kStageElems;
    const T* sk = sq + kRows * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4(qa[mt],
                    smem_addr(sq + swz<D>(wm * 32 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4))));
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        uint32_t bf[4];
        const int col = wn * 64 + nj * 16 + ((lane >> 4) << 3) + (lane & 7);
        ldmatrix_x4(bf, smem_addr(sk + swz<D>(col, kk * 2 + ((lane >> 3) & 1))));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          Mma<T>::k16(acc[mt][2 * nj], qa[mt], bf[0], bf[1]);
          Mma<T>::k16(acc[mt][2 * nj + 1], qa[mt], bf[2], bf[3]);
        }
      }
    }
    if (idx % S != S - 1) continue;

    // Tile kt done: per row and key block the log-sum-exp of the visible scores.
    const int c_warp = (idx / S) * kCols + wn * 64;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = wm * 32 + mt * 16 + g + 8 * half, r = r0 + i % rph;
        const int vis = min(k_groups, p0 / S + r + 1);
        float* out =
            p.block_lse + p.lse_indptr[b] + (int64_t(hq0 + i / rph) * q_groups + r) * k_blocks;
#pragma unroll
        for (int kb = 0; kb < 8 / kTpb; ++kb) {
          float x[kTpb * 2];
          float m = -INFINITY;
#pragma unroll
          for (int u = 0; u < kTpb; ++u)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = kb * kTpb + u, c = c_warp + j * 8 + 2 * t4 + e;
              const float v = c < vis ? acc[mt][j][2 * half + e] * scale_log2 : -INFINITY;
              x[2 * u + e] = v;
              m = fmaxf(m, v);
            }
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          float sum = 0.f;
          if (m != -INFINITY)
#pragma unroll
            for (int u = 0; u < 2 * kTpb; ++u) sum += fast_exp2(x[u] - m);
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          sum += __shfl_xor_sync(0xffffffffu, sum, 2);
          const int jb = c_warp / kCpb + kb;
          if (t4 == 0 && r < q_groups && jb < k_blocks)
            out[jb] = m == -INFINITY ? -INFINITY : (m + __log2f(sum)) * kLn2;
        }
      }
    zero();
  }
}

// One CTA per (query block, mask group of heads_per_mask q heads). keys: [pow2 >= j_hi + 1]
// sort keys in shared memory.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(XAttnSelectParams p) {
  extern __shared__ unsigned long long keys[];
  __shared__ float row_lse[kMaxSelectRows];  // [heads_per_mask][128 / S]
  __shared__ double part[kSelectThreads];
  __shared__ double sums[2];  // the row's total mass, the forced blocks' mass
  const int b = p.work_items[2 * blockIdx.x], i = p.work_items[2 * blockIdx.x + 1];
  const int hpm = p.heads_per_mask, h0 = blockIdx.y * hpm, tid = threadIdx.x, S = p.stride;
  const int cpb = kSparseBlock / S;
  const int n = p.q_lens[b], kv_len = p.kv_lens[b], p0 = kv_len - n;
  const int q_blocks = (n + kSparseBlock - 1) / kSparseBlock;
  const int k_blocks = (kv_len + kSparseBlock - 1) / kSparseBlock;
  const int j_lo = (p0 + i * kSparseBlock) / kSparseBlock;
  const int j_hi = (p0 + min(n, (i + 1) * kSparseBlock) - 1) / kSparseBlock;
  // Head u of the group's row: out + u * head_stride.
  uint8_t* out = p.block_mask + p.mask_indptr[b] + (int64_t(h0) * q_blocks + i) * k_blocks;
  const int64_t head_stride = int64_t(q_blocks) * k_blocks;
  // xattn_dense(n, kv_len, min_kv_len) (host-only) or the dense tail.
  const bool dense = n <= 1 || k_blocks <= 2 || kv_len < p.min_kv_len ||
                     min(n, (i + 1) * kSparseBlock) > n - p.dense_tail;
  for (int j = tid; j < k_blocks; j += kSelectThreads)
    out[j] = j <= j_hi && (dense || j == 0 || j >= j_lo) ? 1 : 0;
  if (tid == 0 && p.counters != nullptr) {
    const int n_forced = dense ? j_hi + 1 : 1 + j_hi - max(j_lo, 1) + 1;
    atomicAdd(&p.counters[0], static_cast<unsigned long long>(n_forced) * hpm);
    atomicAdd(&p.counters[1], static_cast<unsigned long long>(j_hi + 1) * hpm);
  }
  if (dense) {
    for (int u = 1; u < hpm; ++u)
      for (int j = tid; j < k_blocks; j += kSelectThreads) out[u * head_stride + j] = j <= j_hi;
    return;
  }

  const int q_groups = (n + S - 1) / S, k_groups = (kv_len + S - 1) / S;
  const int row0 = i * (kSparseBlock / S), rows = min(q_groups, row0 + kSparseBlock / S) - row0;
  // Row (u, rr): q head h0 + u, query group row0 + rr.
  const float* lse = p.block_lse + p.lse_indptr[b] + int64_t(h0) * q_groups * k_blocks;
  auto row_of = [&](int ur) {
    return lse + (int64_t(ur / rows) * q_groups + row0 + ur % rows) * k_blocks;
  };
  auto last_block = [&](int r) { return (min(k_groups, p0 / S + r + 1) - 1) / cpb; };
  const int warp = tid >> 5, lane = tid & 31;
  for (int ur = warp; ur < hpm * rows; ur += kSelectThreads / 32) {
    const float* row = row_of(ur);
    const int last = last_block(row0 + ur % rows);
    float m = -INFINITY;
    for (int j = lane; j <= last; j += 32) m = fmaxf(m, row[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.f;
    if (m != -INFINITY)
      for (int j = lane; j <= last; j += 32) s += __expf(row[j] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) row_lse[ur] = m == -INFINITY ? -INFINITY : m + __logf(s);
  }
  __syncthreads();

  int pow2 = 1;
  while (pow2 < j_hi + 1) pow2 <<= 1;
  double total = 0, forced = 0;
  for (int j = tid; j < pow2; j += kSelectThreads) {
    unsigned long long key = 0;
    if (j <= j_hi) {
      float mass = 0.f;
      for (int ur = 0; ur < hpm * rows; ++ur)
        if (row_lse[ur] != -INFINITY && j <= last_block(row0 + ur % rows))
          mass += __expf(row_of(ur)[j] - row_lse[ur]);
      total += mass;
      if (j == 0 || j >= j_lo)
        forced += mass;
      else  // descending mass, then ascending j
        key = (static_cast<unsigned long long>(__float_as_uint(mass)) << 32) |
              (0xffffffffu - static_cast<unsigned>(j));
    }
    keys[j] = key;
  }
  // The two sums, in a fixed order (deterministic).
  for (int which = 0; which < 2; ++which) {
    part[tid] = which == 0 ? total : forced;
    __syncthreads();
    for (int o = kSelectThreads / 2; o > 0; o >>= 1) {
      if (tid < o) part[tid] += part[tid + o];
      __syncthreads();
    }
    if (tid == 0) sums[which] = part[0];
    __syncthreads();
  }
  // Bitonic sort, descending.
  for (int k = 2; k <= pow2; k <<= 1)
    for (int jj = k >> 1; jj > 0; jj >>= 1) {
      for (int t = tid; t < pow2; t += kSelectThreads) {
        const int x = t ^ jj;
        if (x > t) {
          const unsigned long long a = keys[t], c = keys[x];
          if (((t & k) == 0) ? a < c : a > c) keys[t] = c, keys[x] = a;
        }
      }
      __syncthreads();
    }
  // Take sorted entry t while forced + (mass before t) < threshold x total: each thread scans a
  // contiguous segment after an exclusive scan of the segment sums.
  const int rest = max(0, j_lo - 1);
  const int seg = (rest + kSelectThreads - 1) / kSelectThreads;
  const int t0 = min(rest, tid * seg), t1 = min(rest, t0 + seg);
  double mine = 0;
  for (int t = t0; t < t1; ++t) mine += __uint_as_float(static_cast<unsigned>(keys[t] >> 32));
  part[tid] = mine;
  __syncthreads();
  if (tid == 0) {
    double run = 0;
    for (int t = 0; t < kSelectThreads; ++t) {
      const double v = part[t];
      part[t] = run;
      run += v;
    }
  }
  __syncthreads();
  const double need = p.threshold * sums[0];
  double kept = sums[1] + part[tid];
  int taken = 0;
  for (int t = t0; t < t1 && kept < need; ++t, ++taken) {
    out[0xffffffffu - static_cast<unsigned>(keys[t])] = 1;
    kept += __uint_as_float(static_cast<unsigned>(keys[t] >> 32));
  }
  if (taken > 0 && p.counters != nullptr)
    atomicAdd(&p.counters[0], static_cast<unsigned long long>(taken) * hpm);
  if (hpm == 1) return;
  __syncthreads();  // the group's row is final: copy it to the other q heads
  for (int u = 1; u < hpm; ++u)
    for (int j = tid; j < k_blocks; j += kSelectThreads) out[u * head_stride + j] = out[j];
}

constexpr int kGatherThreads = 128;
constexpr int kGatherUnroll = 4;  // 16-byte loads in flight per thread (the source may be host)

// One CTA per (item, KV head): which of the block's key blocks of 128 the KV head's q heads keep
// (over every query block), then head h's rows of those, 16 bytes a lane.
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(XAttnGatherParams p) {
  const int* it = p.items + 4 * blockIdx.x;
  const int b = it[0], h = blockIdx.y, tid = threadIdx.x;
  const int kv = p.kv_lens[b], n = p.q_lens[b];
  const int t0 = it[1] * p.block_size, t1 = min(t0 + p.block_size, kv);
  if (t0 >= t1) return;
  const int nqb = (n + kSparseBlock - 1) / kSparseBlock,
            nkb = (kv + kSparseBlock - 1) / kSparseBlock;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const uint8_t* m = p.block_mask + p.mask_indptr[b];
  const int es = p.dtype == DType::kF32 ? 4 : 2;
  const int vecs = p.head_dim * es / 16;  // 16-byte vectors of one head's row
  const int64_t row_vecs = int64_t(p.num_kv_heads) * vecs;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.src) +
                                                    int64_t(it[2]) * p.block_stride) +
                     h * vecs;
  uint4* dst = reinterpret_cast<uint4*>(static_cast<char*>(p.dst) +
                                        (it[3] + p.dst_block_offset) * p.block_stride) +
               h * vecs;
  int copied = 0;
  for (int kb = t0 / kSparseBlock; kb <= (t1 - 1) / kSparseBlock; ++kb) {
    int keep = 0;
    for (int x = tid; x < group * nqb && !keep; x += kGatherThreads)
      keep = m[(int64_t(h * group + x / nqb) * nqb + x % nqb) * nkb + kb] != 0;
    if (!__syncthreads_or(keep)) continue;
    const int r0 = max(t0, kb * kSparseBlock) - t0, r1 = min(t1, (kb + 1) * kSparseBlock) - t0;
    const int total = (r1 - r0) * vecs;
    for (int v0 = tid; v0 < total; v0 += kGatherThreads * kGatherUnroll) {
      uint4 x[kGatherUnroll];
#pragma unroll
      for (int u = 0; u < kGatherUnroll; ++u) {
        const int v = v0 + u * kGatherThreads;
        if (v < total) x[u] = src[(r0 + v / vecs) * row_vecs + v % vecs];
      }
#pragma unroll
      for (int u = 0; u < kGatherUnroll; ++u) {
        const int v = v0 + u * kGatherThreads;
        if (v < total) dst[(r0 + v / vecs) * row_vecs + v % vecs] = x[u];
      }
    }
    copied += total * 16;
  }
  if (tid == 0 && p.bytes_copied != nullptr && copied > 0)
    atomicAdd(p.bytes_copied, static_cast<unsigned long long>(copied));
}

template <int D, int S, typename T>
void launch_estimate(const XAttnEstimateParams& p, cudaStream_t stream) {
  constexpr int smem = estimate_smem_bytes<D, T>();
  require_dynamic_smem(estimate_kernel<D, S, T>, smem);
  const int hpt = xattn_heads_per_tile(p.num_qo_heads / p.num_kv_heads);
  estimate_kernel<D, S, T>
      <<<dim3(p.num_work_items, p.num_qo_heads / hpt), kThreads, smem, stream>>>(p);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

template <int D, typename T>
void launch_estimate_s(const XAttnEstimateParams& p, cudaStream_t stream) {
  switch (p.stride) {
    case 2:
      return launch_estimate<D, 2, T>(p, stream);
    case 4:
      return launch_estimate<D, 4, T>(p, stream);
    case 8:
      return launch_estimate<D, 8, T>(p, stream);
    default:
      return launch_estimate<D, 16, T>(p, stream);
  }
}

}  // namespace

bool xattn_stride_supported(int s) { return s == 2 || s == 4 || s == 8 || s == 16; }

XAttnPlan xattn_plan(const int32_t* qo_indptr, const int32_t* kv_len, int batch, int hq, int hkv,
                     int stride, int64_t min_kv_len) {
  LONGCTX_CHECK(hkv > 0 && hq % hkv == 0, ErrorCode::kUnsupported,
                "xattention: {} q heads are not a multiple of {} kv heads", hq, hkv);
  const int rph = kRows / xattn_heads_per_tile(hq / hkv);
  LONGCTX_CHECK(xattn_stride_supported(stride), ErrorCode::kUnsupported,
                "--xattn-stride {} on the GPU: the estimate kernel takes 2, 4, 8 or 16", stride);
  XAttnPlan plan;
  plan.lse_indptr.assign(static_cast<size_t>(batch) + 1, 0);
  plan.mask_indptr.assign(static_cast<size_t>(batch) + 1, 0);
  for (int b = 0; b < batch; ++b) {
    const int n = qo_indptr[b + 1] - qo_indptr[b], kv = kv_len[b];
    LONGCTX_CHECK(n >= 0 && n <= kv, ErrorCode::kInvalidArgument,
                  "xattention: request {} has {} queries for {} keys", b, n, kv);
    LONGCTX_CHECK(kv <= kXAttnMaxKvLen, ErrorCode::kUnsupported,
                  "xattention on the GPU: {} keys in request {}; the selection takes up to {}", kv,
                  b, kXAttnMaxKvLen);
    const int64_t kb = xattn_blocks(kv), qb = xattn_blocks(n);
    const bool dense = xattn_dense(n, kv, min_kv_len);
    const int64_t groups = xattn_q_groups(n, stride);
    plan.lse_indptr[b + 1] = plan.lse_indptr[b] + (dense ? 0 : int64_t(hq) * groups * kb);
    plan.mask_indptr[b + 1] = plan.mask_indptr[b] + int64_t(hq) * qb * kb;
    plan.max_k_blocks = std::max<int>(plan.max_k_blocks, static_cast<int>(kb));
    if (!dense)  // the last row tiles see the most keys: first
      for (int64_t t = (groups + rph - 1) / rph - 1; t >= 0; --t)
        plan.estimate_items.insert(plan.estimate_items.end(), {b, static_cast<int32_t>(t)});
    for (int64_t i = 0; i < qb; ++i)
      plan.select_items.insert(plan.select_items.end(), {b, static_cast<int32_t>(i)});
  }
  return plan;
}

bool xattn_estimate_supported(const XAttnEstimateParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128) &&
         (p.dtype == DType::kBF16 || p.dtype == DType::kF16) && p.num_kv_heads > 0 &&
         p.num_qo_heads % p.num_kv_heads == 0 && xattn_stride_supported(p.stride) &&
         p.page_size >= 1 && p.q_row_stride % 8 == 0 && p.sm_scale > 0;
}

void xattn_estimate_run(const XAttnEstimateParams& p, cudaStream_t stream) {
  LONGCTX_CHECK(xattn_estimate_supported(p), ErrorCode::kUnsupported,
                "xattention estimate: no kernel for head_dim {}, {}, {} q / {} kv heads, stride {}",
                p.head_dim, dtype_name(p.dtype), p.num_qo_heads, p.num_kv_heads, p.stride);
  if (p.num_work_items == 0) return;
  const bool bf16 = p.dtype == DType::kBF16;
  if (p.head_dim == 64)
    bf16 ? launch_estimate_s<64, __nv_bfloat16>(p, stream)
         : launch_estimate_s<64, __half>(p, stream);
  else
    bf16 ? launch_estimate_s<128, __nv_bfloat16>(p, stream)
         : launch_estimate_s<128, __half>(p, stream);
}

void xattn_select_run(const XAttnSelectParams& p, int max_k_blocks, cudaStream_t stream) {
  LONGCTX_CHECK(xattn_stride_supported(p.stride) && p.threshold > 0 && p.threshold <= 1 &&
                    p.heads_per_mask >= 1 && p.num_qo_heads % p.heads_per_mask == 0 &&
                    p.heads_per_mask * kSparseBlock / p.stride <= kMaxSelectRows,
                ErrorCode::kInvalidArgument,
                "xattention select: stride {}, threshold {}, {} heads per mask of {}", p.stride,
                p.threshold, p.heads_per_mask, p.num_qo_heads);
  if (p.num_work_items == 0) return;
  int pow2 = 1;
  while (pow2 < max_k_blocks) pow2 <<= 1;
  const int smem = pow2 * static_cast<int>(sizeof(unsigned long long));
  require_dynamic_smem(select_kernel, smem);
  select_kernel<<<dim3(p.num_work_items, p.num_qo_heads / p.heads_per_mask), kSelectThreads, smem,
                  stream>>>(p);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

bool xattn_gather_supported(const XAttnGatherParams& p) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  return p.num_kv_heads > 0 && p.num_qo_heads % p.num_kv_heads == 0 && p.block_size > 0 &&
         (p.head_dim * es) % 16 == 0 && p.block_stride % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.dst) % 16 == 0 &&
         (p.dtype == DType::kBF16 || p.dtype == DType::kF16 || p.dtype == DType::kF32);
}

void xattn_gather_run(const XAttnGatherParams& p, cudaStream_t stream) {
  LONGCTX_CHECK(xattn_gather_supported(p), ErrorCode::kUnsupported,
                "xattention gather: head_dim {} of {}, {} q / {} kv heads, block stride {}",
                p.head_dim, dtype_name(p.dtype), p.num_qo_heads, p.num_kv_heads, p.block_stride);
  if (p.num_items == 0) return;
  gather_kernel<<<dim3(p.num_items, p.num_kv_heads), kGatherThreads, 0, stream>>>(p);
  LONGCTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace longctx::kernels::cuda
