// Paged batch prefill, FlashAttention-2 style (see prefill.h for the interface).
//
// One CTA = 4 warps = one tile of 128 packed rows (row r of request b: token r / group, q head
// kv_head * group + r % group) for one kv head; each warp owns 32 rows (two 16-row m-tiles).
// The CTA walks the key tiles (64 keys each) that its rows may see, gathering each K/V tile
// through the page table with cp.async into a double buffer (tile i+1 loads while tile i
// computes). Per tile:
//   S = Q K^T    mma.sync m16n8k16 (Q and K fragments via ldmatrix from shared memory),
//   online softmax in fp32 (exp2 with the scale folded in), masking only on boundary tiles,
//   O += P V     mma.sync (P straight from the S accumulators, V via ldmatrix.trans).
// Shared-memory tiles are XOR-swizzled by 16-byte chunk so ldmatrix and cp.async are free of
// bank conflicts. Causal: key tiles past the tile's last token are never visited. Block-sparse:
// the CTA first ORs the mask bytes of its (head, query block) rows into a bitmap of needed key
// blocks and skips the others; rows are then masked element-wise for exactness.
// Plain mma.sync (no wgmma/TMA), so the same code runs on sm_80 and sm_90a; on sm_90,
// paged_prefill_run() uses the wgmma kernel of prefill_sm90.cu instead (head_dim 256 with an FP8
// cache, or PrefillKernel::kFa2, still runs here).
// FP8 caches (kv_format kFp8E4M3, head_dim 64 / 128) take the Hopper kernel where 16-bit ones do
// (its producer converts, prefill_sm90.cu), else this kernel with a converting loader (kFp8): K/V
// codes (16 bytes = 16 codes per copy) and each key's page scales go by cp.async into a double
// buffer of FP8 tiles, and when a tile has landed the CTA converts it into one 16-bit K/V tile in
// the same swizzled layout (exact: code times a power-of-two scale), which the unchanged mma.sync
// compute reads; the shared memory is the 16-bit kernel's plus 1 KB of scales.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/block_sparse_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/mma_device.cuh"
#include "kernels/cuda/prefill.h"
#include "kernels/cuda/prefill_sm90.h"
#include "kernels/cuda/workspace.h"
#include "kernels/prefill_schedule.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {
namespace {

using namespace detail;  // NOLINT: the PTX wrappers of mma_device.cuh

constexpr int kRows = kPrefillTileRows;  // 128 = 32 rows x 4 warps
constexpr int kKeys = kPrefillTileKeys;  // 64, the plan's cost unit
// Block-sparse bitmap of needed key blocks: 1024 words cover 32768 blocks = 4M keys.
constexpr int kMaskWords = 1024;
constexpr int64_t kMaxSparseKv = int64_t(kMaskWords) * 32 * kSparseBlock;

// ---- the kernel -----------------------------------------------------------------------------

// Tiling: MT 16-row m-tiles per warp and KEYS keys per K/V tile, always 128 rows per CTA (plans
// do not depend on it). Measured on H200 (causal S = 32K, 32/8 heads, head_dim 128, bf16):
//   MT = 2, KEYS = 64, Q re-read from shared memory            290 TFLOP/s  (used)
//   MT = 2, KEYS = 32                                          281
//   and in an earlier build (scale not folded, a page lookup per 16-byte chunk):
//   MT = 2, KEYS = 64                                          251
//   MT = 1 (8 warps x 16 rows), KEYS = 64, Q in registers      224
// MT = 2 wins because each K/V fragment read from shared memory feeds two MMAs (shared-memory
// bandwidth, not the tensor cores, bounds mma.sync attention on Hopper). Holding Q in registers
// as well does not fit next to the 32-row O accumulators (255 registers, spills).
template <int MT, int KEYS>
struct Tiling {
  static constexpr int kMt = MT, kKeys = KEYS;
  static constexpr int kWarps = 8 / MT;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = 16 * MT;
  static_assert(kWarps * kWarpRows == kRows && kSparseBlock % KEYS == 0);
};
using DefaultTiling = Tiling<2, 64>;
// head_dim 256 (Gemma 3): 32 rows per warp would need 256 fp32 O accumulators per thread, so
// 8 warps take 16 rows each (128 O registers); the 128-row Q tile plus two 64-key K/V stages
// fill 196 KB of shared memory, one CTA per SM.
using HeadDim256Tiling = Tiling<1, 64>;

template <int D, typename T, typename Tl, bool kFp8>
__global__ void __launch_bounds__(Tl::kThreads, (D == 64 || Tl::kMt == 2) ? 2 : 1)
    paged_prefill_kernel(const PagedPrefillParams p, const int32_t* __restrict__ work) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int MT = Tl::kMt, KEYS = Tl::kKeys, kThreads = Tl::kThreads;
  // 16-bit K/V stages: two (double buffer); FP8: one, converted from a double buffer of codes.
  constexpr int kStages16 = kFp8 ? 1 : 2;
  extern __shared__ __align__(128) uint8_t smem[];
  T* s_q = reinterpret_cast<T*>(smem);                                     // [kRows][D]
  T* s_k = s_q + kRows * D;                                                // [kStages16][KEYS][D]
  T* s_v = s_k + kStages16 * KEYS * D;                                     // [kStages16][KEYS][D]
  uint8_t* f_k = reinterpret_cast<uint8_t*>(s_v + kStages16 * KEYS * D);   // FP8: [2][KEYS][D]
  uint8_t* f_v = f_k + (kFp8 ? 2 * KEYS * D : 0);                          // FP8: [2][KEYS][D]
  float* f_s = reinterpret_cast<float*>(f_v + (kFp8 ? 2 * KEYS * D : 0));  // FP8: [2][KEYS][2]
  uint32_t* s_bits = reinterpret_cast<uint32_t*>(f_s + (kFp8 ? 4 * KEYS : 0));  // [kMaskWords]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.x % p.num_kv_heads;
  const int item = blockIdx.x / p.num_kv_heads;
  const int b = work[2 * item], tile = work[2 * item + 1];
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int q_start = p.qo_indptr[b];
  const int q_len = p.qo_indptr[b + 1] - q_start;
  const int n_pages = p.kv_indptr[b + 1] - p.kv_indptr[b];
  const int kv_len = n_pages == 0 ? 0 : (n_pages - 1) * p.page_size + p.kv_last_page_len[b];
  const int32_t* __restrict__ pages = p.kv_indices + p.kv_indptr[b];
  const int num_rows = q_len * group;
  const int row0 = tile * kRows;
  const int tok_min = row0 / group;
  const int tok_max = (min(row0 + kRows, num_rows) - 1) / group;
  const bool causal = p.mask_mode == MaskMode::kCausal;
  const T* __restrict__ q = static_cast<const T*>(p.q);
  using KV = std::conditional_t<kFp8, uint8_t, T>;  // a cache element
  const KV* __restrict__ kc = static_cast<const KV*>(p.k_cache);
  const KV* __restrict__ vc = static_cast<const KV*>(p.v_cache);

  // Keys [0, kv_end) are the most any row of this tile sees; [0, full_end) every row sees.
  int kv_end = kv_len, full_end = kv_len;
  if (causal) {
    kv_end = min(kv_len, max(0, kv_len - q_len + tok_max + 1));
    full_end = min(kv_len, max(0, kv_len - q_len + tok_min + 1));
  }
  const int num_tiles = (kv_end + KEYS - 1) / KEYS;
  // Sliding window: no row of the tile sees a key before its first row's window (whole tiles
  // before it are not read); keys before win_all, its last row's first key, need the mask.
  const bool windowed = causal && p.window > 0;
  const int kt_first = windowed ? window_first_key(kv_len - q_len + tok_min, p.window) / KEYS : 0;
  const int win_all = windowed ? window_first_key(kv_len - q_len + tok_max, p.window) : 0;

  // This thread's rows: g and g + 8 of each of its warp's MT m-tiles.
  const int g = lane >> 2, t4 = lane & 3;
  const int warp_row0 = warp * Tl::kWarpRows;
  const bool sparse = p.block_mask != nullptr;
  const int nqb = (q_len + kSparseBlock - 1) / kSparseBlock;
  const int nkb = (kv_len + kSparseBlock - 1) / kSparseBlock;
  const uint8_t* mask_base = sparse ? p.block_mask + p.block_mask_indptr[b] : nullptr;
  // Last visible key of tile row r (-1: padding row), its first one (a window's) and, when
  // block-sparse, whether key block kb is on for it. Recomputed on masked tiles only, to keep
  // registers for the accumulators.
  auto row_limit = [&](int r, int kb, bool& blk, int& first) -> int {
    const int pr = row0 + r;
    blk = true;
    first = 0;
    if (pr >= num_rows) return -1;
    const int tok = pr / group;
    if (windowed) first = window_first_key(kv_len - q_len + tok, p.window);
    if (sparse) {
      const int mh = p.block_mask_heads == 1 ? 0 : kvh * group + pr % group;
      blk = mask_base[(int64_t(mh) * nqb + tok / kSparseBlock) * nkb + kb] != 0;
    }
    return causal ? min(kv_len - 1, kv_len - q_len + tok) : kv_len - 1;
  };

  // Block-sparse: bitmap of key blocks any row of the tile needs (superset: all heads of the
  // group x the query blocks the tile touches).
  if (sparse) {
    detail::mark_needed_key_blocks(mask_base, nqb, nkb, (kv_end + kSparseBlock - 1) / kSparseBlock,
                                   p.block_mask_heads == 1 ? 0 : kvh * group,
                                   p.block_mask_heads == 1 ? 1 : group, tok_min / kSparseBlock,
                                   tok_max / kSparseBlock, tid, kThreads, s_bits);
    __syncthreads();
  }
  // First key tile >= kt that some row needs (num_tiles when none).
  auto next_tile = [&](int kt) -> int {
    if (!sparse || kt >= num_tiles) return kt;
    return detail::next_marked_tile<KEYS>(s_bits, kt, num_tiles, kv_end);
  };

  // ---- async loads ----
  {  // Q tile: row r -> (token, head); padding rows zero-filled.
    for (int id = tid; id < kRows * kChunks; id += kThreads) {
      const int r = id / kChunks, c = id % kChunks;
      const int pr = row0 + r;
      const bool ok = pr < num_rows;
      const int tok = ok ? pr / group : 0, h = kvh * group + (ok ? pr % group : 0);
      const T* src = q + ((int64_t(q_start + tok) * p.num_qo_heads + h) * D + c * 8);
      cp_async_16(smem_addr(s_q + swz<D>(r, c)), ok ? src : q, ok ? 16 : 0);
    }
    cp_async_commit();
  }
  // K/V tile: 8 threads per key row (a 128-byte run: coalesced, and conflict-free in the
  // swizzled layout), so each thread looks the page table up once per row it copies.
  // FP8: kChunks8 16-byte chunks (16 codes) per key row, a thread per chunk; the chunk-0 thread
  // of a row also copies the key's K and V page scales (zero-filled past kv_len, as the codes).
  auto load_fp8 = [&](int kt, int stage) {
    constexpr int kChunks8 = D / 16, kRowsPerPass = kThreads / kChunks8;
    static_assert(KEYS % kRowsPerPass == 0);
    const int k0 = kt * KEYS, c = tid % kChunks8;
    uint8_t* dk = f_k + stage * KEYS * D;
    uint8_t* dv = f_v + stage * KEYS * D;
    float* ds = f_s + stage * KEYS * 2;
#pragma unroll
    for (int rp = 0; rp < KEYS / kRowsPerPass; ++rp) {
      const int r = tid / kChunks8 + rp * kRowsPerPass;
      const int key = k0 + r;
      const bool ok = key < kv_len;
      int64_t page = 0, off = 0;
      if (ok) {
        page = pages[key / p.page_size];
        off = ((page * p.page_size + key % p.page_size) * p.num_kv_heads + kvh) * D;
      }
      cp_async_16(smem_addr(dk + r * D + c * 16), kc + off + c * 16, ok ? 16 : 0);
      cp_async_16(smem_addr(dv + r * D + c * 16), vc + off + c * 16, ok ? 16 : 0);
      if (c == 0) {
        const int64_t si = page * p.num_kv_heads + kvh;
        cp_async_4(smem_addr(ds + 2 * r), p.k_scale + si, ok ? 4 : 0);
        cp_async_4(smem_addr(ds + 2 * r + 1), p.v_scale + si, ok ? 4 : 0);
      }
    }
  };
  // FP8: the landed code tile `stage` -> the 16-bit tile (any thread may take any chunk: called
  // after a barrier that follows every thread's wait).
  auto convert_fp8 = [&](int stage) {
    constexpr int kChunks8 = D / 16;
    const uint8_t* fk = f_k + stage * KEYS * D;
    const uint8_t* fv = f_v + stage * KEYS * D;
    const float* fs = f_s + stage * KEYS * 2;
    for (int id = tid; id < KEYS * kChunks8; id += kThreads) {
      const int r = id / kChunks8, c = id % kChunks8;
      uint4 lo, hi;
      fp8x16_to_elements<T>(*reinterpret_cast<const uint4*>(fk + r * D + c * 16), fs[2 * r], lo,
                            hi);
      *reinterpret_cast<uint4*>(s_k + swz<D>(r, 2 * c)) = lo;
      *reinterpret_cast<uint4*>(s_k + swz<D>(r, 2 * c + 1)) = hi;
      fp8x16_to_elements<T>(*reinterpret_cast<const uint4*>(fv + r * D + c * 16), fs[2 * r + 1], lo,
                            hi);
      *reinterpret_cast<uint4*>(s_v + swz<D>(r, 2 * c)) = lo;
      *reinterpret_cast<uint4*>(s_v + swz<D>(r, 2 * c + 1)) = hi;
    }
  };
  auto load_kv = [&](int kt, int stage) {
    if constexpr (kFp8) {
      load_fp8(kt, stage);
      return;
    }
    constexpr int kRowsPerPass = kThreads / 8;
    static_assert(KEYS % kRowsPerPass == 0 && kChunks % 8 == 0);
    const int k0 = kt * KEYS;
    T* dk = s_k + stage * KEYS * D;
    T* dv = s_v + stage * KEYS * D;
#pragma unroll
    for (int rp = 0; rp < KEYS / kRowsPerPass; ++rp) {
      const int r = (tid >> 3) + rp * kRowsPerPass;
      const int key = k0 + r;
      const bool ok = key < kv_len;
      int64_t off = 0;
      if (ok) {
        const int64_t page = pages[key / p.page_size];
        off = ((page * p.page_size + key % p.page_size) * p.num_kv_heads + kvh) * D;
      }
#pragma unroll
      for (int half = 0; half < kChunks / 8; ++half) {
        const int c = (tid & 7) + 8 * half;
        cp_async_16(smem_addr(dk + swz<D>(r, c)), kc + off + c * 8, ok ? 16 : 0);
        cp_async_16(smem_addr(dv + swz<D>(r, c)), vc + off + c * 8, ok ? 16 : 0);
      }
    }
  };

  int kt = next_tile(kt_first);
  if (kt < num_tiles) load_kv(kt, 0);
  cp_async_commit();

  cp_async_wait<1>();  // the Q group
  __syncthreads();
  // A operand of S = Q K^T for m-tile mt, columns [16 kk, 16 kk + 16).
  auto q_frag_addr = [&](int mt, int kk) {
    const int r = warp_row0 + mt * 16 + (lane & 15);
    return smem_addr(s_q + swz<D>(r, kk * 2 + (lane >> 4)));
  };
  float o[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  const float scale_log2 = p.sm_scale * 1.4426950408889634f;

  int stage = 0;
  while (kt < num_tiles) {
    const int nxt = next_tile(kt + 1);
    if (nxt < num_tiles) load_kv(nxt, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (kFp8) {  // the previous tile's compute is done (the barrier at the loop's end)
      convert_fp8(stage);
      __syncthreads();
    }

    const T* sk = s_k + (kFp8 ? 0 : stage) * KEYS * D;
    const T* sv = s_v + (kFp8 ? 0 : stage) * KEYS * D;
    const int k0 = kt * KEYS;

    // S = Q K^T for this warp's rows x KEYS keys; one K fragment feeds MT MMAs.
    float s[MT][KEYS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < KEYS / 8; ++j)
        s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(qa[mt], q_frag_addr(mt, kk));
#pragma unroll
      for (int nj = 0; nj < KEYS / 16; ++nj) {
        uint32_t bf[4];
        const int key = nj * 16 + ((lane >> 4) << 3) + (lane & 7);
        ldmatrix_x4(bf, smem_addr(sk + swz<D>(key, kk * 2 + ((lane >> 3) & 1))));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::k16(s[mt][2 * nj], qa[mt], bf[0], bf[1]);
          Mma<T>::k16(s[mt][2 * nj + 1], qa[mt], bf[2], bf[3]);
        }
      }
    }

    // Mask boundary tiles (causal edge, KV end, block-sparse rows). Scores stay raw: the scale
    // goes into the exp2 FFMA below (sm_scale > 0, so max commutes with it).
    const bool need_mask = sparse || k0 + KEYS > full_end || k0 < win_all;
    if (need_mask) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        bool blk[2];
        int lim[2], first[2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
          lim[i] = row_limit(warp_row0 + mt * 16 + g + i * 8, k0 / kSparseBlock, blk[i], first[i]);
        detail::mask_score_fragment<KEYS>(&s[mt][0][0], k0, t4, first, lim, blk);
      }
    }

    // Online softmax per row; a row's KEYS scores live in the 4 threads of a quad.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = m[mt][i];
#pragma unroll
        for (int j = 0; j < KEYS / 8; ++j)
          mx = fmaxf(mx, fmaxf(s[mt][j][2 * i], s[mt][j][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // All masked so far: base 0 keeps exp2(-inf) = 0 and avoids -inf - -inf = NaN.
        const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
        const float corr = fast_exp2(fmaf(m[mt][i], scale_log2, -base));
        m[mt][i] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < KEYS / 8; ++j) {
          s[mt][j][2 * i] = fast_exp2(fmaf(s[mt][j][2 * i], scale_log2, -base));
          s[mt][j][2 * i + 1] = fast_exp2(fmaf(s[mt][j][2 * i + 1], scale_log2, -base));
          sum += s[mt][j][2 * i] + s[mt][j][2 * i + 1];
        }
        l[mt][i] = l[mt][i] * corr + sum;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          o[mt][j][2 * i] *= corr;
          o[mt][j][2 * i + 1] *= corr;
        }
      }

      // O += P V: P's A fragments come straight from the S accumulator layout; one V fragment
      // feeds MT MMAs.
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bf[4];
        const int key = kk * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
        ldmatrix_x4_trans(bf, smem_addr(sv + swz<D>(key, dn * 2 + (lane >> 4))));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::k16(o[mt][2 * dn], a[mt], bf[0], bf[1]);
          Mma<T>::k16(o[mt][2 * dn + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
    kt = nxt;
    stage ^= 1;
  }
  cp_async_wait<0>();

  // ---- epilogue: normalize, stage this warp's own rows in s_q, store 16-byte chunks ----
  T* out = static_cast<T*>(p.o);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float li = l[mt][i];
      li += __shfl_xor_sync(0xffffffffu, li, 1);
      li += __shfl_xor_sync(0xffffffffu, li, 2);
      const float inv = li > 0.f ? 1.f / li : 0.f;
      const int r = warp_row0 + mt * 16 + g + i * 8;
      const int pr = row0 + r;
      if (p.o_f32) {  // unrounded: straight from the accumulators
        if (pr < num_rows) {
          const int tok = pr / group, h = kvh * group + pr % group;
          float* dst = p.o_f32 + (int64_t(q_start + tok) * p.num_qo_heads + h) * D + t4 * 2;
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<float2*>(dst + j * 8) =
                make_float2(o[mt][j][2 * i] * inv, o[mt][j][2 * i + 1] * inv);
        }
      } else {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          const uint32_t v = Mma<T>::pack(o[mt][j][2 * i] * inv, o[mt][j][2 * i + 1] * inv);
          *reinterpret_cast<uint32_t*>(s_q + swz<D>(r, j) + t4 * 2) = v;
        }
      }
      if (p.lse && t4 == 0 && pr < num_rows) {
        const int tok = pr / group, h = kvh * group + pr % group;
        p.lse[int64_t(q_start + tok) * p.num_qo_heads + h] =
            li > 0.f ? (m[mt][i] * scale_log2 + __log2f(li)) * 0.6931471805599453f : -INFINITY;
      }
    }
  __syncwarp();
  if (p.o_f32) return;
  for (int id = lane; id < Tl::kWarpRows * kChunks; id += 32) {
    const int r = warp_row0 + id / kChunks, c = id % kChunks;
    const int pr = row0 + r;
    if (pr >= num_rows) continue;
    const int tok = pr / group, h = kvh * group + pr % group;
    *reinterpret_cast<uint4*>(out + (int64_t(q_start + tok) * p.num_qo_heads + h) * D + c * 8) =
        *reinterpret_cast<const uint4*>(s_q + swz<D>(r, c));
  }
}

// 16-bit: Q, two K/V stages, the mask bitmap; FP8: Q, one 16-bit K/V stage, two of codes (half
// the bytes each) and their scales, the bitmap.
template <int D, typename Tl, bool kFp8>
constexpr size_t smem_bytes() {
  return size_t(kRows + 4 * Tl::kKeys) * D * 2 + (kFp8 ? 4 * Tl::kKeys * 4 : 0) + kMaskWords * 4;
}

template <int D, typename T, typename Tl, bool kFp8>
void launch_tiling(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  constexpr size_t smem = smem_bytes<D, Tl, kFp8>();
  require_dynamic_smem(paged_prefill_kernel<D, T, Tl, kFp8>, int(smem));
  const int64_t blocks = int64_t(plan.num_work_items) * p.num_kv_heads;
  if (blocks == 0) return;
  paged_prefill_kernel<D, T, Tl, kFp8>
      <<<unsigned(blocks), Tl::kThreads, smem, stream>>>(p, plan.work_items);
  LONGCTX_CUDA_CHECK_LAUNCH("paged_prefill_kernel");
}

template <int D, typename T>
void launch(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  switch (p.kv_format) {
    case KvCacheFormat::kFp8E4M3:
      if constexpr (D <= 128) return launch_tiling<D, T, DefaultTiling, true>(p, plan, stream);
      break;  // paged_prefill_supported refuses FP8 at head_dim 256
    case KvCacheFormat::kDtype:
      if constexpr (D == 256)
        return launch_tiling<D, T, HeadDim256Tiling, false>(p, plan, stream);
      else
        return launch_tiling<D, T, DefaultTiling, false>(p, plan, stream);
  }
}

template <typename T>
void launch_head_dim(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return launch<64, T>(p, plan, stream);
    case 128:
      return launch<128, T>(p, plan, stream);
    default:
      return launch<256, T>(p, plan, stream);
  }
}

}  // namespace

size_t paged_prefill_workspace_bytes(int batch_size, int64_t total_q, int group_size) {
  const int64_t tiles = (total_q * group_size + kRows - 1) / kRows + batch_size;
  return size_t(tiles) * 2 * sizeof(int32_t);
}

namespace {

// Where the split's arrays sit after the work list (all 256-byte aligned), for P CTAs.
struct SplitLayout {
  size_t ranges = 0, merges = 0, lse = 0, o = 0, end = 0;
};
SplitLayout split_layout(size_t start, int head_dim, int num_ctas) {
  const int64_t slots = prefill_split_max_slots(num_ctas);
  SplitLayout l;
  l.ranges = workspace_align(start);
  l.merges = workspace_align(l.ranges + sizeof(int32_t) * kPrefillCtaRangeInts * num_ctas);
  // Sized for the larger tile, so a workspace sized before a plan fits whichever it takes.
  l.lse = workspace_align(l.merges + sizeof(int32_t) * kPrefillMergeGroupInts * num_ctas);
  l.o = workspace_align(l.lse + sizeof(float) * slots * kPrefillMaxTileRows);
  l.end = workspace_align(l.o + sizeof(float) * slots * kPrefillMaxTileRows * head_dim);
  return l;
}

// Whether paged_prefill_run() takes the Hopper kernel: tuning.kernel kSm90 (the default) where
// the device and the binary carry it.
bool use_sm90_path(const PagedPrefillParams& p, const PrefillTuning& tuning) {
  return tuning.kernel == PrefillKernel::kSm90 && paged_prefill_sm90_available(p);
}

// PrefillTuning::unit_heads = n forces the unit order (PrefillPlan::unit_heads) to the largest
// divisor of num_kv_heads up to n, split or not (measurement); 0: the plan chooses.
int forced_unit_heads(int num_kv_heads, int want_heads) {
  if (want_heads <= 0) return 0;
  int want = std::clamp(want_heads, 1, num_kv_heads);
  while (num_kv_heads % want != 0) --want;
  return want;
}

}  // namespace

bool paged_prefill_sm90_path(int head_dim, const PrefillTuning& tuning) {
  PagedPrefillParams probe;
  probe.head_dim = head_dim;
  return use_sm90_path(probe, tuning);
}

int paged_prefill_tile_rows(int head_dim, const PrefillTuning& tuning) {
  static_assert(kPrefillTileRows == 128 && kPrefillMaxTileRows == 192);  // prefill_tile_rows
  return prefill_tile_rows(head_dim, head_dim == 64 && paged_prefill_sm90_path(head_dim, tuning),
                           tuning);
}

size_t paged_prefill_split_workspace_bytes(int head_dim, int num_sms) {
  if (num_sms <= 0) num_sms = current_sm_count();
  return split_layout(0, head_dim, num_sms).end + 256;  // + the alignment of the start
}

PrefillPlan paged_prefill_plan(const int32_t* qo_indptr_host, const int32_t* kv_len_host,
                               int batch_size, int num_qo_heads, int num_kv_heads, int head_dim,
                               MaskMode mask_mode, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream, const PrefillTuning& tuning) {
  using E = ErrorCode;
  LONGCTX_CHECK(num_kv_heads > 0 && num_qo_heads > 0 && num_qo_heads % num_kv_heads == 0,
                E::kUnsupported,
                "paged prefill plan: num_qo_heads {} not a multiple of "
                "num_kv_heads {}",
                num_qo_heads, num_kv_heads);
  LONGCTX_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256, E::kUnsupported,
                "paged prefill plan: head_dim {} (supported: 64, 128, 256)", head_dim);
  LONGCTX_CHECK(
      tuning.head_dim64_rows == kPrefillTileRows || tuning.head_dim64_rows == kPrefillMaxTileRows,
      E::kInvalidArgument, "paged prefill plan: head_dim64_rows {} (128 or 192)",
      tuning.head_dim64_rows);
  const int group = num_qo_heads / num_kv_heads;
  const int tile_rows = paged_prefill_tile_rows(head_dim, tuning);
  const std::vector<PrefillWorkItem> items =
      prefill_work_items(qo_indptr_host, kv_len_host, batch_size, group, tile_rows,
                         mask_mode == MaskMode::kCausal, kKeys, kMaxSparseKv);
  std::vector<int32_t> flat;
  flat.reserve(items.size() * 2);
  for (const PrefillWorkItem& it : items) {
    flat.push_back(it.b);
    flat.push_back(it.tile);
  }
  const size_t bytes = flat.size() * sizeof(int32_t);
  LONGCTX_CHECK(bytes <= workspace_bytes, E::kInvalidArgument,
                "paged prefill plan: workspace of {} bytes, need {}", workspace_bytes, bytes);
  LONGCTX_CHECK(int64_t(items.size()) * num_kv_heads < (int64_t(1) << 31), E::kUnsupported,
                "paged prefill plan: {} CTAs is too many for one launch",
                int64_t(items.size()) * num_kv_heads);
  if (bytes > 0) {
    // Pageable source: the copy is staged before cudaMemcpyAsync returns, so `flat` may die.
    LONGCTX_CUDA_CHECK(
        cudaMemcpyAsync(workspace, flat.data(), bytes, cudaMemcpyHostToDevice, stream));
  }
  PrefillPlan plan;
  plan.num_work_items = int(items.size());
  plan.work_items = static_cast<const int32_t*>(workspace);
  plan.tile_rows = tile_rows;
  plan.num_qo_heads = num_qo_heads;
  plan.num_kv_heads = num_kv_heads;
  plan.head_dim = head_dim;
  plan.mask_mode = mask_mode;
  plan.unit_heads = num_kv_heads;
  plan.tuning = tuning;

  // The Hopper kernel's unit order and stream-K split (where the workspace has room for it).
  if (items.empty() || !paged_prefill_sm90_path(head_dim, tuning)) return plan;
  const DeviceProps& device = current_device_props();
  const PrefillScheduleModel model =
      hopper_prefill_schedule_model(device.sm_count, device.l2_bytes);
  // Offsets from the workspace's start (cudaMalloc'ed: 256-byte aligned, as every caller's is).
  const SplitLayout l = split_layout(bytes, head_dim, model.num_ctas);
  const PrefillSplitMode mode = l.end > workspace_bytes ? PrefillSplitMode::kNever : tuning.split;
  int64_t kv_tokens = 0;
  for (int b = 0; b < batch_size; ++b) kv_tokens += kv_len_host[b];
  const PrefillSchedule schedule =
      plan_prefill_schedule(items, num_kv_heads, prefill_sm90_tile_keys(head_dim),
                            kv_tokens * num_kv_heads * head_dim * 4, model, mode,
                            forced_unit_heads(num_kv_heads, tuning.unit_heads));
  plan.unit_heads = schedule.unit_heads;
  const PrefillSplit& split = schedule.split;
  if (split.ctas.empty()) return plan;
  std::vector<int32_t> ranges, merges;
  for (const PrefillCtaRange& r : split.ctas)
    ranges.insert(ranges.end(),
                  {r.unit_begin, r.tile_begin, r.unit_end, r.tile_end, r.slot_first, r.slot_last});
  for (const PrefillMergeGroup& g : split.merges)
    merges.insert(merges.end(), {g.unit, g.slot_begin, g.count});
  char* base = static_cast<char*>(workspace);
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(base + l.ranges, ranges.data(),
                                     sizeof(int32_t) * ranges.size(), cudaMemcpyHostToDevice,
                                     stream));
  if (!merges.empty())
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(base + l.merges, merges.data(),
                                       sizeof(int32_t) * merges.size(), cudaMemcpyHostToDevice,
                                       stream));
  plan.split_ctas = model.num_ctas;
  plan.split_dp_rounds = split.dp_rounds;
  plan.split_ranges = reinterpret_cast<const int32_t*>(base + l.ranges);
  plan.num_merge_groups = int(split.merges.size());
  plan.merge_groups = reinterpret_cast<const int32_t*>(base + l.merges);
  plan.partial_lse = reinterpret_cast<float*>(base + l.lse);
  plan.partial_o = reinterpret_cast<float*>(base + l.o);
  return plan;
}

bool paged_prefill_supported(const PagedPrefillParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128 ||
          (p.head_dim == 256 && p.kv_format == KvCacheFormat::kDtype)) &&
         p.sm_scale > 0.f && (p.dtype == DType::kBF16 || p.dtype == DType::kF16) &&
         p.num_kv_heads > 0 && p.num_qo_heads > 0 && p.num_qo_heads % p.num_kv_heads == 0 &&
         p.page_size >= 1 && p.page_size <= 256 && p.window >= 0 &&
         (p.window == 0 || p.mask_mode == MaskMode::kCausal) &&
         (p.block_mask == nullptr || p.block_mask_heads == 1 ||
          p.block_mask_heads == p.num_qo_heads);
}

void paged_prefill_run(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kDtype || (p.k_scale && p.v_scale),
                ErrorCode::kInvalidArgument,
                "paged prefill: an FP8 KV cache needs k_scale and "
                "v_scale");
  LONGCTX_CHECK(paged_prefill_supported(p), ErrorCode::kUnsupported,
                "paged prefill: unsupported params (head_dim {}, dtype {}, heads {}/{}, page "
                "size {}, block_mask_heads {})",
                p.head_dim, int(p.dtype), p.num_qo_heads, p.num_kv_heads, p.page_size,
                p.block_mask_heads);
  LONGCTX_CHECK(plan.num_qo_heads == p.num_qo_heads && plan.num_kv_heads == p.num_kv_heads &&
                    plan.head_dim == p.head_dim && plan.mask_mode == p.mask_mode,
                ErrorCode::kInvalidArgument, "paged prefill: params do not match the plan");
  // The stream-K split's pieces are cut from key 0 by a cost model without windows.
  LONGCTX_CHECK(p.window == 0 || plan.split_ctas == 0, ErrorCode::kInvalidArgument,
                "paged prefill: a sliding window (window {}) with a stream-K split plan (plan it "
                "with PrefillSplitMode::kNever)",
                p.window);
  if (use_sm90_path(p, plan.tuning)) {
    paged_prefill_sm90_run(p, plan, stream);
    return;
  }
  LONGCTX_CHECK(plan.tile_rows == kRows, ErrorCode::kInvalidArgument,
                "paged prefill: the plan's {}-row tiles are the Hopper kernel's, not this "
                "device's (planned on another device?)",
                plan.tile_rows);
  if (p.dtype == DType::kBF16)
    launch_head_dim<__nv_bfloat16>(p, plan, stream);
  else
    launch_head_dim<__half>(p, plan, stream);
}

}  // namespace longctx::kernels::cuda
