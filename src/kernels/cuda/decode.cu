// Split-KV batch decode (see decode.h). The plan's work items are (request, kv range, partial
// slot); the grid is one-dimensional, item-major: the CTAs of one work item (one per kv head and
// head tile of <= 8 q heads) are consecutive, and its size (decode_grid_ctas) is all a CUDA graph
// of a later plan of the same batch size has to update. (Padding the work list with empty items
// to a grid fixed per batch size instead measured 19-22% slower at batch 1, 32K / 128K keys.)
//
// Each CTA streams its K/V range through a kStages-deep ring of 16 KB tiles (32 KB at head_dim
// 256, 3 deep) in shared memory, filled by cp.async, so it keeps ~48 KB of loads in flight while
// it computes on the oldest tile (loads straight into registers, serialized with the compute that
// consumes them, stay near 1 TB/s). Page ids are looked up one tile ahead of the copies that need
// them (the lookup's latency hides under a tile of compute). A tile is computed on the tensor cores
// (MmaCompute), since the same math on CUDA cores makes the kernel compute-bound; at 2-3 CTAs of 4
// warps per SM the warps' dependent chains are what the kernel waits on (Nsight Compute, batch 1 at
// 32K keys: 0.33 instructions issued per cycle and scheduler, DRAM 41 % busy; 6 ring stages instead
// of 4 changed nothing), so S = Q K^T runs as two independent mma chains. A split request's partial
// states are merged by the LAST of its CTAs (an atomic counter per (request, kv head, head tile)
// in the workspace), which saves a second launch and its wait for the whole grid; that merge
// issues its L2 loads in batches (a chain of dependent L2 round trips is its whole cost). The plan
// sizes the chunks with a wave model (kernels/decode_schedule.h; CTAs resident per SM from the
// occupancy API), so batch 1 fills the GPU in one even wave and large batches do not end in a
// mostly empty wave.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "kernels/cuda/arrival_device.cuh"
#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/decode.h"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/merge_device.cuh"
#include "kernels/cuda/mma_device.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/timeline_probe.cuh"
#include "kernels/cuda/tma_device.cuh"
#include "kernels/cuda/workspace.h"
#include "kernels/decode_schedule.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

using namespace detail;  // NOLINT: the PTX wrappers of mma_device.cuh

constexpr int kThreads = 128;
constexpr int kMaxGroup = 8;   // q heads per CTA (larger GQA groups take several CTAs)
constexpr int kCtasPerSm = 8;  // bounds the work items (and so the workspace): ~8 CTAs per SM
constexpr int kStages = 4;     // ring depth: 3 tiles (48 KB) in flight while one is computed
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// A work item: kDecodeWorkInts int32s (kernels/decode_schedule.h).
constexpr int kWorkInts = kDecodeWorkInts;

// Points of the timeline probe (kernels/cuda/timeline_probe.cuh; LONGCTX_TIMELINE_PROBE builds).
enum DecodeMark {
  kMarkEntry,
  kMarkWork,
  kMarkFirstTile,
  kMarkRangeDone,
  kMarkCounted,
  kMarkMerged
};

struct DecodeArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  float* o_f32;  // instead of o when set
  const int32_t* kv_indices;
  const int32_t* work;  // [num_work, kWorkInts] (WorkItem)
  float* partial_o;
  float* partial_lse;
  int32_t* counters;  // [batch, num_kv_heads * head_tiles] finished splits
  int64_t q_stride;   // elements between q rows
  // head_tiles: CTAs per (item, kv head), each of <= GT of the group * q_rows rows (row r:
  // query r / group, q head r % group of the kv group); q_rows: the plan's most queries per
  // request (a partial slot holds q_rows x num_qo_heads states).
  int num_qo_heads, num_kv_heads, group, head_tiles, page_size, q_rows;
  int window;            // DecodeParams::window: each row's own first key
  float scale_log2;      // sm_scale * log2(e): scores live in the log2 domain
  const float* k_scale;  // FP8 caches: [num_pages, num_kv_heads] (decode_fp8_kernel)
  const float* v_scale;
  int32_t* group_counters;  // [partial slots, num_kv_heads * head_tiles] (two-level merges)
  int merge_group;          // DecodePlan::merge_group (decode_merge_group's pin)
  int prefetch_tokens;      // DecodePlan::prefetch_tokens
};

// Tile geometry of the cp.async ring for head_dim D.
template <int D>
struct RingShape {
  static constexpr int LPT = D / 8;                     // 16-byte chunks per token row
  static constexpr int TILE = decode_tile_tokens(D);    // tokens per stage: 64 / 32 / 32 (D 256)
  static constexpr int CPT = TILE * LPT / kThreads;     // 16-byte copies per thread per tensor
  static constexpr int TOK_STRIDE = kThreads / LPT;     // tokens between a thread's copies
  static constexpr int kStageBytes = 2 * TILE * D * 2;  // K + V, 16-bit elements
  // D 256: 3 stages of 32 KB (2 in flight), so that two CTAs share an SM.
  static constexpr int kRingStages = D > 128 ? 3 : kStages;
  static constexpr int kSmemBytes = kRingStages * kStageBytes;
  static_assert(CPT * kThreads == TILE * LPT, "tile copies must divide over the threads");
  static_assert(TILE % 32 == 0, "each warp takes whole 8-token blocks");
};

// The TMA ring's stages: W times the ring's tile (TILE tokens of K and of V), kStages of them
// (4 for W = 1; 3 for W = 2, so that 2 CTAs still fit an SM), plus 1 KB for the 1024-byte
// alignment the 128-byte swizzle needs. 7 stages of one CTA per SM (6 tiles, 192 KB, in flight
// against 2 x 2) measured 1-4 % slower at every shape but batch 1 over 32K keys
// (docs/benchmarks.md).
template <int D, int W>
struct TmaShape {
  static constexpr int TILE = W * RingShape<D>::TILE;
  static constexpr int kStages = W == 1 ? 4 : 3;
  static constexpr int kStageBytes = 2 * TILE * D * 2;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  static_assert(TILE <= 256, "a TMA box spans at most 256 slots");
};

// Where 16-byte chunk c (0 .. D / 8 - 1) of token row `tok` of a K or V tile at `base` sits in
// shared memory. The cp.async ring: [TILE][D] rows, chunks XOR-swizzled by tok % 8 (conflict-free
// ldmatrix). The TMA ring: the copy engine's 128-byte swizzle of boxes of 64 dims, i.e. [D / 64]
// [TILE][128 B] with the same XOR inside each 128 bytes (identical to the ring's at D = 64).
template <int D>
struct RingLayout {
  static constexpr int kTile = RingShape<D>::TILE;
  static __device__ __forceinline__ uint32_t addr(uint32_t base, int tok, int c) {
    return base + tok * D * 2 + ((c ^ (tok & 7)) << 4);
  }
};
template <int D, int TILE>
struct TmaLayout {
  static constexpr int kTile = TILE;
  static __device__ __forceinline__ uint32_t addr(uint32_t base, int tok, int c) {
    return base + swizzle128_offset(TILE, tok, c);
  }
};

// The q row's dims 16 ks + 2t, + 1 and 16 ks + 8 + 2t, + 1 for every k-step ks (zero when
// !valid): the A fragments of MmaCompute's row g.
template <typename T, int D>
__device__ __forceinline__ void load_q_fragments(const DecodeArgs& a, int64_t q_row, int h,
                                                 bool valid, int t4, uint32_t (*frag)[2]) {
  const T* q = static_cast<const T*>(a.q);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    if (valid) {
      const T* qr = q + q_row * a.q_stride + h * D + ks * 16 + 2 * t4;
      frag[ks][0] = *reinterpret_cast<const uint32_t*>(qr);
      frag[ks][1] = *reinterpret_cast<const uint32_t*>(qr + 8);
    } else {
      frag[ks][0] = frag[ks][1] = 0u;
    }
  }
}

// The CTA's (request, kv range, partial slot, kv head, head tile) from its work item.
struct CtaWork {
  int b, kv_begin, kv_end, slot, kvh, hslot, ctas_per_item;
  int r0, nr;                    // the CTA's rows r0 .. r0 + nr - 1 (nr <= 0: none)
  int page_base;                 // kv_indptr[b]: the request's first entry of kv_indices
  int merge_begin, merge_count;  // the request's partial slots (split requests)
  bool cp_async_stages;          // DecodePlan::cp_async_stages (decode_tma_kernel)
  int q_start, q_len, kv_len;    // the request's first q row, its queries and keys
  bool causal;                   // DecodeParams::causal
};
template <int GT>
__device__ __forceinline__ CtaWork cta_work(const DecodeArgs& a) {
  CtaWork w;
  w.ctas_per_item = a.num_kv_heads * a.head_tiles;
  w.hslot = blockIdx.x % w.ctas_per_item;  // (kv head, head tile) of this CTA
  // The item's three int4 in one round trip: nothing the kernel needs before its first copy
  // is a second, dependent global load.
  const int4* item =
      reinterpret_cast<const int4*>(a.work) + kWorkInts / 4 * (blockIdx.x / w.ctas_per_item);
  const int4 x = item[0], y = item[1], z = item[2];
  w.b = x.x;
  w.kv_begin = x.y;
  w.kv_end = x.z;
  w.slot = x.w;
  w.page_base = y.x;
  w.merge_begin = y.y;
  w.merge_count = y.z;
  w.cp_async_stages = y.w != 0;
  w.q_start = z.x;
  w.q_len = z.y;
  w.kv_len = z.z;
  w.causal = z.w != 0;
  w.kvh = w.hslot / a.head_tiles;
  const int tile = w.hslot % a.head_tiles;
  w.r0 = tile * GT;
  w.nr = min(GT, a.group * w.q_len - w.r0);
  return w;
}

// Before the kernel waits for the one before it (pdl_wait): L2 prefetches of the K and V rows of
// the first `ntok` keys of the CTA's range (kElemBytes per element: 2, or 1 for FP8 codes), so
// that HBM serves the CTA's first tiles while the KV store before it drains instead of after
// (its work item and page ids are the plan's copies, final before that kernel started:
// decode.h). Only a hint: the KV store's new rows reach L2, where every read meets them, so the
// kernel reads after pdl_wait what it would without the prefetch.
template <int D, int kElemBytes>
__device__ __forceinline__ void prefetch_first_keys(const DecodeArgs& a, const CtaWork& w,
                                                    int ntok) {
  constexpr int kRowBytes = D * kElemBytes, kLines = (kRowBytes + 127) / 128;
  const int begin = w.kv_begin & ~63, end = min(w.kv_end, begin + ntok);
  const int32_t* pages = a.kv_indices + w.page_base;
  const char* kc = static_cast<const char*>(a.k);
  const char* vc = static_cast<const char*>(a.v);
  for (int i = threadIdx.x; i < (end - begin) * kLines; i += kThreads) {
    const int tok = begin + i / kLines;
    const int pi = tok / a.page_size;
    const int64_t row = int64_t(__ldg(pages + pi)) * a.page_size + (tok - pi * a.page_size);
    const int64_t off = (row * a.num_kv_heads + w.kvh) * kRowBytes + (i % kLines) * 128;
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(kc + off));
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vc + off));
  }
}

// Row r of the CTA's (request, kv head): query r / group of the request (its q / o row) and q
// head kvh * group + r % group.
__device__ __forceinline__ void row_of(const DecodeArgs& a, const CtaWork& w, int r, int& qi,
                                       int& h) {
  qi = r / a.group;
  h = w.kvh * a.group + (r - qi * a.group);
}

// One online-softmax step of a row over a thread's two keys of an 8-key block (x0, x1: scores in
// log2 units, -inf where masked; the row's 4 threads of a quad share its max): the running max
// m_r and sum l_r move, O's row (the [.][0..1] halves) is rescaled where some row's max moved.
// Returns the two keys' weights.
template <int NTL>
__device__ __forceinline__ float2 online_softmax_step(float x0, float x1, float& m_r, float& l_r,
                                                      float (&o)[NTL][4]) {
  float mx = fmaxf(x0, x1);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m_r, mx);
  // -inf while this row has seen no token (all masked): keep exp2 away from NaN.
  const float base = m_new == -INFINITY ? 0.f : m_new;
  const float scale = exp2f(m_r - base);
  const float p0 = exp2f(x0 - base), p1 = exp2f(x1 - base);
  l_r = l_r * scale + p0 + p1;
  m_r = m_new;
  // The running max rarely moves after the first blocks: skip the O rescale then.
  if (__any_sync(0xffffffffu, scale != 1.f)) {
#pragma unroll
    for (int j = 0; j < NTL; ++j) {
      o[j][0] *= scale;
      o[j][1] *= scale;
    }
  }
  return make_float2(p0, p1);
}

// Tensor-core compute: the CTA's q heads are the M rows of mma.sync tiles (rows >= GT are zero
// padding: the tensor cores have ~50x the throughput this needs), each warp takes 8-token blocks
// of the tile as the N (S = Q K^T, m16n8k16 over head_dim) and K (O += P V, m16n8k8) dimensions.
// S's accumulator layout is m16n8k8's A layout, so P goes from registers into the second mma
// without shuffles; K and V fragments come from the (XOR-swizzled, so conflict-free) ring by
// ldmatrix / ldmatrix.trans. Per 8 tokens a warp issues ~24 mma + 8 ldmatrix + ~40 softmax
// instructions; the same tile on CUDA cores takes ~600 and is compute-bound at batch 1 (GQA 1
// runs 1.4x faster than GQA 4 over the same bytes there).
// Thread (g = lane / 4, t = lane % 4) owns row g (q head g) of S for tokens 2t, 2t+1 of each
// block and of O for dims 8j + 2t, 2t+1: one online-softmax state per warp, kSources = 4.
template <typename T, int D, int GT, typename Layout = RingLayout<D>>
struct MmaCompute {
  // Accumulators of S = Q K^T per 8-token block (k-step i adds into i % kChains). One chain of 8
  // dependent mma.sync (head_dim 128) left the kernel latency-bound; 2 chains with the batched
  // merge of finish_cta took batch 1 / 32K keys from 1.10x to 1.17x cuDNN's bandwidth (each
  // measured beside cuDNN, back-to-back launches, H200); 4 chains measured the same as 2.
  static constexpr int kChains = 2;
  static constexpr int KS = D / 16;               // k-steps of S = Q K^T
  static constexpr int NTL = D / 8;               // 8-dim n-tiles of O
  static constexpr int SBW = Layout::kTile / 32;  // 8-token blocks per warp per tile
  static constexpr int kSources = kThreads / 32;  // softmax states store() leaves: a warp's
  int g, t4, warp;
  uint32_t qa[KS][2];  // A fragments of q: (row g, cols 16 ks + 2t..) and (+8); other rows zero
  float o[NTL][4];     // [.][0..1]: row g; [.][2..3]: padding row g + 8 (stays 0)
  float m_r, l_r;      // row g: running max (log2 domain) and this thread's partial sum
  int first_, end_;    // row g sees the keys [first_, end_) of the item's range

  __device__ __forceinline__ void init(const DecodeArgs& a, const CtaWork& w) {
    const int lane = threadIdx.x & 31;
    g = lane >> 2;
    t4 = lane & 3;
    warp = threadIdx.x >> 5;
    int qi, h;
    row_of(a, w, w.r0 + g, qi, h);
    load_q_fragments<T, D>(a, int64_t(w.q_start) + qi, h, g < w.nr, t4, qa);
    // DecodeParams' rule: query qi ends at kv_len - q_len + 1 + qi (causal). With one query this
    // is [kv_begin, kv_end): the plan's items start at the window's first key.
    const int row_end = w.causal ? w.kv_len - w.q_len + 1 + qi : w.kv_len;
    end_ = min(w.kv_end, row_end);
    first_ = a.window > 0 ? max(w.kv_begin, row_end - a.window) : w.kv_begin;
#pragma unroll
    for (int j = 0; j < NTL; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    m_r = -INFINITY;
    l_r = 0.f;
  }

  // sk, sv: shared-memory addresses of the tile's K and V (in Layout), whose first token is key
  // tbase; row g sees its keys [first_, end_) of them.
  __device__ __forceinline__ void tile(uint32_t sk, uint32_t sv, int tbase, float scale_log2) {
    const int kv_first = first_, kv_end = end_;
    const int lane = threadIdx.x & 31;
    const int r = lane & 7, mat = lane >> 3;  // ldmatrix: this lane's row and matrix
#pragma unroll
    for (int sb = 0; sb < SBW; ++sb) {
      const int tok0 = (warp * SBW + sb) * 8;  // a multiple of 8: (tok0 + r) & 7 == r
      float sc[kChains][4];
#pragma unroll
      for (int i = 0; i < kChains; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
      for (int kp = 0; kp < KS / 2; ++kp) {  // 4 chunks = 2 k-steps per ldmatrix.x4
        uint32_t kb[4];
        ldmatrix_x4(kb, Layout::addr(sk, tok0 + r, kp * 4 + mat));
        const uint32_t a0[4] = {qa[2 * kp][0], 0u, qa[2 * kp][1], 0u};
        Mma<T>::k16(sc[(2 * kp) % kChains], a0, kb[0], kb[1]);
        const uint32_t a1[4] = {qa[2 * kp + 1][0], 0u, qa[2 * kp + 1][1], 0u};
        Mma<T>::k16(sc[(2 * kp + 1) % kChains], a1, kb[2], kb[3]);
      }
      float s[2] = {sc[0][0], sc[0][1]};
#pragma unroll
      for (int i = 1; i < kChains; ++i) {
        s[0] += sc[i][0];
        s[1] += sc[i][1];
      }
      const int tk = tbase + tok0 + 2 * t4;
      const float x0 = tk < kv_end && tk >= kv_first ? s[0] * scale_log2 : -INFINITY;
      const float x1 = tk + 1 < kv_end && tk + 1 >= kv_first ? s[1] * scale_log2 : -INFINITY;
      const float2 p = online_softmax_step(x0, x1, m_r, l_r, o);
      const float p0 = p.x, p1 = p.y;
      const uint32_t pa = Mma<T>::pack(p0, p1);
#pragma unroll
      for (int np = 0; np < NTL / 4; ++np) {  // 4 chunks = 4 n-tiles per ldmatrix.x4.trans
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Layout::addr(sv, tok0 + r, np * 4 + mat));
#pragma unroll
        for (int i = 0; i < 4; ++i) Mma<T>::k8(o[np * 4 + i], pa, 0u, vb[i]);
      }
    }
  }

  __device__ __forceinline__ void store(float* s_acc, float (*s_m)[GT], float (*s_l)[GT]) {
    float l = l_r;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < GT) {
      if (t4 == 0) {
        s_m[warp][g] = m_r;
        s_l[warp][g] = l;
      }
#pragma unroll
      for (int j = 0; j < NTL; ++j) {
        s_acc[(warp * GT + g) * D + j * 8 + 2 * t4] = o[j][0];
        s_acc[(warp * GT + g) * D + j * 8 + 2 * t4 + 1] = o[j][1];
      }
    }
  }
};

// The CTA's shared state besides the K/V tiles: the per-warp softmax states and the "last CTA"
// flag.
template <int GT>
struct EpilogueSmem {
  float m[kThreads / 32][GT];
  float l[kThreads / 32][GT];
  int last;
};

// Merges `count` partial states of the CTA's rows, at partial slots first, first + step, ...,
// into o / lse (out_slot < 0) or into partial slot out_slot (a group's first slot: a barrier
// between the reads and the writes of each pass, so in place is safe). One pass: each
// thread takes four dims of one row (float4 partial rows) and issues kBatch states' lse and o
// loads before using any, keeping a running max. A merge is a chain of L2 round trips (the
// partials were written by other SMs during this kernel, so they are read with ld.global.cg), and
// its length is what it costs: at 32 states and kBatch 16, 2 round trips against 6 for a separate
// max / sum pass before batches of 8. kBatch 16 takes ~250 registers, which only a kernel held
// to 2 CTAs per SM by its shared memory affords.
template <typename T, int D, int kBatch>
__device__ __forceinline__ void merge_states(const DecodeArgs& a, const CtaWork& w, int first,
                                             int count, int step, int out_slot) {
  T* o = static_cast<T*>(a.o);
  const int64_t slot_rows = int64_t(a.q_rows) * a.num_qo_heads;
  // Passes of kThreads units, the same count in every thread (the in-place case's barrier).
  const int total = w.nr * D / 4;
  for (int base = 0; base < total; base += kThreads) {
    const int idx = base + threadIdx.x;
    const bool mine = idx < total;
    const int g = mine ? idx / (D / 4) : 0, d = mine ? (idx % (D / 4)) * 4 : 0;
    int qi, h;
    row_of(a, w, w.r0 + g, qi, h);
    const int64_t row_in_slot = int64_t(qi) * a.num_qo_heads + h;
    const int64_t prow = int64_t(first) * slot_rows + row_in_slot;
    const float* pl = a.partial_lse + prow;
    const float* po = a.partial_o + prow * D + d;
    const int64_t lse_step = slot_rows * step, o_step = slot_rows * step * D;
    float mx = -INFINITY, sum = 0.f;
    float4 out = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int st0 = 0; st0 < count; st0 += kBatch) {
      float lv[kBatch];
      float4 ov[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const bool in = mine && st0 + u < count;
        lv[u] = in ? __ldcg(pl + (st0 + u) * lse_step) : -INFINITY;
        ov[u] = in ? __ldcg(reinterpret_cast<const float4*>(po + (st0 + u) * o_step))
                   : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float bm = mx;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) bm = fmaxf(bm, lv[u]);
      if (bm == -INFINITY) continue;    // no state so far saw a key
      const float r = __expf(mx - bm);  // mx = -inf: 0 (sum and out are 0 then)
      sum *= r;
      out.x *= r;
      out.y *= r;
      out.z *= r;
      out.w *= r;
      mx = bm;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float wt = __expf(lv[u] - mx);  // -inf (empty or past count): 0
        sum += wt;
        out.x = fmaf(wt, ov[u].x, out.x);
        out.y = fmaf(wt, ov[u].y, out.y);
        out.z = fmaf(wt, ov[u].z, out.z);
        out.w = fmaf(wt, ov[u].w, out.w);
      }
    }
    if (mx != -INFINITY) {
      out.x /= sum;
      out.y /= sum;
      out.z /= sum;
      out.w /= sum;
    }
    const float lse = mx == -INFINITY ? -INFINITY : mx + __logf(sum);
    if (out_slot >= 0) {
      // A row's lse is read by every thread of the row (two warps at head_dim 256): all reads of
      // the states before the first write into the group's first slot.
      __syncthreads();
      const int64_t orow = int64_t(out_slot) * slot_rows + row_in_slot;
      if (mine) *reinterpret_cast<float4*>(a.partial_o + orow * D + d) = out;
      if (mine && d == 0) a.partial_lse[orow] = lse;
      continue;
    }
    if (!mine) continue;
    const int64_t orow = (int64_t(w.q_start) + qi) * a.num_qo_heads + h;
    if (a.o_f32) {
      *reinterpret_cast<float4*>(a.o_f32 + orow * D + d) = out;
    } else {
      T* od = o + orow * D + d;
      od[0] = detail::from_f32<T>(out.x);
      od[1] = detail::from_f32<T>(out.y);
      od[2] = detail::from_f32<T>(out.z);
      od[3] = detail::from_f32<T>(out.w);
    }
    if (d == 0 && a.lse) a.lse[orow] = lse;
  }
}

// What the kernel does after its K/V range: merges the NSRC softmax states the compute stored
// (MmaCompute::store: into s_acc and e) into o, or into the request's partial
// slot; then, for a split request, the CTAs that finish last merge the request's partial states
// into o (merge_states; one or two levels).
template <typename T, int D, int GT, int NSRC, int kBatch>
__device__ __forceinline__ void finish_cta(const DecodeArgs& a, const float* s_acc,
                                           EpilogueSmem<GT>& e, const CtaWork& w) {
  const int b = w.b, slot = w.slot, nh = w.nr, s0 = w.merge_begin, n = w.merge_count;
  T* o = static_cast<T*>(a.o);
  // Partial state (slot s, query qi, head h): row (s * q_rows + qi) * num_qo_heads + h.
  const int64_t slot_rows = int64_t(a.q_rows) * a.num_qo_heads;
  for (int idx = threadIdx.x; idx < nh * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NSRC; ++j) mx = fmaxf(mx, e.m[j][g]);
    float sum = 0.f, out = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int j = 0; j < NSRC; ++j) {
        const float w = exp2f(e.m[j][g] - mx);  // empty sources: exp2(-inf) = 0
        sum += e.l[j][g] * w;
        out += s_acc[(j * GT + g) * D + d] * w;
      }
      out /= sum;
    }
    const float lse = mx == -INFINITY ? -INFINITY : (mx + log2f(sum)) * kLn2;
    int qi, h;
    row_of(a, w, w.r0 + g, qi, h);
    if (slot < 0) {
      const int64_t orow = (int64_t(w.q_start) + qi) * a.num_qo_heads + h;
      if (a.o_f32)
        a.o_f32[orow * D + d] = out;
      else
        o[orow * D + d] = detail::from_f32<T>(out);
      if (d == 0 && a.lse) a.lse[orow] = lse;
    } else {
      const int64_t prow = int64_t(slot) * slot_rows + int64_t(qi) * a.num_qo_heads + h;
      a.partial_o[prow * D + d] = out;
      if (d == 0) a.partial_lse[prow] = lse;
    }
  }
  if (slot < 0) return;

  // Split request: the CTA that finishes last (of this request's splits for this kv head / head
  // tile) merges them; with many splits, in two levels (decode_merge_group): the last CTA of each
  // group of g splits merges the group into its first slot, the last group's CTA merges those.
  // Counting in: thread 0's one acquire-release atomic; its release half publishes the partial
  // stores every thread made before the barrier (cumulativity, as in CUTLASS's generic barrier),
  // its acquire half makes the other CTAs' partials visible to the last CTA (read after the next
  // barrier, from L2); separate fences before and after the count would add a round trip each to
  // the kernel's tail. The last CTA puts the counter back to 0 for the next run (plan() zeroes it
  // once), which keeps run() free of memsets and graph-replayable.
  const int g = decode_merge_group(n, a.merge_group);
  int count = n, step = 1;
  if (g < n) {
    const int k = (slot - s0) / g, gs = s0 + k * g;
    __syncthreads();
    if (threadIdx.x == 0)
      e.last = arrive_last(a.group_counters + int64_t(gs) * w.ctas_per_item + w.hslot,
                           min(g, n - k * g));
    __syncthreads();
    if (!e.last) return;
    merge_states<T, D, kBatch>(a, w, gs, min(g, n - k * g), 1, gs);
    count = (n + g - 1) / g;
    step = g;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    e.last = arrive_last(a.counters + int64_t(b) * w.ctas_per_item + w.hslot, count);
  __syncthreads();
  LONGCTX_TIMELINE_MARK(kMarkCounted);
  if (!e.last) return;
  merge_states<T, D, kBatch>(a, w, s0, count, step, -1);
  LONGCTX_TIMELINE_MARK(kMarkMerged);
}

// The end of a cp.async ring kernel: the ring drained (only empty groups can be left), its shared
// memory then holds the warps' accumulators ([NSRC][GT][D] fp32 = D / 16 KB x GT, within every
// ring's bytes) for finish_cta.
template <typename T, int D, int GT, typename Compute>
__device__ __forceinline__ void finish_ring_cta(const DecodeArgs& a, const CtaWork& w, Compute& c,
                                                uint8_t* smem, EpilogueSmem<GT>& e) {
  cp_async_wait<0>();
  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(smem);
  c.store(s_acc, e.m, e.l);
  __syncthreads();
  finish_cta<T, D, GT, Compute::kSources, 8>(a, s_acc, e, w);
}

// One CTA per (work item, kv head, head tile): the cp.async ring feeding MmaCompute, then
// finish_cta.
template <typename T, int D, int GT>
__global__ void __launch_bounds__(kThreads) decode_ring_kernel(DecodeArgs a) {
  using S = RingShape<D>;
  using C = MmaCompute<T, D, GT>;
  constexpr int LPT = S::LPT, TILE = S::TILE, CPT = S::CPT;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ EpilogueSmem<GT> e;

  LONGCTX_TIMELINE_MARK(kMarkEntry);
  // Launched as a dependent of the KV store (kernels/cuda/pdl.cuh): the work item and the first
  // keys' L2 prefetch before pdl_wait (prefetch_first_keys); everything after it may read what
  // the KV store wrote. The o_proj GEMV after it may start meanwhile (and wait for it).
  const CtaWork w = cta_work<GT>(a);
  if (w.b < 0 || w.nr <= 0) return;  // padding item, or rows past the request's queries
  prefetch_first_keys<D, 2>(a, w, a.prefetch_tokens);
  pdl_wait();
  pdl_launch_dependents();
  LONGCTX_TIMELINE_MARK(kMarkWork);
  // The item's first key may be a sliding window's (any key); its tiles start at the multiple
  // of 64 at or before it (where a split may start, so the TMA's tiles stay within a page) and
  // the keys before kv_first are masked.
  const int kv_begin = w.kv_begin & ~63, kv_end = w.kv_end, kvh = w.kvh;
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
  const int32_t* pages = a.kv_indices + w.page_base;
  const int ps = a.page_size;
  const int n_tiles = (kv_end - kv_begin + TILE - 1) / TILE;
  // Copy assignment: thread tid copies the 16-byte chunks tid + j * kThreads of a tile, i.e.
  // chunk tid % LPT of tokens tid / LPT + j * TOK_STRIDE: a warp's copies of one j cover 512
  // contiguous bytes of the tile (coalesced reads of whole 256-byte rows), and a thread's K and
  // V copies share one address computation. Chunk c of row r is stored at c ^ (r % 8), so an
  // ldmatrix read of one chunk column over 8 rows covers all 32 banks (no conflicts).
  const int cp_tok = threadIdx.x / LPT, cp_cc = threadIdx.x % LPT;
  auto stage_k = [&](int st) { return reinterpret_cast<T*>(smem + st * S::kStageBytes); };
  auto stage_v = [&](int st) { return stage_k(st) + TILE * D; };
  // Row (page * ps + slot) of each of the next tile's copies, looked up one tile ahead of the
  // copies that need it. One integer division per tile: the thread's later tokens are TOK_STRIDE
  // apart, so their (page index, slot) follow by carrying (once per step for pages >= 8 tokens).
  int64_t row[CPT];
  auto load_rows = [&](int t_idx) {
    const int t0 = kv_begin + t_idx * TILE + cp_tok;
    int pi = t0 / ps, sl = t0 - pi * ps;
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int t = t0 + j * S::TOK_STRIDE;
      row[j] = t < kv_end ? int64_t(__ldg(pages + pi)) * ps + sl : 0;
      sl += S::TOK_STRIDE;
      while (sl >= ps) sl -= ps, ++pi;
    }
  };
  auto issue = [&](int t_idx) {
    const int st = t_idx % S::kRingStages;
    T* sk = stage_k(st);
    T* sv = stage_v(st);
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int tt = cp_tok + j * S::TOK_STRIDE;
      const bool valid = kv_begin + t_idx * TILE + tt < kv_end;
      const int64_t off = (row[j] * a.num_kv_heads + kvh) * D + cp_cc * 8;  // row 0 if invalid
      const int dst = tt * D + (cp_cc ^ (tt & 7)) * 8;
      cp_async_16(smem_addr(sk + dst), kc + off, valid ? 16 : 0);  // 0 bytes: zero-fill
      cp_async_16(smem_addr(sv + dst), vc + off, valid ? 16 : 0);
    }
  };

  // Prologue: S::kRingStages - 1 tiles in flight before the first compute. One commit per slot even
  // when there is no tile, so wait_group counts stay uniform.
#pragma unroll
  for (int st = 0; st < S::kRingStages - 1; ++st) {
    if (st < n_tiles) {
      load_rows(st);
      issue(st);
    }
    cp_async_commit();
  }
  if (S::kRingStages - 1 < n_tiles) load_rows(S::kRingStages - 1);

  C c;
  c.init(a, w);
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<S::kRingStages - 2>();  // tile it has landed (for this thread's copies) ...
    __syncthreads();                      // ... for every thread's, and tile it - 1 is consumed
    if (it == 0) LONGCTX_TIMELINE_MARK(kMarkFirstTile);
    const int nx = it + S::kRingStages - 1;
    if (nx < n_tiles) issue(nx);  // into the stage tile it - 1 used
    cp_async_commit();
    if (nx + 1 < n_tiles) load_rows(nx + 1);  // used by the next iteration's issue
    const int st = it % S::kRingStages;
    c.tile(smem_addr(stage_k(st)), smem_addr(stage_v(st)), kv_begin + it * TILE, a.scale_log2);
  }
  LONGCTX_TIMELINE_MARK(kMarkRangeDone);
  finish_ring_cta<T, D, GT>(a, w, c, smem, e);
}

// FP8 K/V (KvCacheFormat::kFp8E4M3): the ring kernel's CTA with a converting loader. The codes
// of kFp8Stages tiles stream through a cp.async ring (16-byte copies: 16 codes per thread and
// copy, so a tile of TILE tokens is half the 16-bit ring's bytes and the ring keeps as many bytes
// in flight with more tiles), each token's K and V page scales beside them (4-byte cp.async by
// one thread per token). When a tile has landed every thread converts the chunks it copied into
// one 16-bit tile in the ring kernel's swizzled layout and MmaCompute runs on it unchanged, so the
// accumulation (fp32 scores, softmax, P.V, the split merge) is the 16-bit path's. Per code pair
// the conversion is one cvt (e4m3x2 -> f16x2, sm_89+), two f16 -> f32, two multiplies by the
// page's scale (a power of two: exact) and one pack to bf16x2 / f16x2, i.e. 3 instructions per
// byte, against ~1 byte per 2 instructions of the tile's mma work: the kernel stays memory-bound
// at batch 1 and half the bytes is what it gains.
constexpr int kFp8Stages = 7;  // 6 tiles of codes (48 KB of K + V) in flight

// The FP8 kernels' cp.async ring: stage st holds a tile's K codes and V codes ([TILE][D] bytes
// each, 16-byte chunks placed by Layout::offset(row, chunk)) and then each key's K and V page
// scales ([TILE][2] fp32). Thread i copies chunk i % LPT of keys i / LPT + j * TOK_STRIDE
// (j < CPT): 16 codes per copy, the scales by the thread of chunk 0. The page-table lookups of a
// tile (load_rows) run a tile ahead of its copies (issue), so the __ldg latency stays off them.
// Keys past kv_end are zero-filled, scales included: V's zero codes then weigh 0, not NaN.
template <int D, int TILE, int kStages, typename Layout>
struct Fp8CodeRing {
  static constexpr int LPT = D / 16;                 // 16-byte chunks (16 codes) per key row
  static constexpr int CPT = TILE * LPT / kThreads;  // chunks per thread per tensor
  static constexpr int TOK_STRIDE = kThreads / LPT;
  static constexpr int kCodeStage = 2 * TILE * D;  // K + V codes
  static constexpr int kStageBytes = kCodeStage + 2 * TILE * 4;
  static_assert(CPT * kThreads == TILE * LPT, "tile copies must divide over the threads");

  __device__ __forceinline__ Fp8CodeRing(uint8_t* smem_, const DecodeArgs& a_, const CtaWork& w)
      : a(a_),
        smem(smem_),
        kc(static_cast<const uint8_t*>(a_.k)),
        vc(static_cast<const uint8_t*>(a_.v)),
        pages(a_.kv_indices + w.page_base),
        ps(a_.page_size),
        kv_begin(w.kv_begin & ~63),
        kv_end(w.kv_end),
        kvh(w.kvh),
        cp_tok(threadIdx.x / LPT),
        cp_cc(threadIdx.x % LPT) {}

  __device__ __forceinline__ int num_tiles() const { return (kv_end - kv_begin + TILE - 1) / TILE; }
  __device__ __forceinline__ uint8_t* codes_k(int st) const { return smem + st * kStageBytes; }
  __device__ __forceinline__ uint8_t* codes_v(int st) const { return codes_k(st) + TILE * D; }
  __device__ __forceinline__ float* scales(int st) const {
    return reinterpret_cast<float*>(codes_k(st) + kCodeStage);
  }

  // Pages and slots of this thread's keys of tile t_idx.
  __device__ __forceinline__ void load_rows(int t_idx) {
    const int t0 = kv_begin + t_idx * TILE + cp_tok;
    int pi = t0 / ps, sl = t0 - pi * ps;
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int t = t0 + j * TOK_STRIDE;
      page_id[j] = t < kv_end ? __ldg(pages + pi) : 0;
      row[j] = int64_t(page_id[j]) * ps + sl;
      sl += TOK_STRIDE;
      while (sl >= ps) sl -= ps, ++pi;
    }
  }

  // This thread's copies of tile t_idx (its rows loaded) into stage t_idx % kStages.
  __device__ __forceinline__ void issue(int t_idx) {
    const int st = t_idx % kStages;
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int tt = cp_tok + j * TOK_STRIDE;
      const int bytes = kv_begin + t_idx * TILE + tt < kv_end ? 16 : 0;  // 0: zero-fill
      const int64_t off = (row[j] * a.num_kv_heads + kvh) * D + cp_cc * 16;
      const int dst = Layout::offset(tt, cp_cc);
      cp_async_16(smem_addr(codes_k(st) + dst), kc + off, bytes);
      cp_async_16(smem_addr(codes_v(st) + dst), vc + off, bytes);
      if (cp_cc == 0) {
        const int64_t si = int64_t(page_id[j]) * a.num_kv_heads + kvh;
        cp_async_4(smem_addr(scales(st) + 2 * tt), a.k_scale + si, bytes ? 4 : 0);
        cp_async_4(smem_addr(scales(st) + 2 * tt + 1), a.v_scale + si, bytes ? 4 : 0);
      }
    }
  }

  // The first kStages - 1 tiles in flight, the next one's rows loaded.
  __device__ __forceinline__ void start(int n_tiles) {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < n_tiles) {
        load_rows(st);
        issue(st);
      }
      cp_async_commit();
    }
    if (kStages - 1 < n_tiles) load_rows(kStages - 1);
  }

  // Before tile `it` is read: it has landed (every thread's copies), tile it - 1 is consumed, and
  // tile it + kStages - 1 goes into the stage that one used. Returns tile it's stage.
  __device__ __forceinline__ int advance(int it, int n_tiles) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int nx = it + kStages - 1;
    if (nx < n_tiles) issue(nx);
    cp_async_commit();
    if (nx + 1 < n_tiles) load_rows(nx + 1);
    return it % kStages;
  }

  const DecodeArgs& a;  // the kernel's parameters (scales [pages, kv heads])
  uint8_t* smem;
  const uint8_t* kc;  // [slots, kv heads, D] codes
  const uint8_t* vc;
  const int32_t* pages;  // the request's page ids
  int ps, kv_begin, kv_end, kvh, cp_tok, cp_cc;
  int64_t row[CPT];  // this thread's keys' slots in the cache
  int page_id[CPT];
};

// The converting tile's stage layout: rows of D codes, unswizzled (each thread reads back only
// the chunks it copied).
template <int D>
struct Fp8PlainRows {
  static __device__ __forceinline__ int offset(int row, int c) { return row * D + c * 16; }
};

template <int D>
struct Fp8Shape {
  static constexpr int TILE = RingShape<D>::TILE;
  using Ring = Fp8CodeRing<D, TILE, kFp8Stages, Fp8PlainRows<D>>;
  static constexpr int kTileBytes = 2 * TILE * D * 2;  // the converted 16-bit K + V tile
  static constexpr int kSmemBytes = kFp8Stages * Ring::kStageBytes + kTileBytes;
};

template <typename T, int D, int GT>
__global__ void __launch_bounds__(kThreads) decode_fp8_kernel(DecodeArgs a) {
  using S = Fp8Shape<D>;
  using C = MmaCompute<T, D, GT>;
  using L = RingLayout<D>;
  using Ring = typename S::Ring;
  constexpr int TILE = S::TILE;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ EpilogueSmem<GT> e;

  const CtaWork w = cta_work<GT>(a);  // before pdl_wait: as the ring kernel
  if (w.b < 0 || w.nr <= 0) return;   // padding item, or rows past the request's queries
  prefetch_first_keys<D, 1>(a, w, a.prefetch_tokens);
  pdl_wait();
  pdl_launch_dependents();
  // The code stages, then the converted tile (K then V, [TILE][D] each in RingLayout).
  Ring ring(smem, a, w);
  const int n_tiles = ring.num_tiles();
  uint8_t* tile_k = smem + kFp8Stages * Ring::kStageBytes;
  uint8_t* tile_v = tile_k + TILE * D * 2;
  // The chunks this thread copied into stage st, converted into the 16-bit tile.
  auto convert = [&](int st) {
    const uint32_t tk = smem_addr(tile_k), tv = smem_addr(tile_v);
#pragma unroll
    for (int j = 0; j < Ring::CPT; ++j) {
      const int tt = ring.cp_tok + j * Ring::TOK_STRIDE;
      const int src = Fp8PlainRows<D>::offset(tt, ring.cp_cc);
      const float sk = ring.scales(st)[2 * tt], sv = ring.scales(st)[2 * tt + 1];
      uint4 lo, hi;
      fp8x16_to_elements<T>(*reinterpret_cast<const uint4*>(ring.codes_k(st) + src), sk, lo, hi);
      *reinterpret_cast<uint4*>(tile_k + (L::addr(tk, tt, 2 * ring.cp_cc) - tk)) = lo;
      *reinterpret_cast<uint4*>(tile_k + (L::addr(tk, tt, 2 * ring.cp_cc + 1) - tk)) = hi;
      fp8x16_to_elements<T>(*reinterpret_cast<const uint4*>(ring.codes_v(st) + src), sv, lo, hi);
      *reinterpret_cast<uint4*>(tile_v + (L::addr(tv, tt, 2 * ring.cp_cc) - tv)) = lo;
      *reinterpret_cast<uint4*>(tile_v + (L::addr(tv, tt, 2 * ring.cp_cc + 1) - tv)) = hi;
    }
  };

  ring.start(n_tiles);
  C c;
  c.init(a, w);
  for (int it = 0; it < n_tiles; ++it) {
    // Tile it's codes and scales have landed (every thread's), and the 16-bit tile is free again.
    convert(ring.advance(it, n_tiles));
    __syncthreads();
    c.tile(smem_addr(tile_k), smem_addr(tile_v), ring.kv_begin + it * TILE, a.scale_log2);
  }
  finish_ring_cta<T, D, GT>(a, w, c, smem, e);
}

// FP8 K/V converted in registers (DecodeFp8Kernel::kRegisters): codes and page scales stream
// through a cp.async ring as in decode_fp8_kernel, but no 16-bit tile is written: each warp loads
// the codes of its fragments from the ring with 16-byte LDS and converts them right before the
// mma (cvt.rn.f16x2.e4m3x2 per code pair; for bf16 on to f32 and a bf16x2 pack: every E4M3 value
// is exact in both), so a tile costs one barrier, not two. ldmatrix cannot feed converted
// fragments, so the fragments' element order is chosen to make every thread's codes contiguous:
//   S = Q K^T: thread (g, t) of a warp holds key g of each 8-key block and, for k-step ks, the
//     dims KB t + 4 ks + {0, 1} (mma k 2t, 2t+1) and + {2, 3} (k 2t+8, 2t+9), KB = D / 4: its
//     KB codes of the key are one or two 16-byte loads. Q's A fragments take the same dims, so
//     each score is the same sum over the head's dims (in another order: not bitwise the
//     16-bit tile kernel's, whose k-steps hold dims 16 ks .. 16 ks + 15).
//   O += P V: n-tile j, column g holds dim VB g + j (VB = D / 8), and the k rows 2t, 2t+1 (keys
//     2t, 2t+1 of the block, S's columns) are two 16-byte (8-byte at D 64) loads of codes VB g ..
//     VB g + VB - 1 of those keys; one byte permute pairs key 2t's and 2t+1's codes of two
//     n-tiles. store() writes each dim at its place.
// The page scales (powers of two) leave the operands: K's multiplies the key's fp32 score, V's the
// softmax weight before it is rounded to bf16 (bf16(p) s == bf16(p s): exact), so the tensor
// cores see the codes' exact values and every product is the 16-bit tile kernel's. f16 keeps V's
// scale in the operand (an f16 weight times a small scale would fall into f16's subnormals): one
// f16x2 multiply per code pair, the f32 route where a scale is not an f16 value.
// Warp instructions per 8-key block at head_dim 128 (K + V: 2 KB of codes): 5 LDS (4 of codes, 1
// of scales), 16 + 16 mma, ~44 softmax and scale multiplies, 8 PRMT, and per code pair (32) one
// cvt, plus for bf16 3 (two f16 -> f32, one pack) / for f16 V one HMUL2: ~215 (bf16) / ~140
// (f16), against ~280 and a second barrier per tile for the converting tile (6 per code pair, 2
// LDS + 4 STS per thread and tile, 8 ldmatrix) and ~80 for the 16-bit kernel over 4 KB.
// kDeep (DecodeFp8Kernel::kRegistersDeep): a deeper ring, 80 KB (head_dim 128) / 72 KB (64) of
// codes in flight in 99 / 85 KB of shared memory, which leaves 2 CTAs per SM instead of 3: the
// wave model runs 2 per SM at batch 1 anyway, where the deeper ring keeps more bytes in flight.
template <int D, bool kDeep = false>
struct Fp8RegShape {
  static constexpr int TILE = 64;  // keys per stage (2 blocks of 8 per warp)
  // Default: 48 KB of codes in flight at either head_dim (3 CTAs per SM at 128).
  static constexpr int kStages = kDeep ? (D == 128 ? 6 : 10) : (D == 128 ? 4 : 7);
  using Ring = Fp8CodeRing<D, TILE, kStages, Fp8RegShape>;
  static constexpr int kSmemBytes = kStages * Ring::kStageBytes;
  static_assert(Ring::kStageBytes % 16 == 0, "stages start 16-byte aligned");
  // Byte offset of 16-byte chunk c of key row `row` in a stage's [TILE][D] codes: chunks XOR-
  // swizzled so that the fragment loads (8 lanes a phase: K rows g, g + 1 of chunks 2t, 2t + 1
  // at D 128; V rows 2t, 2t + 1 of chunk g) hit distinct banks. D 64 (4 chunks a row): by
  // (row / 2) % 4, leaving a 2-way conflict on V's 8-byte loads.
  static __device__ __forceinline__ int offset(int row, int c) {
    const int x = D == 128 ? (row & 7) : ((row >> 1) & 3);
    return row * D + ((c ^ x) << 4);
  }
};

// Four E4M3 codes -> two f16x2 (codes 0, 1 in lo; 2, 3 in hi): exact. The halves of `codes` go
// to the conversions as 16-bit registers (no shift or mask per pair).
__device__ __forceinline__ void fp8x4_to_half2x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n"
      ".reg .b16 l, h;\n"
      "mov.b32 {l, h}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(codes));
#else
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes), __NV_E4M3);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes >> 16), __NV_E4M3);
  lo = uint32_t(l.x) | (uint32_t(l.y) << 16);
  hi = uint32_t(h.x) | (uint32_t(h.y) << 16);
#endif
}

// An f16x2 of exact E4M3 values as a pair of T (bf16: through f32, exact).
template <typename T>
__device__ __forceinline__ uint32_t half2_as(uint32_t h2) {
  if constexpr (std::is_same_v<T, __half>) {
    return h2;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
    return Mma<T>::pack(f.x, f.y);
  }
}

// f16: an f16x2 of codes times their keys' V scales; `fast`: both scales are 0 or f16 values
// (2^-24 .. 2^15), where one f16 multiply rounds the exact product once, as the f32 route does.
__device__ __forceinline__ uint32_t half2_scaled(uint32_t h2, bool fast, uint32_t s2, float s0,
                                                 float s1) {
  const __half2 v = *reinterpret_cast<const __half2*>(&h2);
  if (fast) {
    const __half2 r = __hmul2(v, *reinterpret_cast<const __half2*>(&s2));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
  const float2 f = __half22float2(v);
  return Mma<__half>::pack(f.x * s0, f.y * s1);
}

__device__ __forceinline__ bool f16_scale(float s) {
  return s == 0.f || (s >= 0x1p-24f && s <= 0x1p15f);
}

// MmaCompute's online softmax over FP8 codes in a Fp8RegShape stage (the fragment order above).
template <typename T, int D, int GT>
struct Fp8RegCompute {
  using S = Fp8RegShape<D>;
  static constexpr int kChains = 2;  // MmaCompute's two independent mma chains of S
  static constexpr int KS = D / 16;  // k-steps of S = Q K^T
  static constexpr int NTL = D / 8;  // 8-dim n-tiles of O
  static constexpr int KB = D / 4;   // K codes per thread and key
  static constexpr int VB = D / 8;   // V codes per thread and key
  static constexpr int SBW = S::TILE / 32;
  static constexpr int kSources = kThreads / 32;
  static constexpr bool kF16 = std::is_same_v<T, __half>;
  int g, t4, warp;
  uint32_t qa[KS][2];  // q row g: dims KB t + 4 ks + {0, 1} and + {2, 3}
  float o[NTL][4];     // [j][0..1]: row g, dims VB 2t + j and VB (2t + 1) + j; [2..3] padding
  float m_r, l_r;
  int first_, end_;

  __device__ __forceinline__ void init(const DecodeArgs& a, const CtaWork& w) {
    const int lane = threadIdx.x & 31;
    g = lane >> 2;
    t4 = lane & 3;
    warp = threadIdx.x >> 5;
    int qi, h;
    row_of(a, w, w.r0 + g, qi, h);
    const T* q = static_cast<const T*>(a.q) + (int64_t(w.q_start) + qi) * a.q_stride + h * D;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (g < w.nr) {  // 4-byte loads: q rows are only 4-byte aligned (q_token_stride even)
        qa[ks][0] = *reinterpret_cast<const uint32_t*>(q + KB * t4 + 4 * ks);
        qa[ks][1] = *reinterpret_cast<const uint32_t*>(q + KB * t4 + 4 * ks + 2);
      } else {
        qa[ks][0] = qa[ks][1] = 0u;
      }
    }
    const int row_end = w.causal ? w.kv_len - w.q_len + 1 + qi : w.kv_len;
    end_ = min(w.kv_end, row_end);
    first_ = a.window > 0 ? max(w.kv_begin, row_end - a.window) : w.kv_begin;
#pragma unroll
    for (int j = 0; j < NTL; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    m_r = -INFINITY;
    l_r = 0.f;
  }

  // O += P V over one 8-key block: rows va (key 2t) and vc (key 2t + 1) of V codes VB g ..
  template <bool kFast>
  __device__ __forceinline__ void pv(const uint32_t* va, const uint32_t* vc, uint32_t pa,
                                     uint32_t s2, float s0, float s1) {
#pragma unroll
    for (int wd = 0; wd < VB / 4; ++wd) {
      // Code j of keys 2t and 2t + 1 side by side: n-tiles 4 wd .. 4 wd + 3.
      uint32_t h[4];
      fp8x4_to_half2x2(__byte_perm(va[wd], vc[wd], 0x5140), h[0], h[1]);
      fp8x4_to_half2x2(__byte_perm(va[wd], vc[wd], 0x7362), h[2], h[3]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t b;
        if constexpr (kF16)
          b = half2_scaled(h[i], kFast, s2, s0, s1);
        else
          b = half2_as<T>(h[i]);
        Mma<T>::k8(o[4 * wd + i], pa, 0u, b);
      }
    }
  }

  // ck, cv: the stage's K and V codes; sc: its scales ([TILE][2]: K, V of each key); the first key
  // is tbase.
  __device__ __forceinline__ void tile(const uint8_t* ck, const uint8_t* cv, const float* sc,
                                       int tbase, float scale_log2) {
    const int kv_first = first_, kv_end = end_;
#pragma unroll
    for (int sb = 0; sb < SBW; ++sb) {
      const int tok0 = (warp * SBW + sb) * 8;
      uint32_t kw[KS];  // word ks: codes KB t + 4 ks .. + 3 of key g
#pragma unroll
      for (int i = 0; i < KB / 16; ++i) {
        const uint4 x =
            *reinterpret_cast<const uint4*>(ck + S::offset(tok0 + g, (KB / 16) * t4 + i));
        kw[4 * i] = x.x;
        kw[4 * i + 1] = x.y;
        kw[4 * i + 2] = x.z;
        kw[4 * i + 3] = x.w;
      }
      uint32_t va[VB / 4], vc[VB / 4];  // codes VB g .. of keys 2t and 2t + 1
      if constexpr (D == 128) {
        const uint4 x = *reinterpret_cast<const uint4*>(cv + S::offset(tok0 + 2 * t4, g));
        const uint4 y = *reinterpret_cast<const uint4*>(cv + S::offset(tok0 + 2 * t4 + 1, g));
        va[0] = x.x, va[1] = x.y, va[2] = x.z, va[3] = x.w;
        vc[0] = y.x, vc[1] = y.y, vc[2] = y.z, vc[3] = y.w;
      } else {
        const uint2 x =
            *reinterpret_cast<const uint2*>(cv + S::offset(tok0 + 2 * t4, g >> 1) + 8 * (g & 1));
        const uint2 y = *reinterpret_cast<const uint2*>(cv + S::offset(tok0 + 2 * t4 + 1, g >> 1) +
                                                        8 * (g & 1));
        va[0] = x.x, va[1] = x.y;
        vc[0] = y.x, vc[1] = y.y;
      }
      // K and V scales of keys 2t, 2t + 1.
      const float4 ps = *reinterpret_cast<const float4*>(sc + 2 * (tok0 + 2 * t4));
      float acc[kChains][4];
#pragma unroll
      for (int i = 0; i < kChains; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t b0, b1;
        fp8x4_to_half2x2(kw[ks], b0, b1);
        const uint32_t a[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
        Mma<T>::k16(acc[ks % kChains], a, half2_as<T>(b0), half2_as<T>(b1));
      }
      float s[2] = {acc[0][0], acc[0][1]};
#pragma unroll
      for (int i = 1; i < kChains; ++i) {
        s[0] += acc[i][0];
        s[1] += acc[i][1];
      }
      const int tk = tbase + tok0 + 2 * t4;
      const float x0 = tk < kv_end && tk >= kv_first ? s[0] * ps.x * scale_log2 : -INFINITY;
      const float x1 = tk + 1 < kv_end && tk + 1 >= kv_first ? s[1] * ps.z * scale_log2 : -INFINITY;
      const float2 p = online_softmax_step(x0, x1, m_r, l_r, o);
      const float p0 = p.x, p1 = p.y;
      if constexpr (kF16) {
        const uint32_t pa = Mma<T>::pack(p0, p1);
        const __half2 s2h = __floats2half2_rn(ps.y, ps.w);
        const uint32_t s2 = *reinterpret_cast<const uint32_t*>(&s2h);
        if (f16_scale(ps.y) && f16_scale(ps.w))
          pv<true>(va, vc, pa, s2, ps.y, ps.w);
        else
          pv<false>(va, vc, pa, s2, ps.y, ps.w);
      } else {
        pv<true>(va, vc, Mma<T>::pack(p0 * ps.y, p1 * ps.w), 0u, 0.f, 0.f);
      }
    }
  }

  __device__ __forceinline__ void store(float* s_acc, float (*s_m)[GT], float (*s_l)[GT]) {
    float l = l_r;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < GT) {
      if (t4 == 0) {
        s_m[warp][g] = m_r;
        s_l[warp][g] = l;
      }
      float* row = s_acc + (warp * GT + g) * D;
#pragma unroll
      for (int j = 0; j < NTL; ++j) {
        row[VB * 2 * t4 + j] = o[j][0];
        row[VB * (2 * t4 + 1) + j] = o[j][1];
      }
    }
  }
};

template <typename T, int D, int GT, bool kDeep>
__global__ void __launch_bounds__(kThreads) decode_fp8_reg_kernel(DecodeArgs a) {
  using S = Fp8RegShape<D, kDeep>;
  using C = Fp8RegCompute<T, D, GT>;
  using Ring = typename S::Ring;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ EpilogueSmem<GT> e;

  const CtaWork w = cta_work<GT>(a);  // before pdl_wait: as the ring kernel
  if (w.b < 0 || w.nr <= 0) return;   // padding item, or rows past the request's queries
  prefetch_first_keys<D, 1>(a, w, a.prefetch_tokens);
  pdl_wait();
  pdl_launch_dependents();
  Ring ring(smem, a, w);  // stages of codes in S::offset's swizzle, then the scales
  const int n_tiles = ring.num_tiles();
  ring.start(n_tiles);
  C c;
  c.init(a, w);
  for (int it = 0; it < n_tiles; ++it) {
    const int st = ring.advance(it, n_tiles);  // tile it landed, tile it - 1 consumed
    c.tile(ring.codes_k(st), ring.codes_v(st), ring.scales(st), ring.kv_begin + it * S::TILE,
           a.scale_log2);
  }
  finish_ring_cta<T, D, GT>(a, w, c, smem, e);
}

// The same CTA with the K/V tiles brought by the TMA (the default on sm_90 when pages are a
// multiple of the tile; DecodeLoader::kCpAsync turns it off): one thread issues, per tile, one 3-D
// box copy of (64 dims, 1 kv head, TILE tokens) per 64 dims of K and of V, which land on the
// stage's mbarrier; the warps wait on it instead of on their own cp.async groups. A tile never
// crosses a page (kv ranges start at multiples of 64 tokens, pages are multiples of TILE), so its
// tokens are consecutive slots of the cache viewed as [slots, kv heads, D]. Slots past kv_end in
// the last tile hold whatever the cache has there: their scores are masked, and their V rows are
// zeroed before use (p = 0 times a NaN would still be NaN). With the plan's cp_async_stages the
// same stages are filled by every thread's 16-byte cp.async instead, each thread arriving on the
// stage's mbarrier when its copies land: the TMA moves 128-byte box rows at ~4.2 TB/s on the
// H200, short of the HBM's 4.6, so over long ranges the threads' copies are the faster.
// W = 1: stages of the ring's tile; W = 2: of twice its tokens (TmaShape; head_dim 128 only, so
// that a tile of 64 tokens starts where a kv range may: at a multiple of 64).
template <typename T, int D, int GT, int W>
__global__ void __launch_bounds__(kThreads)
    decode_tma_kernel(const __grid_constant__ DecodeArgs a,
                      const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v) {
#ifdef LONGCTX_TMA_DEVICE
  using S = TmaShape<D, W>;
  constexpr int TILE = S::TILE, kStages = S::kStages;
  using L = TmaLayout<D, TILE>;
  using C = MmaCompute<T, D, GT, L>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ EpilogueSmem<GT> e;
  __shared__ __align__(8) uint64_t full[kStages];
  // The 128-byte swizzle repeats every 1024 bytes: stages start 1024-aligned (TmaShape's pad).
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

  LONGCTX_TIMELINE_MARK(kMarkEntry);
  const bool leader = threadIdx.x == 0;
  auto stage_k = [&](int st) { return smem_addr(smem + st * S::kStageBytes); };
  auto stage_v = [&](int st) { return stage_k(st) + TILE * D * 2; };
  auto bar = [&](int st) { return smem_addr(&full[st]); };
  // Launched as a dependent of the KV store (kernels/cuda/pdl.cuh): the maps (kernel parameters)
  // are prefetched while it drains, the work item read and the first keys' L2 prefetch issued
  // (prefetch_first_keys) before pdl_wait; every read of K / V after it. The o_proj GEMV after
  // this kernel may start meanwhile (and wait for it).
  if (leader) {
    tma_prefetch_map(&tm_k);
    tma_prefetch_map(&tm_v);
  }
  const CtaWork w = cta_work<GT>(a);
  if (w.b < 0 || w.nr <= 0) return;  // padding item, or rows past the request's queries
  prefetch_first_keys<D, 2>(a, w, a.prefetch_tokens);
  pdl_wait();
  pdl_launch_dependents();
  LONGCTX_TIMELINE_MARK(kMarkWork);
  const bool cp_async_stages = w.cp_async_stages;
  if (leader) {
    // Arrivals per phase: the leader's expect_tx, or every thread's cp.async completion.
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbar_init(bar(st), cp_async_stages ? kThreads : 1);
    mbar_init_fence();
  }
  // The item's first key may be a sliding window's (any key); its tiles start at the multiple
  // of 64 at or before it (where a split may start, so the TMA's tiles stay within a page) and
  // the keys before kv_first are masked.
  const int kv_begin = w.kv_begin & ~63, kv_end = w.kv_end, kvh = w.kvh;
  const int32_t* pages = a.kv_indices + w.page_base;
  const int ps = a.page_size;
  const int n_tiles = (kv_end - kv_begin + TILE - 1) / TILE;
  __syncthreads();

  // Tile t's page id and slot offset, looked up a tile before the copy that needs them.
  auto page_of = [&](int t, int& page, int& off) {
    const int t0 = kv_begin + t * TILE;
    const int pi = t0 / ps;
    page = __ldg(pages + pi);
    off = t0 - pi * ps;
  };
  // Called by every thread. TMA: the leader issues the boxes. cp.async: every thread copies its
  // 16-byte chunks (a warp's 32 cover two whole 256-byte rows) into the same swizzled layout and
  // arrives on the stage's barrier when they land.
  constexpr int kChunks = TILE * D / 8 / kThreads;  // per thread per tensor
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
  // Thread tid copies chunk tid % (D / 8) of tokens tid / (D / 8) + j * kTokStep.
  constexpr int kTokStep = kThreads / (D / 8);
  const int cp_tok = threadIdx.x / (D / 8), cp_cc = threadIdx.x % (D / 8);
  // Pages that are not a multiple of the tile (only with cp_async_stages): a tile may span
  // several pages, so every token looks up its own (carrying from the thread's first), and
  // tokens past kv_end are zero-filled instead of read from pages the request may not own.
  const bool whole_pages = ps % TILE == 0;
  auto issue = [&](int t, int page, int off) {
    const int st = t % kStages;
    const int slot = page * ps + off;
    if (cp_async_stages) {
      int pos = kv_begin + t * TILE + cp_tok;
      int pi = pos / ps, sl = pos - pi * ps;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int tok = cp_tok + j * kTokStep;
        int64_t row = int64_t(slot) + tok;
        int bytes = 16;
        if (!whole_pages) {
          bytes = pos < kv_end ? 16 : 0;
          row = bytes ? int64_t(__ldg(pages + pi)) * ps + sl : 0;
          pos += kTokStep;
          sl += kTokStep;
          while (sl >= ps) sl -= ps, ++pi;
        }
        const int64_t src = (row * a.num_kv_heads + kvh) * D + cp_cc * 8;
        cp_async_16(L::addr(stage_k(st), tok, cp_cc), kc + src, bytes);
        cp_async_16(L::addr(stage_v(st), tok, cp_cc), vc + src, bytes);
      }
      mbar_arrive_cp_async(bar(st));
    } else if (leader) {
      mbar_arrive_expect_tx(bar(st), S::kStageBytes);
#pragma unroll
      for (int h = 0; h < D / 64; ++h) {
        tma_load_3d(stage_k(st) + h * TILE * 128, &tm_k, bar(st), h * 64, kvh, slot);
        tma_load_3d(stage_v(st) + h * TILE * 128, &tm_v, bar(st), h * 64, kvh, slot);
      }
    }
  };
  int next_page = 0, next_off = 0;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) {
      int pg, of;
      page_of(st, pg, of);
      issue(st, pg, of);
    }
  }
  if (kStages - 1 < n_tiles) page_of(kStages - 1, next_page, next_off);

  C c;
  c.init(a, w);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int it = 0; it < n_tiles; ++it) {
    __syncthreads();  // every warp is done with tile it - 1: its stage can be refilled
    const int nx = it + kStages - 1;
    if (nx < n_tiles) {
      issue(nx, next_page, next_off);
      if (nx + 1 < n_tiles) page_of(nx + 1, next_page, next_off);
    }
    const int st = it % kStages;
    mbar_wait(bar(st), (it / kStages) & 1);
    if (it == 0) LONGCTX_TIMELINE_MARK(kMarkFirstTile);
    const int tbase = kv_begin + it * TILE;
    if (tbase + TILE > kv_end) {
      // Zero this warp's V rows past kv_end (the rows MmaCompute reads are the warp's own).
#pragma unroll
      for (int sb = 0; sb < C::SBW; ++sb) {
        const int tok0 = (warp * C::SBW + sb) * 8;
        for (int i = lane; i < 8 * (D / 8); i += 32) {
          const int tok = tok0 + i / (D / 8), cc = i % (D / 8);
          if (tbase + tok >= kv_end) {
            const uint32_t adr = L::addr(stage_v(st), tok, cc);
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(adr), "r"(0u)
                         : "memory");
          }
        }
      }
      __syncwarp();
    }
    c.tile(stage_k(st), stage_v(st), tbase, a.scale_log2);
  }
  LONGCTX_TIMELINE_MARK(kMarkRangeDone);
  __syncthreads();
  // Every issued copy has been waited for: the ring's shared memory holds the accumulators now.
  float* s_acc = reinterpret_cast<float*>(smem);
  c.store(s_acc, e.m, e.l);
  __syncthreads();
  finish_cta<T, D, GT, C::kSources, W == 2 ? 16 : 8>(a, s_acc, e, w);
#else
  __trap();
#endif
}

// CTAs per (item, kv head) for `group` rows (q heads x queries per request) of a kv head.
int head_tiles_of(int group) { return (group + kMaxGroup - 1) / kMaxGroup; }

// Rows (q heads x queries) per CTA: the smallest instantiated size that holds the group's rows
// (or kMaxGroup).
int group_tile_of(int group) {
  return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : kMaxGroup;
}

// Work items the plan may create (sizes the workspace): one per request plus about kCtasPerSm
// CTAs per SM of extra splits; decode_chunk never picks a chunk that would need more.
int64_t max_work_items(int max_batch, int num_kv_heads, int group, int num_sms) {
  int64_t ctas_per_item = int64_t(num_kv_heads) * head_tiles_of(group);
  int64_t target = (int64_t(num_sms) * kCtasPerSm + ctas_per_item - 1) / ctas_per_item;
  return int64_t(max_batch) + target;
}

struct WorkspaceLayout {
  size_t work = 0, po = 0, plse = 0, counters = 0, group_counters = 0, total = 0;
  int64_t max_partials = 0;
};

// max_q: the most queries per request (a partial slot's states are max_q x num_qo_heads).
WorkspaceLayout layout_of(int batch, int64_t max_items, int num_qo_heads, int num_kv_heads,
                          int head_dim, int max_q) {
  const int64_t ctas_per_item =
      int64_t(num_kv_heads) * head_tiles_of(num_qo_heads / num_kv_heads * max_q);
  WorkspaceLayout w;
  w.max_partials = decode_max_partials(max_items, batch);
  const int64_t states = w.max_partials * num_qo_heads * max_q;
  w.work = 0;
  w.po = workspace_align(w.work + sizeof(int32_t) * kWorkInts * max_items);
  w.plse = workspace_align(w.po + sizeof(float) * states * head_dim);
  w.counters = workspace_align(w.plse + sizeof(float) * states);
  w.group_counters =
      workspace_align(w.counters + sizeof(int32_t) * std::max<int64_t>(1, batch * ctas_per_item));
  w.total = workspace_align(w.group_counters +
                            sizeof(int32_t) * std::max<int64_t>(1, w.max_partials * ctas_per_item));
  return w;
}

void check_shape(int num_qo_heads, int num_kv_heads, int head_dim) {
  LONGCTX_CHECK(num_qo_heads > 0 && num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0,
                ErrorCode::kUnsupported,
                "decode: num_qo_heads {} is not a positive multiple of num_kv_heads {}",
                num_qo_heads, num_kv_heads);
  LONGCTX_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256, ErrorCode::kUnsupported,
                "decode: head_dim {} not supported (64, 128 or 256)", head_dim);
}

// Sets up `kernel` (its opt-in to > 48 KB of dynamic shared memory, per device and
// instantiation; plan() calls this too, outside any graph capture), then launches it with
// (*a, rest...) when a != nullptr and returns 0, or returns its resident CTAs per SM on the
// current device (plans ask with a == nullptr).
template <typename Kernel, typename... Rest>
int launch_or_count(Kernel kernel, int smem, const DecodeArgs* a, dim3 grid, cudaStream_t stream,
                    const Rest&... rest) {
  require_dynamic_smem(kernel, smem);
  if (a != nullptr) {
    launch_pdl(kernel, grid, dim3(kThreads), smem, stream, *a, rest...);
    return 0;
  }
  return std::max(occupancy_per_sm(kernel, kThreads, smem), 1);
}

// f(std::integral_constant<int, GT>{}) for the group tile gt (1, 2, 4 or 8: group_tile_of).
template <typename F>
int with_group_tile(int gt, F&& f) {
  switch (gt) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// The cp.async kernel of this shape: launch_or_count's contract.
template <typename T, int D>
int cp_async_launch(const DecodeArgs* a, dim3 grid, int gt, cudaStream_t stream) {
  return with_group_tile(gt, [&](auto tile) {
    return launch_or_count(decode_ring_kernel<T, D, decltype(tile)::value>,
                           RingShape<D>::kSmemBytes, a, grid, stream);
  });
}
// The TMA kernel of this shape (W: stage width in ring tiles): launch_or_count's contract. maps:
// the K and V tensor maps (read only when launching).
template <typename T, int D, int W>
int tma_launch_w(const DecodeArgs* a, const CUtensorMap* maps, dim3 grid, int gt,
                 cudaStream_t stream) {
  static const CUtensorMap kUnused[2] = {};
  const CUtensorMap* m = a != nullptr ? maps : kUnused;
  return with_group_tile(gt, [&](auto tile) {
    return launch_or_count(decode_tma_kernel<T, D, decltype(tile)::value, W>,
                           TmaShape<D, W>::kSmemBytes, a, grid, stream, m[0], m[1]);
  });
}
// loader 1: stages of the ring's tile; 2: of twice its tokens.
template <typename T, int D>
int tma_launch(const DecodeArgs* a, const CUtensorMap* maps, dim3 grid, int gt, int loader,
               cudaStream_t stream) {
  if constexpr (D == 128)
    if (loader == 2) return tma_launch_w<T, D, 2>(a, maps, grid, gt, stream);
  return tma_launch_w<T, D, 1>(a, maps, grid, gt, stream);
}

// The kernel of the loader: launches it (a != nullptr) or only sets it up; returns its resident
// CTAs per SM. maps: the K and V tensor maps (loaders 1 and 2).
template <typename T, int D>
int ring_launch(const DecodeArgs* a, const CUtensorMap* maps, dim3 grid, int gt, int loader,
                cudaStream_t stream) {
  if constexpr (D <= 128)  // decode_loader gives head_dim 256 the cp.async ring
    if (loader >= 1) return tma_launch<T, D>(a, maps, grid, gt, loader, stream);
  return cp_async_launch<T, D>(a, grid, gt, stream);
}

// ring_launch at the call's head_dim (64, 128 or 256: check_shape).
template <typename T>
int ring_launch_dim(int head_dim, const DecodeArgs* a, const CUtensorMap* maps, dim3 grid, int gt,
                    int loader, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return ring_launch<T, 64>(a, maps, grid, gt, loader, stream);
    case 128:
      return ring_launch<T, 128>(a, maps, grid, gt, loader, stream);
    default:
      return ring_launch<T, 256>(a, maps, grid, gt, loader, stream);
  }
}

// The FP8 kernel of this shape: launch_or_count's contract.
template <typename T, int D>
int fp8_launch(const DecodeArgs* a, dim3 grid, int gt, cudaStream_t stream) {
  return with_group_tile(gt, [&](auto tile) {
    return launch_or_count(decode_fp8_kernel<T, D, decltype(tile)::value>, Fp8Shape<D>::kSmemBytes,
                           a, grid, stream);
  });
}

// The FP8 kernel that converts in registers: launch_or_count's contract.
template <typename T, int D, bool kDeep>
int fp8_reg_launch(const DecodeArgs* a, dim3 grid, int gt, cudaStream_t stream) {
  return with_group_tile(gt, [&](auto tile) {
    return launch_or_count(decode_fp8_reg_kernel<T, D, decltype(tile)::value, kDeep>,
                           Fp8RegShape<D, kDeep>::kSmemBytes, a, grid, stream);
  });
}

// The plan's FP8 kernel (DecodePlan::fp8_kernel: never kAuto) at head_dim D: launch_or_count's
// contract.
template <typename T, int D>
int fp8_kernel_launch(DecodeFp8Kernel kernel, const DecodeArgs* a, dim3 grid, int gt,
                      cudaStream_t stream) {
  switch (kernel) {
    case DecodeFp8Kernel::kConvertTile:
      return fp8_launch<T, D>(a, grid, gt, stream);
    case DecodeFp8Kernel::kRegistersDeep:
      return fp8_reg_launch<T, D, true>(a, grid, gt, stream);
    default:
      return fp8_reg_launch<T, D, false>(a, grid, gt, stream);
  }
}

// fp8_kernel_launch at head_dim 64 or 128.
template <typename T>
int fp8_launch_dim(int head_dim, DecodeFp8Kernel kernel, const DecodeArgs* a, dim3 grid, int gt,
                   cudaStream_t stream) {
  return head_dim == 64 ? fp8_kernel_launch<T, 64>(kernel, a, grid, gt, stream)
                        : fp8_kernel_launch<T, 128>(kernel, a, grid, gt, stream);
}

int fp8_ctas_per_sm(int head_dim, int group, DecodeFp8Kernel kernel) {
  const int gt = group_tile_of(group);
  fp8_launch_dim<__half>(head_dim, kernel, nullptr, dim3(), gt, nullptr);
  return fp8_launch_dim<__nv_bfloat16>(head_dim, kernel, nullptr, dim3(), gt, nullptr);
}

// Resident CTAs per SM for this shape (both dtypes are set up; bf16's count is returned).
int ring_ctas_per_sm(int head_dim, int group, int loader) {
  const int gt = group_tile_of(group);
  ring_launch_dim<__half>(head_dim, nullptr, nullptr, dim3(), gt, loader, nullptr);
  return ring_launch_dim<__nv_bfloat16>(head_dim, nullptr, nullptr, dim3(), gt, loader, nullptr);
}

template <typename T>
void run_typed(const DecodeParams& p, const DecodePlan& plan, cudaStream_t stream) {
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int rows = group * plan.max_q_len;
  // With GT < rows (rows not a multiple of 8 above 8), head_tiles covers the rest.
  const int gt = group_tile_of(rows);
  DecodeArgs a{p.q,
               p.k_cache,
               p.v_cache,
               p.o,
               p.lse,
               p.o_f32,
               p.kv_indices,
               plan.work_items,
               plan.partial_o,
               plan.partial_lse,
               plan.counters,
               p.q_token_stride > 0 ? p.q_token_stride : int64_t(p.num_qo_heads) * p.head_dim,
               p.num_qo_heads,
               p.num_kv_heads,
               group,
               (rows + gt - 1) / gt,
               p.page_size,
               plan.max_q_len,
               p.window,
               p.sm_scale * kLog2e,
               p.k_scale,
               p.v_scale,
               plan.group_counters,
               plan.merge_group,
               plan.prefetch_tokens};
  const int64_t ctas = decode_grid_ctas(plan);
  LONGCTX_CHECK(ctas <= 0x7fffffff, ErrorCode::kInvalidArgument, "decode_run: {} CTAs", ctas);
  const dim3 grid(static_cast<unsigned>(ctas));
  if (plan.kv_format == KvCacheFormat::kFp8E4M3) {
    fp8_launch_dim<T>(p.head_dim, plan.fp8_kernel, &a, grid, gt, stream);
    return;
  }
  CUtensorMap maps[2];
  if (plan.loader >= 1) {
    const int tile = plan.loader * decode_tile_tokens(p.head_dim);  // TmaShape<D, loader>::TILE
    maps[0] = kv_cache_tensor_map(p.k_cache, kKvTensorMapAnySlot, p.num_kv_heads, p.head_dim, tile,
                                  p.dtype);
    maps[1] = kv_cache_tensor_map(p.v_cache, kKvTensorMapAnySlot, p.num_kv_heads, p.head_dim, tile,
                                  p.dtype);
  }
  ring_launch_dim<T>(p.head_dim, &a, maps, grid, gt, plan.loader, stream);
}

}  // namespace

size_t decode_workspace_bytes(int max_batch, int num_qo_heads, int num_kv_heads, int head_dim,
                              int num_sms, int max_q_len) {
  check_shape(num_qo_heads, num_kv_heads, head_dim);
  LONGCTX_CHECK(max_q_len >= 1 && max_q_len <= kDecodeMaxQLen, ErrorCode::kInvalidArgument,
                "decode_workspace_bytes: max_q_len {} not in [1, {}]", max_q_len, kDecodeMaxQLen);
  if (num_sms <= 0) num_sms = current_sm_count();
  // A plan's layout follows its batch's most queries q: more take fewer items (more CTAs each)
  // but larger partial slots, so the bound is the largest of every q's layout.
  size_t bytes = 0;
  for (int q = 1; q <= max_q_len; ++q) {
    const int64_t items =
        max_work_items(max_batch, num_kv_heads, num_qo_heads / num_kv_heads * q, num_sms);
    bytes =
        std::max(bytes, layout_of(max_batch, items, num_qo_heads, num_kv_heads, head_dim, q).total);
  }
  return bytes;
}

int64_t decode_grid_ctas(const DecodePlan& plan) {
  if (plan.num_kv_heads <= 0) return 0;
  return int64_t(plan.num_work_items) * plan.num_kv_heads *
         head_tiles_of(plan.num_qo_heads / plan.num_kv_heads * plan.max_q_len);
}

namespace {
// Every instantiation, by group tile: the cp.async ring (W = 0) and the TMA stages (W = 1, 2).
template <typename T, int D, int W>
void add_kernels_w(std::vector<const void*>& v) {
  auto add = [&](auto gt) {
    constexpr int GT = decltype(gt)::value;
    if constexpr (W == 0)
      v.push_back(reinterpret_cast<const void*>(decode_ring_kernel<T, D, GT>));
    else
      v.push_back(reinterpret_cast<const void*>(decode_tma_kernel<T, D, GT, W>));
  };
  add(std::integral_constant<int, 1>());
  add(std::integral_constant<int, 2>());
  add(std::integral_constant<int, 4>());
  add(std::integral_constant<int, 8>());
}
template <typename T, int D>
void add_kernels(std::vector<const void*>& v) {
  if constexpr (D <= 128) {  // the FP8 kernels' head_dims
    v.push_back(reinterpret_cast<const void*>(decode_fp8_kernel<T, D, 1>));
    v.push_back(reinterpret_cast<const void*>(decode_fp8_kernel<T, D, 2>));
    v.push_back(reinterpret_cast<const void*>(decode_fp8_kernel<T, D, 4>));
    v.push_back(reinterpret_cast<const void*>(decode_fp8_kernel<T, D, 8>));
    for (bool deep : {false, true}) {
      v.push_back(deep ? reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 1, true>)
                       : reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 1, false>));
      v.push_back(deep ? reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 2, true>)
                       : reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 2, false>));
      v.push_back(deep ? reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 4, true>)
                       : reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 4, false>));
      v.push_back(deep ? reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 8, true>)
                       : reinterpret_cast<const void*>(decode_fp8_reg_kernel<T, D, 8, false>));
    }
  }
  add_kernels_w<T, D, 0>(v);
  if constexpr (D <= 128) add_kernels_w<T, D, 1>(v);
  if constexpr (D == 128) add_kernels_w<T, D, 2>(v);
}
}  // namespace

bool is_decode_kernel(const void* func) {
  static const std::vector<const void*> kernels = [] {
    std::vector<const void*> v;
    add_kernels<__nv_bfloat16, 64>(v);
    add_kernels<__nv_bfloat16, 128>(v);
    add_kernels<__nv_bfloat16, 256>(v);
    add_kernels<__half, 64>(v);
    add_kernels<__half, 128>(v);
    add_kernels<__half, 256>(v);
    return v;
  }();
  return std::find(kernels.begin(), kernels.end(), func) != kernels.end();
}

DecodePlan decode_plan(const int32_t* kv_indptr, const int32_t* last_page_len, int batch,
                       int page_size, int num_qo_heads, int num_kv_heads, int head_dim,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream, int num_sms,
                       int min_chunk_tokens, const DecodeGraphMode& graph,
                       const DecodeTuning& tuning, int window, KvCacheFormat kv_format,
                       const DecodeQueries& queries) {
  check_shape(num_qo_heads, num_kv_heads, head_dim);
  LONGCTX_CHECK(batch >= 0 && page_size >= 1, ErrorCode::kInvalidArgument,
                "decode_plan: batch {} / page_size {} invalid", batch, page_size);
  LONGCTX_CHECK(graph.num_padding >= 0 && graph.num_padding <= batch, ErrorCode::kInvalidArgument,
                "decode_plan: {} padding requests of {}", graph.num_padding, batch);
  LONGCTX_CHECK(window >= 0, ErrorCode::kInvalidArgument, "decode_plan: window {} < 0", window);
  if (num_sms <= 0) num_sms = current_sm_count();
  const std::vector<int64_t> len = decode_lengths(kv_indptr, last_page_len, batch, page_size);
  const std::vector<int32_t> q_len = decode_q_lens(queries, batch);
  const int max_q = std::max(1, q_len.empty() ? 1 : *std::max_element(q_len.begin(), q_len.end()));
  // A kv head's rows: its q heads times the most queries of a request (decode.h).
  const int group = num_qo_heads / num_kv_heads * max_q;
  const std::vector<int64_t> first = decode_first_keys(len, window, q_len, queries.causal);
  const std::vector<int64_t> span = decode_spans(len, first);
  const int64_t max_items = max_work_items(batch, num_kv_heads, group, num_sms);
  const int64_t ctas_per_item = int64_t(num_kv_heads) * head_tiles_of(group);
  // The chunk of the real requests alone: padding must not change how they are split.
  const int real = batch - graph.num_padding;
  const std::vector<int64_t> real_len(span.begin(), span.begin() + real);
  // FP8 caches take the FP8 kernels (cp.async rings of codes): loader 0.
  const bool fp8 = kv_format == KvCacheFormat::kFp8E4M3;
  // kAuto: the registers kernel with the default ring.
  const DecodeFp8Kernel fp8_kernel =
      tuning.fp8_kernel == DecodeFp8Kernel::kAuto ? DecodeFp8Kernel::kRegisters : tuning.fp8_kernel;
  LONGCTX_CHECK(!fp8 || head_dim <= 128, ErrorCode::kUnsupported,
                "decode_plan: an FP8 KV cache at head_dim {} (the FP8 kernel takes 64 and 128)",
                head_dim);
  const int loader = fp8 ? 0 : decode_loader(page_size, head_dim, tma_supported(), tuning);
  const int resident = fp8 ? fp8_ctas_per_sm(head_dim, group, fp8_kernel)
                           : ring_ctas_per_sm(head_dim, group, loader);
  const DecodeWaveModel model = decode_wave_model(tuning, num_sms, resident, min_chunk_tokens);
  const int64_t chunk = decode_chunk(real_len, max_work_items(real, num_kv_heads, group, num_sms),
                                     ctas_per_item, model);
  const bool cp_async_stages =
      !fp8 && decode_cp_async_stages(loader, page_size, head_dim, chunk, tuning);
  const DecodeWork work =
      decode_work_items(len, first, kv_indptr, real, chunk, cp_async_stages, queries, q_len);
  const int64_t items = int64_t(work.items.size()) / kWorkInts;
  LONGCTX_ASSERT(items <= max_items, "decode work items {} exceed the bound {}", items, max_items);
  LONGCTX_ASSERT(work.num_partials <= decode_max_partials(max_items, batch),
                 "decode partial slots {} exceed the bound {}", work.num_partials,
                 decode_max_partials(max_items, batch));
  const WorkspaceLayout w =
      layout_of(batch, max_items, num_qo_heads, num_kv_heads, head_dim, max_q);
  LONGCTX_CHECK(workspace != nullptr && workspace_bytes >= w.total, ErrorCode::kInvalidArgument,
                "decode_plan: workspace of {} bytes, need {} (decode_workspace_bytes)",
                workspace_bytes, w.total);
  char* base = static_cast<char*>(workspace);
  if (items > 0)
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(base + w.work, work.items.data(),
                                       sizeof(int32_t) * work.items.size(), cudaMemcpyHostToDevice,
                                       stream));
  // The fused merge's counters (both levels) start at 0; each run leaves them at 0 again.
  LONGCTX_CUDA_CHECK(cudaMemsetAsync(base + w.counters, 0, w.total - w.counters, stream));
  DecodePlan plan;
  plan.batch_size = batch;
  plan.num_qo_heads = num_qo_heads;
  plan.num_kv_heads = num_kv_heads;
  plan.head_dim = head_dim;
  plan.page_size = page_size;
  plan.chunk_tokens = int(chunk);
  plan.window = window;
  plan.max_q_len = max_q;
  plan.causal = queries.causal;
  plan.loader = loader;
  plan.kv_format = kv_format;
  plan.fp8_kernel = fp8_kernel;
  plan.cp_async_stages = cp_async_stages;
  plan.num_work_items = int(items);
  plan.num_partials = work.num_partials;
  plan.work_items = reinterpret_cast<const int32_t*>(base + w.work);
  plan.partial_o = reinterpret_cast<float*>(base + w.po);
  plan.partial_lse = reinterpret_cast<float*>(base + w.plse);
  plan.counters = reinterpret_cast<int32_t*>(base + w.counters);
  plan.group_counters = reinterpret_cast<int32_t*>(base + w.group_counters);
  plan.max_partials = int(w.max_partials);
  plan.prefetch_tokens = kDecodePrefetchTokens;
  return plan;
}

void decode_run(const DecodeParams& p, const DecodePlan& plan, cudaStream_t stream) {
  LONGCTX_CHECK(p.kv_format == plan.kv_format, ErrorCode::kInvalidArgument,
                "decode_run: the params' KV cache format differs from the plan's");
  LONGCTX_CHECK(p.kv_format == KvCacheFormat::kDtype || (p.k_scale && p.v_scale),
                ErrorCode::kInvalidArgument,
                "decode_run: an FP8 KV cache needs k_scale and v_scale");
  LONGCTX_CHECK(p.q_token_stride == 0 || (p.q_token_stride % 2 == 0 &&
                                          p.q_token_stride >= int64_t(p.num_qo_heads) * p.head_dim),
                ErrorCode::kInvalidArgument,
                "decode_run: q_token_stride {} must be 0 or an even number >= {} x {}",
                p.q_token_stride, p.num_qo_heads, p.head_dim);
  LONGCTX_CHECK(
      p.batch_size == plan.batch_size && p.num_qo_heads == plan.num_qo_heads &&
          p.num_kv_heads == plan.num_kv_heads && p.head_dim == plan.head_dim &&
          p.page_size == plan.page_size && p.window == plan.window &&
          (p.qo_indptr != nullptr || plan.max_q_len == 1) && p.causal == plan.causal,
      ErrorCode::kInvalidArgument,
      "decode_run: params (batch {}, heads {}/{}, dim {}, page {}, window {}, queries, causal "
      "rule) differ from the plan",
      p.batch_size, p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size, p.window);
  if (plan.num_work_items == 0) return;
  switch (p.dtype) {
    case DType::kBF16:
      return run_typed<__nv_bfloat16>(p, plan, stream);
    case DType::kF16:
      return run_typed<__half>(p, plan, stream);
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "decode_run: dtype {} not bf16/f16",
                    dtype_name(p.dtype));
  }
}

#ifdef LONGCTX_TIMELINE_PROBE
void decode_timeline_reset() { timeline::reset(); }
void decode_timeline_print(int64_t ctas) {
  timeline::print(int(std::min<int64_t>(ctas, timeline::kCtas)),
                  {"entry", "work item", "first tile", "range done", "counted in", "merged"});
}
#endif

}  // namespace longctx::kernels::cuda
