// Paged batch prefill for Hopper (sm_90a): warpgroup MMA (wgmma) + warp specialization. Same
// interface, work list and semantics as the mma.sync kernel of prefill.cu (see prefill.h);
// paged_prefill_run() picks this path on sm_90 for head_dim 64 and 128 (prefill_sm90.h), with
// 16-bit or FP8 E4M3 K/V (an FP8 cache's producer gathers codes and converts them into the
// 16-bit stages: Sm90Tiling::kFp8), and head_dim 256 with 16-bit K/V (64-key tiles).
//
// A CTA = 2 or 3 consumer warpgroups + 1 producer warpgroup; it processes work items (request,
// row tile of 64 rows per consumer warpgroup, kv head): one per CTA, or (persistent variants, the
// default) with one CTA per SM, rounds of gridDim.x items in a snake order (item_at); the items
// are the plan's (request, row tile) entries times kv heads, in prefill_unit()'s order. With the
// plan's stream-K split (kernels/prefill_schedule.h) each CTA takes the split's whole snake rounds
// (often none) and then its range of items, the first and last possibly a piece (a range of key
// tiles) that writes an fp32 partial state, and prefill_merge_kernel combines each cut item's
// pieces afterwards.
//   the producer (the last warpgroup, 40 or 32 registers): for a block-sparse item first writes
//     the bitmaps of the key blocks some / every row of the tile keeps (the consumers skip the
//     blocks none keeps and mask per row only where the rows differ); loads each item's Q tile,
//     then gathers its K and V tiles (128 keys; 64 at head_dim 256) through the page table with
//     cp.async row copies (any page size 1..256; with pages of a multiple of 64 tokens, or
//     consecutive pages (kv_contiguous), the TMA brings the tile's whole 64-key halves instead,
//     Sm90Tiling::kTma) into a ring of 2 or 3 stages; cp.async.mbarrier.arrive.noinc signals a
//     buffer's "full" mbarrier when its copies land, and the producer waits on the buffer's "empty"
//     mbarrier before reusing it. K, V and Q have separate barriers, so K of tile i+2 loads while P
//     V of tile i still reads V, and the next item's Q and K/V load while the consumers finish the
//     current item.
//   the consumers (2 x 232 registers for a 128-row tile; 3 x 160 for the 192-row tile at head_dim
//     64): 64 packed rows each, S = Q K^T with wgmma m64n{keys}k16 (Q and K from 128B-swizzled
//     shared memory, K-major), online softmax in fp32 on the accumulators (exp2, scale folded
//     into the FFMA), then O += P V with wgmma m64n{head_dim}k16, P from registers (the S
//     accumulator layout converted to A fragments) and V from shared memory as an MN-major
//     (transposed) operand. S of tile n is issued before P V of tile n-1, so the softmax overlaps
//     the tensor cores; by default the consumer warpgroups take turns issuing their GEMMs
//     (ping-pong, round robin), so one's softmax overlaps the others' GEMMs too.
//
// Shared-memory tiles are [head_dim / 64 column blocks][rows][64 elements]: each 128-byte row
// holds 64 elements of one block, its 16-byte chunks XOR-swizzled by row % 8 (the wgmma 128B
// swizzle, atoms of 8 rows = 1024 bytes, tile bases 1024-aligned). K-major operands (Q, K): 8-row
// groups 1024 bytes apart (SBO), the k16 slice selected by a 32-byte start offset within the row. V
// as the MN-major B of P V: keys are rows (8-key groups 1024 apart = SBO), the 64-dim column blocks
// are LBO = KEYS * 128 bytes apart.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/cuda/block_sparse_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/merge_device.cuh"
#include "kernels/cuda/prefill_sm90.h"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/tma_device.cuh"
#include "kernels/prefill_schedule.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

// Hopper-only PTX (wgmma, setmaxnreg) is compiled only for the sm_90a target; other targets get
// an empty kernel body, and the host never launches it there (prefill_sm90_available()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LONGCTX_SM90A_DEVICE 1
#endif

namespace longctx::kernels::cuda {
namespace {

constexpr int kMaskWords = 1024;  // block-sparse bitmap, as in prefill.cu (4M keys)
constexpr int kProducerThreads = 128;
// Named barriers (0 is __syncthreads): the producer's bitmap barrier, then per consumer
// warpgroup its epilogue barrier and its ping-pong turn.
constexpr int kBarProducer = 1;
constexpr int kBarEpilogue = 2;  // + warpgroup
constexpr int kBarTurn = 5;      // + warpgroup

template <int HEAD_DIM, int KEYS, int STAGES, bool PERSISTENT, bool PINGPONG, bool TMA = false,
          int CONSUMERS = 2, bool LEAN = false, int FP8_SLOTS = 0>
struct Sm90Tiling {
  // Consumer warpgroups of 64 query rows each: 2 (a 128-row tile), or 3 (192 rows, head_dim 64:
  // FA3's tile there). Each K/V tile then serves 192 rows, and a third warpgroup's GEMMs cover
  // the others' softmax, which at head_dim 64 costs as much as their GEMMs.
  static constexpr int kConsumers = CONSUMERS;
  static constexpr int kRows = 64 * CONSUMERS;
  static constexpr int kConsumerThreads = 128 * CONSUMERS;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // setmaxnreg budgets (multiples of 8): 40 + 2 x 232 or 32 + 3 x 160; FP8 caches: 56 + 2 x 224
  // or 32 + 3 x 160 (the producer converts, see kFp8). setmaxnreg only moves registers between
  // the CTA's warps: the sum must fit what the launch gave (kThreads x the per-thread count that
  // __launch_bounds__(kThreads, 1) allows: 384 x 168 = 64,512, 512 x 128 = 65,536); a 64 + 2 x
  // 224 split (65,536) left the consumers' setmaxnreg.inc waiting forever. ptxas -v: at head_dim
  // 128 a 56-register producer spilled 56 bytes (stores) / 68 (loads) per thread with its
  // conversion unrolled over the 4 rows, so it converts one row pass at a time (no spills). At
  // head_dim 64 the three consumer warpgroups at 152 (beside a 56-register producer) spilled
  // 48 / 48, at 160 8 / 4 as bf16's; a 32-register producer adds 8 / 8.
  static constexpr bool FP8 = FP8_SLOTS > 0;
  static constexpr int kProducerRegs = FP8 && CONSUMERS == 2 ? 56 : CONSUMERS == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = CONSUMERS == 2 ? (FP8 ? 224 : 232) : 160;
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                kThreads * kLaunchRegs);
  static_assert(CONSUMERS == 2 || (CONSUMERS == 3 && HEAD_DIM == 64));
  // head_dim 64, 128 or 256: 1, 2 or 4 column blocks of 64 elements (128-byte shared-memory rows).
  static constexpr int kD = HEAD_DIM;
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks of a row
  static constexpr int kKeys = KEYS, kStages = STAGES;
  // Persistent: one CTA per SM walks work items blockIdx.x, + gridDim.x, ... so the producer
  // loads the next item's Q and K/V (and builds its block-sparse bitmaps) while the consumers
  // finish the current one.
  static constexpr bool kPersistent = PERSISTENT;
  // Ping-pong (FA3's inter-warpgroup schedule): the two consumer warpgroups take turns issuing
  // their GEMMs (named barriers), so one warpgroup's softmax runs while the other's GEMMs use the
  // tensor cores.
  static constexpr bool kPingPong = PINGPONG;
  // TMA (pages of a multiple of 64 tokens, or consecutive pages): each 64-key half of a K/V
  // tile that lies below kv_len comes as one box of 64 consecutive slots per 64 dims, issued by
  // a lane of the producer's first warp; the rest of the tile (the request's last keys, and zero
  // rows past them) by cp.async as without it. The TMA unit then moves nearly all of K and V,
  // and the producer threads' issue slots (shared with the consumers' schedulers) go to the
  // tails only.
  static constexpr bool kTma = TMA;
  // Lean (the default without a block mask, lean_stages()): no block-sparse bitmaps and no
  // output staging (the epilogue stores O from the accumulators, a quad's 16 bytes of a row at a
  // time). Without the sparse branches ptxas spills nothing (the full tiling spills 8-24 bytes
  // per thread), and the 40 KB freed make room for a third K/V stage at head_dim 128 (224 KB of
  // the 227).
  static constexpr bool kLean = LEAN;
  // FP8 E4M3 caches (kv_format kFp8E4M3): the producer gathers the codes (half the bytes) and the
  // page scales by cp.async into a staging tile of its own and converts them into the 16-bit
  // K / V stages the consumers read, unchanged (see the producer). No TMA (the boxes would be of
  // codes, and the conversion needs every row in a thread's registers anyway), and no output
  // staging: the epilogue stores from the accumulators as the lean tiling does, which leaves room
  // for the codes beside the full tiling's bitmaps.
  static constexpr bool kFp8 = FP8;
  // Ring of FP8 code slots (each one K or V tile's codes and scales): the gathers run
  // kCodeSlots - 1 slots ahead of the conversion (see the producer).
  static constexpr int kCodeSlots = FP8_SLOTS;
  // Head_dim 256 stores from the accumulators in the full tiling too: a 64 KB staging tile beside
  // its 192 KB of Q and K/V would pass the 227 KB.
  static constexpr bool kStageO = !LEAN && !FP8 && HEAD_DIM <= 128;
  static constexpr int kQBytes = kRows * kD * 2;
  static constexpr int kKvBytes = KEYS * kD * 2;  // one K (or V) stage
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + STAGES * kKvBytes;
  static constexpr int kOOff = kVOff + STAGES * kKvBytes;  // output staging, [kRows][kD]
  // FP8 staging: kCodeSlots code slots [KEYS][kD] (bytes), then their scales [KEYS][4] (fp32;
  // one copy per thread of a row's four, so that every thread reads only what it copied).
  static constexpr int kF8Off = kOOff + (kStageO ? kQBytes : 0);
  static constexpr int kF8CodeBytes = KEYS * kD;
  static constexpr int kF8ScaleBytes = KEYS * 4 * 4;
  static constexpr int kF8ScaleOff = kF8Off + FP8_SLOTS * kF8CodeBytes;
  // any-row bitmap, then every-row bitmap
  static constexpr int kBitsOff = kF8ScaleOff + FP8_SLOTS * kF8ScaleBytes;
  static constexpr int kBarOff = kBitsOff + (LEAN ? 0 : 2 * kMaskWords * 4);
  // k_full, k_empty, v_full, v_empty per stage, q_full, q_empty; + 1024 bytes of slack to align
  // the base.
  static constexpr int kSmemBytes = kBarOff + (4 * STAGES + 2) * 8 + 1024;
  // The S wgmma is m64n{KEYS}k16. Head_dim 256 takes 64-key tiles (FA3's N there): its O
  // accumulator is 128 registers a consumer thread, S at 128 keys 64 more and P 32 would pass the
  // 232 a consumer has (at 64 keys: 32 and 16); and Q (64 KB) + 2 stages of K and V (32 KB each)
  // make 192 KB, where 128-key stages (64 KB each) would need 320.
  static_assert(KEYS == 128 || (KEYS == 64 && HEAD_DIM == 256));
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256);
  static_assert(HEAD_DIM != 256 || (!FP8 && CONSUMERS == 2 && STAGES == 2));
  static_assert(!FP8 || (!TMA && PINGPONG && PERSISTENT && FP8_SLOTS >= 2));
  // sm_90's opt-in dynamic shared memory per block (227 KB): every instantiation must fit it.
  static_assert(kSmemBytes <= 227 * 1024, "the tiling's shared memory passes sm_90's 227 KB");
};

#ifdef LONGCTX_SM90A_DEVICE

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

using detail::mbar_arrive;
using detail::mbar_arrive_cp_async;
using detail::mbar_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using detail::swizzle128_offset;  // byte offset of (row, chunk 0..15) in a [2][rows][128 B] tile

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async (generic proxy) writes must be ordered before wgmma (async proxy) reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ----
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the async MMA window.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) asm volatile("" : "+r"(r[i][x])::"memory");
}

// Shared-memory matrix descriptor, 128B swizzle: start >> 4 (bits 0-13), leading byte offset
// >> 4 (16-29), stride byte offset >> 4 (32-45), swizzle mode 1 = 128B (62-63).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}

// clang-format off
__device__ __forceinline__ void wgmma_ss_n128_bf16(float* d, uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs_n128_bf16(float* d, const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
__device__ __forceinline__ void wgmma_ss_n128_f16(float* d, uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs_n128_f16(float* d, const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
__device__ __forceinline__ void wgmma_rs_n64_bf16(float* d, const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
__device__ __forceinline__ void wgmma_rs_n64_f16(float* d, const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
__device__ __forceinline__ void wgmma_ss_n64_bf16(float* d, uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_ss_n64_f16(float* d, uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs_n256_bf16(float* d, const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
      "{%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
__device__ __forceinline__ void wgmma_rs_n256_f16(float* d, const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
      "{%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
// clang-format on

template <typename T, int N>
struct Wgmma;
template <>
struct Wgmma<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void ss(float* d, uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n128_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {
    wgmma_rs_n128_bf16(d, a, b);
  }
};
template <>
struct Wgmma<__half, 128> {
  static __device__ __forceinline__ void ss(float* d, uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n128_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {
    wgmma_rs_n128_f16(d, a, b);
  }
};

template <>
struct Wgmma<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void ss(float* d, uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n64_bf16(d, a, b, acc);
  }
  static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {
    wgmma_rs_n64_bf16(d, a, b);
  }
};
template <>
struct Wgmma<__half, 64> {
  static __device__ __forceinline__ void ss(float* d, uint64_t a, uint64_t b, int acc) {
    wgmma_ss_n64_f16(d, a, b, acc);
  }
  static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {
    wgmma_rs_n64_f16(d, a, b);
  }
};
template <>
struct Wgmma<__nv_bfloat16, 256> {
  static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {
    wgmma_rs_n256_bf16(d, a, b);
  }
};
template <>
struct Wgmma<__half, 256> {
  static __device__ __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {
    wgmma_rs_n256_f16(d, a, b);
  }
};

#endif  // LONGCTX_SM90A_DEVICE

// One work item's geometry (all threads compute it identically).
struct Sm90Item {
  int b, tile, kvh, q_start, q_len, kv_len, num_rows, row0, tok_min, tok_max;
  int kv_end;     // keys [0, kv_end) are the most any row of the tile sees
  int full_end;   // keys [0, full_end) every row sees
  int num_tiles;  // key tiles of KEYS in [0, kv_end); a piece: its end tile
  int kt_begin;   // first key tile (0 but for a piece of a split unit or a sliding window)
  int win_all;    // sliding window: keys before it some row of the tile does not see (else 0)
  int slot;       // a piece's partial slot; -1: the whole unit, written to o / lse
  const int32_t* pages;
};

// The stream-K split of the plan (PrefillPlan::split_ranges; ranges == nullptr: none).
struct Sm90Split {
  const int32_t* ranges;  // [gridDim.x, kPrefillCtaRangeInts] (PrefillCtaRange)
  int dp_rounds;          // whole snake rounds of gridDim.x units before each CTA's range
  float* partial_o;       // [slots, tile rows, D]
  float* partial_lse;     // [slots, tile rows]
};

// The unit order (prefill_unit in kernels/prefill_schedule.h).
struct Sm90Units {
  int num_items;   // the plan's work items
  int unit_heads;  // kv heads per block of units
};

template <int KEYS, int ROWS>
__device__ __forceinline__ Sm90Item make_item(const PagedPrefillParams& p,
                                              const int32_t* __restrict__ work, Sm90Units units,
                                              int idx) {
  Sm90Item it;
  const PrefillUnit unit = prefill_unit(idx, units.num_items, units.unit_heads);
  it.kvh = unit.kv_head;
  const int item = unit.item;
  it.b = work[2 * item];
  it.tile = work[2 * item + 1];
  const int group = p.num_qo_heads / p.num_kv_heads;
  it.q_start = p.qo_indptr[it.b];
  it.q_len = p.qo_indptr[it.b + 1] - it.q_start;
  const int n_pages = p.kv_indptr[it.b + 1] - p.kv_indptr[it.b];
  it.kv_len = n_pages == 0 ? 0 : (n_pages - 1) * p.page_size + p.kv_last_page_len[it.b];
  it.pages = p.kv_indices + p.kv_indptr[it.b];
  it.num_rows = it.q_len * group;
  it.row0 = it.tile * ROWS;
  it.tok_min = it.row0 / group;
  it.tok_max = (min(it.row0 + ROWS, it.num_rows) - 1) / group;
  it.kv_end = it.kv_len;
  it.full_end = it.kv_len;
  if (p.mask_mode == MaskMode::kCausal) {
    it.kv_end = min(it.kv_len, max(0, it.kv_len - it.q_len + it.tok_max + 1));
    it.full_end = min(it.kv_len, max(0, it.kv_len - it.q_len + it.tok_min + 1));
  }
  it.num_tiles = (it.kv_end + KEYS - 1) / KEYS;
  // Sliding window: tiles before the first row's first key are not read; keys before the last
  // row's first key are masked.
  const bool windowed = p.mask_mode == MaskMode::kCausal && p.window > 0;
  it.kt_begin = windowed ? window_first_key(it.kv_len - it.q_len + it.tok_min, p.window) / KEYS : 0;
  it.win_all = windowed ? window_first_key(it.kv_len - it.q_len + it.tok_max, p.window) : 0;
  it.slot = -1;
  return it;
}

template <typename T, typename Tl>
__global__ void __launch_bounds__(Tl::kThreads, 1)
    paged_prefill_sm90_kernel(const PagedPrefillParams p, const int32_t* __restrict__ work,
                              int num_ctas_total, const Sm90Units units, const Sm90Split split,
                              const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v) {
#ifdef LONGCTX_SM90A_DEVICE
  constexpr int KEYS = Tl::kKeys, STAGES = Tl::kStages, kD = Tl::kD, kChunks = Tl::kChunks;
  constexpr int kRows = Tl::kRows, kThreads = Tl::kThreads;
  constexpr int kConsumerThreads = Tl::kConsumerThreads;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t s_q = base;
  const uint32_t s_k = base + Tl::kKOff;
  const uint32_t s_v = base + Tl::kVOff;
  uint8_t* s_o = smem + Tl::kOOff;
  // Block-sparse bitmaps of the current item, one bit per 128-key block: some row of the tile
  // sees the block (s_bits) / every row does (s_all). Built by the producer per item.
  uint32_t* s_bits = reinterpret_cast<uint32_t*>(smem + Tl::kBitsOff);
  uint32_t* s_all = s_bits + kMaskWords;
  const uint32_t bars = base + Tl::kBarOff;
  auto k_full = [&](int s) { return bars + 8 * s; };
  auto k_empty = [&](int s) { return bars + 8 * (STAGES + s); };
  auto v_full = [&](int s) { return bars + 8 * (2 * STAGES + s); };
  auto v_empty = [&](int s) { return bars + 8 * (3 * STAGES + s); };
  const uint32_t q_full = bars + 8 * (4 * STAGES), q_empty = q_full + 8;

  const int tid = threadIdx.x, warp = tid >> 5;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const bool causal = p.mask_mode == MaskMode::kCausal;
  const bool sparse = !Tl::kLean && p.block_mask != nullptr;  // the host checked the lean case
  // With a split, this CTA's range of units after the whole rounds (PrefillCtaRange: whole units
  // but the first, from key tile tile_begin, and a last one up to tile_end when that is > 0). Its
  // fields are read where needed (L1 hits), not held: the producer has 40 registers.
  const int32_t* range =
      split.ranges != nullptr ? split.ranges + kPrefillCtaRangeInts * int(blockIdx.x) : nullptr;
  // A split's grid is its CTAs, whatever the variant: its whole rounds are rounds of gridDim.x.
  const int stride = Tl::kPersistent || range != nullptr ? int(gridDim.x) : num_ctas_total;
  // The k-th work item of this CTA: rounds of `stride` items, walked forward in even rounds and
  // backward in odd ones (past the end: none). The plan orders the items heaviest first, so with
  // a plain stride the low CTAs would take the heaviest item of every round (causal 32K: the
  // busiest SM ~1.6 % above the mean, 8K ~6 %, by key tiles); the snake evens the sums.
  auto item_at = [&](int k) -> int {
    const int r = k * stride;
    return (k & 1) ? r + stride - 1 - int(blockIdx.x) : r + int(blockIdx.x);
  };
  const int dp_rounds = range != nullptr ? split.dp_rounds : 0;
  const int num_k = range != nullptr
                        ? dp_rounds + __ldg(range + 2) - __ldg(range) + (__ldg(range + 3) > 0)
                        : (num_ctas_total + stride - 1) / stride;
  // The k-th unit of this CTA (the producer and the consumers walk the same ones); false past
  // the snake's last round.
  auto unit_at = [&](int k, Sm90Item& it) -> bool {
    if (range == nullptr || k < dp_rounds) {
      const int idx = item_at(k);
      if (idx >= num_ctas_total) return false;
      it = make_item<KEYS, kRows>(p, work, units, idx);
      return true;
    }
    k -= dp_rounds;
    const int u = __ldg(range) + k;
    it = make_item<KEYS, kRows>(p, work, units, u);
    const int kb = k == 0 ? __ldg(range + 1) : 0;
    const int ke = u == __ldg(range + 2) ? __ldg(range + 3) : it.num_tiles;
    if (kb > 0 || ke < it.num_tiles) it.slot = __ldg(range + (k == 0 ? 4 : 5));
    it.kt_begin = max(kb, it.kt_begin);
    it.num_tiles = ke;
    return true;
  };

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(k_full(s), kThreads - kConsumerThreads);
      mbar_init(v_full(s), kThreads - kConsumerThreads);
      mbar_init(k_empty(s), kConsumerThreads);
      mbar_init(v_empty(s), kConsumerThreads);
    }
    // Q: the producer's cp.async copies (noinc) and its threads' arrivals after writing the
    // item's bitmaps (their release makes the bitmaps visible to the consumers).
    mbar_init(q_full, 2 * (kThreads - kConsumerThreads));
    mbar_init(q_empty, kConsumerThreads);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // First key tile >= kt that some row of `it` needs (num_tiles when none).
  auto next_tile = [&](const Sm90Item& it, int kt) -> int {
    if (!sparse || kt >= it.num_tiles) return kt;
    return detail::next_marked_tile<KEYS>(s_bits, kt, it.num_tiles, it.kv_end);
  };

  if (warp >= kConsumerThreads / 32) {
    // ================= producer warpgroup =================
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tl::kProducerRegs));
    const int pt = tid - kConsumerThreads;
    const T* __restrict__ q = static_cast<const T*>(p.q);
    const T* __restrict__ kc = static_cast<const T*>(p.k_cache);
    const T* __restrict__ vc = static_cast<const T*>(p.v_cache);
    // K/V: 4 threads per key row, each copying kChunks / 4 of its chunks (64-byte runs:
    // coalesced; a warp's 8 rows x 4 chunks spread evenly over the banks in the swizzled
    // layout); this thread copies rows (pt >> 2) + 32 rp. Their cache slots
    // (page * page_size + offset, -1 past kv_len) are looked up once per tile, all lookups in
    // flight together (a dependent lookup per row serialized the producer: 268 TF), and serve
    // both K and V. Row (pt >> 2) + 32 rp has the swizzle phase (pt >> 2) & 7 for every rp, so
    // the destination of chunk pass h in row pass rp is dst_off[h] + 4096 rp (few live
    // registers: the producer has 40).
    constexpr int kRowPasses = KEYS / 32;
    constexpr int kChunkPasses = kChunks / 4;
    uint32_t dst_off[kChunkPasses];
#pragma unroll
    for (int h = 0; h < kChunkPasses; ++h)
      dst_off[h] = swizzle128_offset(KEYS, pt >> 2, (pt & 3) + 4 * h);
    if (Tl::kTma && pt == 0) {
      detail::tma_prefetch_map(&tm_k);
      detail::tma_prefetch_map(&tm_v);
    }
    // Cache slot of key `key` of the item: a shift and a mask for the usual power-of-two pages
    // (a division by a runtime value is ~20 instructions, in the producer's issue slots). H200,
    // causal 32K (bench_attention --prefill, two rounds in one call): head_dim 128 with TMA on
    // pages of 128 541.7 -> 589.9 TF, head_dim 64 on pages of 16 379 -> 400 TF (8K: 341 -> 371),
    // but head_dim 128 on pages of 16 (cp.async only) 509 -> 492 TF, so that one keeps the
    // division.
    // Consecutive pages (p.kv_contiguous): key j sits at the item's first slot + j.
    constexpr bool kShiftLookup = Tl::kD == 64 || Tl::kTma || Tl::kFp8;
    const int page_size = p.page_size;
    const bool pow2_pages = kShiftLookup && (page_size & (page_size - 1)) == 0;
    const int page_shift = __ffs(page_size) - 1;
    const bool contiguous = p.kv_contiguous;
    auto slot_of = [&](const Sm90Item& it, int slot0, int key) -> int {
      if (contiguous) return slot0 + key;
      return pow2_pages ? (it.pages[key >> page_shift] << page_shift) + (key & (page_size - 1))
                        : it.pages[key / page_size] * page_size + key % page_size;
    };
    int n = 0;  // key tiles loaded so far (ring position)
    // FP8 caches: the producer converts. Its warpgroup gathers a tile's codes and page scales
    // into its staging tile (cp.async, half the bytes of a 16-bit tile) and, once they land,
    // writes them as 16-bit elements times the scale (exact: the scales are powers of two) into
    // the swizzled K / V stage the consumers' wgmma reads, while the consumers run the previous
    // tiles' GEMMs and softmax. Chosen over converting in the consumers: those are bound by issue
    // slots and latency already (see the variants' notes below), their registers hold S, P and O,
    // and the two (three) consumer warpgroups would each need all of a tile converted before
    // either could start it (a barrier across them per tile, against the ping-pong turns); the
    // producer instead runs up to STAGES tiles ahead, so its conversion is off the consumers'
    // critical path as long as it keeps pace. Each thread converts exactly the 16-byte chunks it
    // copied (rows (pt >> 2) + 32 rp, code chunks (pt & 3) + 4 h), so cp.async.wait_group alone
    // makes them visible (no barrier), and a code slot is reused as soon as the thread has
    // converted it. The gathers go in order K(t0), V(t0), K(t1), ... through a ring of
    // kCodeSlots slots, so while one slot converts the next kCodeSlots - 1 are in flight: with
    // two (K and V), a gather had one conversion's time to land (period per tile: the gather's
    // latency plus one conversion), with three a whole tile's (docs/fp8_kv.md, "The Hopper
    // prefill's producer").
    constexpr int kChunks8 = kD / 16;  // 16-byte code chunks of a row
    constexpr int kChunkPasses8 = kChunks8 / 4;
    using Code = uint8_t;
    const Code* __restrict__ kc8 = static_cast<const Code*>(p.k_cache);
    const Code* __restrict__ vc8 = static_cast<const Code*>(p.v_cache);
    constexpr int kSlots = Tl::kCodeSlots;
    auto slot_codes = [&](int j) { return base + Tl::kF8Off + j * Tl::kF8CodeBytes; };
    auto slot_scales = [&](int j) { return base + Tl::kF8ScaleOff + j * Tl::kF8ScaleBytes; };
    // Byte offset of code chunk c8 of staging row r. At head_dim 128 (128-byte rows) the odd
    // rows' chunk halves swap, so that a quarter warp (rows r, r + 1, chunks 0..3 or 4..7)
    // reads and writes all 32 banks once.
    auto code_off = [&](int r, int c8) -> uint32_t {
      return r * kD + (kD == 128 ? c8 ^ ((r & 1) << 2) : c8) * 16;
    };
    // Gathers tile kt's codes of one cache (K or V) and their page scales into the staging tile;
    // one commit group.
    auto issue_codes = [&](const Sm90Item& it, int slot0, int kt, uint32_t f, uint32_t fs,
                           const Code* __restrict__ src, const float* __restrict__ scales) {
#pragma unroll
      for (int rp = 0; rp < kRowPasses; ++rp) {
        const int r = (pt >> 2) + rp * 32;
        const int key = kt * KEYS + r;
        const bool ok = key < it.kv_len;
        const int slot = ok ? slot_of(it, slot0, key) : 0;
        const Code* row = src + (int64_t(slot) * p.num_kv_heads + it.kvh) * kD + (pt & 3) * 16;
#pragma unroll
        for (int h = 0; h < kChunkPasses8; ++h)
          cp_async_16(f + code_off(r, (pt & 3) + 4 * h), row + 64 * h, ok ? 16 : 0);
        const int page = pow2_pages ? slot >> page_shift : slot / page_size;
        cp_async_4(fs + (r * 4 + (pt & 3)) * 4, scales + int64_t(page) * p.num_kv_heads + it.kvh,
                   ok ? 4 : 0);
      }
      cp_async_commit();
    };
    // The landed codes -> the 16-bit stage at `dst` (shared window offset from smem). One row
    // pass at a time at head_dim 128 (its two chunks, 16 code pairs, are ILP enough): unrolled
    // over the 4 rows the producer spilled (see kProducerRegs).
    constexpr int kConvertUnroll = kD == 128 ? 1 : kRowPasses;
    auto convert_codes = [&](uint32_t dst, uint32_t f, uint32_t fs) {
#pragma unroll kConvertUnroll
      for (int rp = 0; rp < kRowPasses; ++rp) {
        const int r = (pt >> 2) + rp * 32;
        const float scale =
            *reinterpret_cast<const float*>(smem + (fs - base) + (r * 4 + (pt & 3)) * 4);
#pragma unroll
        for (int h = 0; h < kChunkPasses8; ++h) {
          const int c8 = (pt & 3) + 4 * h;
          const uint4 codes = *reinterpret_cast<const uint4*>(smem + (f - base) + code_off(r, c8));
          uint4 lo, hi;
          detail::fp8x16_to_elements<T>(codes, scale, lo, hi);
          *reinterpret_cast<uint4*>(smem + (dst - base) + swizzle128_offset(KEYS, r, 2 * c8)) = lo;
          *reinterpret_cast<uint4*>(smem + (dst - base) + swizzle128_offset(KEYS, r, 2 * c8 + 1)) =
              hi;
        }
      }
      // The generic-proxy stores must be visible to the consumers' wgmma (async proxy).
      fence_proxy_async();
    };
    // One item's key tiles. The gather cursor (tile kt_in, K or V, ring slot j_in) runs
    // kSlots gathers ahead of the conversion; every step commits one group (empty past the last
    // tile), so wait_group kSlots - 1 always means "the oldest slot landed". The item's last
    // gathers are all converted before it ends, so the next item starts the ring at slot 0.
    auto produce_fp8 = [&](const Sm90Item& it, int slot0) {
      int kt = next_tile(it, it.kt_begin);
      if (kt >= it.num_tiles) return;
      int kt_in = kt, j_in = 0;
      bool v_in = false;
      auto gather_next = [&] {
        if (kt_in < it.num_tiles) {
          issue_codes(it, slot0, kt_in, slot_codes(j_in), slot_scales(j_in), v_in ? vc8 : kc8,
                      v_in ? p.v_scale : p.k_scale);
          if (v_in) kt_in = next_tile(it, kt_in + 1);
          v_in = !v_in;
        } else {
          cp_async_commit();
        }
        j_in = j_in + 1 == kSlots ? 0 : j_in + 1;
      };
#pragma unroll
      for (int i = 0; i < kSlots; ++i) gather_next();
      for (int j = 0; kt < it.num_tiles; kt = next_tile(it, kt + 1), ++n) {
        const int s = n % STAGES;
        const uint32_t ph = (n / STAGES) & 1;
        cp_async_wait<kSlots - 1>();  // this tile's K codes
        mbar_wait(k_empty(s), ph ^ 1);
        convert_codes(s_k + s * Tl::kKvBytes, slot_codes(j), slot_scales(j));
        mbar_arrive(k_full(s));
        gather_next();  // into slot j
        j = j + 1 == kSlots ? 0 : j + 1;
        cp_async_wait<kSlots - 1>();  // this tile's V codes
        mbar_wait(v_empty(s), ph ^ 1);
        convert_codes(s_v + s * Tl::kKvBytes, slot_codes(j), slot_scales(j));
        mbar_arrive(v_full(s));
        gather_next();
        j = j + 1 == kSlots ? 0 : j + 1;
      }
    };
    int items_done = 0;
    for (int k = 0; k < num_k; ++k) {
      Sm90Item it;
      if (!unit_at(k, it)) continue;
      const int qn = items_done++;
      const int slot0 = contiguous && it.kv_len > 0 ? it.pages[0] * page_size : 0;
      // The consumers release Q after their last look at the bitmaps, so both can be rewritten.
      mbar_wait(q_empty, (qn & 1) ^ 1);
      if (sparse) {  // superset of what the tile needs: the group's heads x its query blocks
        const int nqb = (it.q_len + kSparseBlock - 1) / kSparseBlock;
        const int nkb = (it.kv_len + kSparseBlock - 1) / kSparseBlock;
        detail::mark_key_blocks_warps(p.block_mask + p.block_mask_indptr[it.b], nqb, nkb,
                                      (it.kv_end + kSparseBlock - 1) / kSparseBlock,
                                      p.block_mask_heads == 1 ? 0 : it.kvh * group,
                                      p.block_mask_heads == 1 ? 1 : group,
                                      it.tok_min / kSparseBlock, it.tok_max / kSparseBlock, pt >> 5,
                                      (kThreads - kConsumerThreads) / 32, pt & 31, s_bits, s_all);
        named_barrier(kBarProducer, kThreads - kConsumerThreads);
      }
      // Q tile: row r -> (token, head), a thread per 16-byte chunk; padding rows zero-filled.
      for (int r = pt / kChunks; r < kRows; r += 128 / kChunks) {
        const int c = pt % kChunks;
        const int pr = it.row0 + r;
        const bool ok = pr < it.num_rows;
        const int tok = ok ? pr / group : 0, h = it.kvh * group + (ok ? pr % group : 0);
        const T* src = q + ((int64_t(it.q_start + tok) * p.num_qo_heads + h) * kD + c * 8);
        cp_async_16(s_q + swizzle128_offset(kRows, r, c), ok ? src : q, ok ? 16 : 0);
      }
      mbar_arrive_cp_async(q_full);
      mbar_arrive(q_full);
      if constexpr (Tl::kFp8) {
        produce_fp8(it, slot0);
      } else {
        for (int kt = next_tile(it, it.kt_begin); kt < it.num_tiles;
             kt = next_tile(it, kt + 1), ++n) {
          const int s = n % STAGES;
          const uint32_t ph = (n / STAGES) & 1;
          // 64-key halves of the tile that the TMA brings (bit j: keys [64 j, 64 j + 64)).
          int tma_halves = 0;
          if constexpr (Tl::kTma) {
#pragma unroll
            for (int j = 0; j < KEYS / 64; ++j)
              if (kt * KEYS + 64 * (j + 1) <= it.kv_len) tma_halves |= 1 << j;
          }
          int slot[kRowPasses];  // -1: zero row (past kv_len); -2: the TMA's row
#pragma unroll
          for (int rp = 0; rp < kRowPasses; ++rp) {  // in flight while waiting for the stage
            const int key = kt * KEYS + (pt >> 2) + rp * 32;
            slot[rp] = (tma_halves >> (rp / 2)) & 1 ? -2
                       : key < it.kv_len            ? slot_of(it, slot0, key)
                                                    : -1;
          }
          // The TMA's boxes: lane j < KEYS / 64 of the producer's first warp brings the tile's
          // 64-key half j (from one page, or 64 consecutive slots), both 64-dim halves. Lane 0
          // announces the bytes before its own arrival, so the phase cannot complete without them;
          // a box may land before the announcement (the tx-count may go below zero meanwhile), so
          // the lanes need no sync (a __syncwarp here made ptxas spill ~170 bytes).
          auto tma_rows = [&](uint32_t dst, const CUtensorMap* map, uint32_t bar) {
            if (!Tl::kTma || pt >= 32 || tma_halves == 0) return;  // uniform in the warp
            if (pt == 0) mbar_expect_tx(bar, __popc(tma_halves) * 64 * kD * 2);
            if (pt >= KEYS / 64 || !((tma_halves >> pt) & 1)) return;
            const int s0 = slot_of(it, slot0, kt * KEYS + 64 * pt);
#pragma unroll
            for (int h = 0; h < kD / 64; ++h)
              detail::tma_load_3d(dst + h * KEYS * 128 + pt * 64 * 128, map, bar, h * 64, it.kvh,
                                  s0);
          };
          auto copy_rows = [&](uint32_t dst, const T* __restrict__ src) {
#pragma unroll
            for (int rp = 0; rp < kRowPasses; ++rp) {
              if (Tl::kTma && slot[rp] == -2) continue;
              const bool ok = slot[rp] >= 0;
              const T* row = src + (ok ? (int64_t(slot[rp]) * p.num_kv_heads + it.kvh) * kD : 0) +
                             (pt & 3) * 8;
#pragma unroll
              for (int h = 0; h < kChunkPasses; ++h)
                cp_async_16(dst + dst_off[h] + rp * 32 * 128, row + 32 * h, ok ? 16 : 0);
            }
          };
          mbar_wait(k_empty(s), ph ^ 1);
          tma_rows(s_k + s * Tl::kKvBytes, &tm_k, k_full(s));
          copy_rows(s_k + s * Tl::kKvBytes, kc);
          mbar_arrive_cp_async(k_full(s));
          mbar_wait(v_empty(s), ph ^ 1);
          tma_rows(s_v + s * Tl::kKvBytes, &tm_v, v_full(s));
          copy_rows(s_v + s * Tl::kKvBytes, vc);
          mbar_arrive_cp_async(v_full(s));
        }
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
  } else {
    // ================= consumer warpgroups =================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tl::kConsumerRegs));
    const int wg = warp >> 2;  // rows [64 wg, 64 wg + 64)
    const int wt = tid & 127;  // thread within the warpgroup
    const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int r_base = wg * 64 + (warp & 3) * 16 + g;  // this thread's rows: r_base, r_base + 8
    const float scale_log2 = p.sm_scale * 1.4426950408889634f;
    const uint32_t q_wg = s_q + wg * 64 * 128;
    T* out = static_cast<T*>(p.o);

    // Ping-pong turns: warpgroup wg issues its GEMMs after bar.sync on its turn barrier, which
    // completes when the previous warpgroup (round robin) has passed the turn (bar.arrive; 2 x 128
    // threads). All warpgroups walk the same items and tiles, so the turns go round; the last
    // warpgroup passes first so that 0 starts.
    constexpr int kWgs = Tl::kConsumers;
    auto turn_wait = [&] {
      if constexpr (Tl::kPingPong) named_barrier(kBarTurn + wg, 256);
    };
    auto turn_pass = [&] {
      if constexpr (Tl::kPingPong) named_barrier_arrive(kBarTurn + (wg + 1) % kWgs, 256);
    };
    if (wg == kWgs - 1) turn_pass();

    float o[kD / 2];  // 64 rows x kD dims / 128 threads, m16n8 accumulator layout per warp
    float m[2], l[2];
    int n = 0;  // key tiles consumed so far (ring position)
    int items_done = 0;
    for (int k = 0; k < num_k; ++k) {
      Sm90Item it;
      if (!unit_at(k, it)) continue;
      const int qn = items_done++;
      const int nqb = (it.q_len + kSparseBlock - 1) / kSparseBlock;
      const int nkb = (it.kv_len + kSparseBlock - 1) / kSparseBlock;
      const uint8_t* mask_base = sparse ? p.block_mask + p.block_mask_indptr[it.b] : nullptr;
      // Last visible key of tile row r (-1: padding row) and, when block-sparse, whether key
      // block kb is on for it.
      auto row_limit = [&](int r, int kb, bool& blk, int& first) -> int {
        const int pr = it.row0 + r;
        blk = true;
        first = 0;
        if (pr >= it.num_rows) return -1;
        const int tok = pr / group;
        if (causal && p.window > 0) first = window_first_key(it.kv_len - it.q_len + tok, p.window);
        if (sparse) {
          const int mh = p.block_mask_heads == 1 ? 0 : it.kvh * group + pr % group;
          blk = mask_base[(int64_t(mh) * nqb + tok / kSparseBlock) * nkb + kb] != 0;
        }
        return causal ? min(it.kv_len - 1, it.kv_len - it.q_len + tok) : it.kv_len - 1;
      };

      // Whether tile kt needs per-row masking: the causal edge, the KV end, a sliding window's
      // band edge, or a block-sparse
      // block that not every row of the tile keeps. Read before Q is released (the producer
      // then rewrites the bitmaps).
      auto needs_mask = [&](int kt) -> bool {
        const int kb = kt * KEYS / kSparseBlock;
        return (kt + 1) * KEYS > it.full_end || kt * KEYS < it.win_all ||
               (sparse && !((s_all[kb >> 5] >> (kb & 31)) & 1u));
      };
      // S = Q K^T for stage s into sc (issued and committed, not waited for; the caller waited
      // for k_full(s)).
      auto issue_qk = [&](float(&sc)[KEYS / 2], int s) {
        const uint32_t sk = s_k + s * Tl::kKvBytes;
        fence_proxy_async();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          const uint64_t da = make_desc(q_wg + (kk >> 2) * (kRows * 128) + (kk & 3) * 32, 16, 1024);
          const uint64_t db = make_desc(sk + (kk >> 2) * (KEYS * 128) + (kk & 3) * 32, 16, 1024);
          Wgmma<T, KEYS>::ss(sc, da, db, kk > 0);
        }
        wgmma_commit();
      };
      // O += P V for stage s (issued and committed, not waited for; the caller waited for
      // v_full(s)).
      auto issue_pv = [&](const uint32_t(&pa)[KEYS / 16][4], int s) {
        const uint32_t sv = s_v + s * Tl::kKvBytes;
        fence_proxy_async();
        reg_fence(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk)
          Wgmma<T, kD>::rs(o, pa[kk], make_desc(sv + kk * 16 * 128, KEYS * 128, 1024));
        wgmma_commit();
      };
      // Masks the tile if needed, turns sc into P = exp2(scaled s - running max) in place,
      // updates m and l, and returns the factor the old O must be scaled by.
      auto softmax = [&](float(&sc)[KEYS / 2], int k0, bool masked, float(&corr)[2]) {
        // Mask boundary tiles (needs_mask). Scores stay raw: the scale goes into the exp2 FFMA
        // (sm_scale > 0, so max commutes with it).
        if (masked) {
          bool blk[2];
          int lim[2], first[2];
#pragma unroll
          for (int i = 0; i < 2; ++i)
            lim[i] = row_limit(r_base + 8 * i, k0 / kSparseBlock, blk[i], first[i]);
          detail::mask_score_fragment<KEYS>(sc, k0, t4, first, lim, blk);
        }
        // A row's scores live in the 4 threads of a quad.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float mx = m[i];
#pragma unroll
          for (int j = 0; j < KEYS / 8; ++j)
            mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * i], sc[4 * j + 2 * i + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // All masked so far: base 0 keeps exp2(-inf) = 0 and avoids -inf - -inf = NaN.
          const float base_i = mx == -INFINITY ? 0.f : mx * scale_log2;
          corr[i] = fast_exp2(fmaf(m[i], scale_log2, -base_i));
          m[i] = mx;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < KEYS / 8; ++j) {
            sc[4 * j + 2 * i] = fast_exp2(fmaf(sc[4 * j + 2 * i], scale_log2, -base_i));
            sc[4 * j + 2 * i + 1] = fast_exp2(fmaf(sc[4 * j + 2 * i + 1], scale_log2, -base_i));
            sum += sc[4 * j + 2 * i] + sc[4 * j + 2 * i + 1];
          }
          l[i] = l[i] * corr[i] + sum;
        }
      };
      auto rescale_o = [&](const float(&corr)[2]) {
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          o[4 * j] *= corr[0];
          o[4 * j + 1] *= corr[0];
          o[4 * j + 2] *= corr[1];
          o[4 * j + 3] *= corr[1];
        }
      };
      // P as A fragments: k-slice kk (keys 16 kk ..) = accumulator column blocks 2 kk, 2 kk + 1.
      auto pack_p = [&](const float(&sc)[KEYS / 2], uint32_t(&pa)[KEYS / 16][4]) {
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            pa[kk][x] = pack2<T>(sc[8 * kk + 2 * x], sc[8 * kk + 2 * x + 1]);
      };

#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.f;
      mbar_wait(q_full, qn & 1);
      fence_proxy_async();

      // Software-pipelined (FA3's intra-warpgroup overlap): S of tile n is issued, then P V of
      // tile n - 1, and the softmax of tile n runs while the tensor cores do that P V. The
      // first tile is peeled so that no branch decides whether a P V is in flight (ptxas would
      // otherwise serialize every wgmma of the kernel). Q is released to the producer (next
      // item) once the item's last S is done.
      int kt = next_tile(it, it.kt_begin);
      if (kt >= it.num_tiles) {
        mbar_arrive(q_empty);
      } else {
        uint32_t pa[KEYS / 16][4];
        int nxt = next_tile(it, kt + 1);
        int prev_s = n % STAGES;
        uint32_t prev_ph = (n / STAGES) & 1;
        {
          const bool masked = needs_mask(kt);
          float sc[KEYS / 2];
          mbar_wait(k_full(prev_s), prev_ph);
          turn_wait();
          issue_qk(sc, prev_s);
          turn_pass();
          wgmma_wait<0>();
          reg_fence(sc);
          mbar_arrive(k_empty(prev_s));
          if (nxt >= it.num_tiles) mbar_arrive(q_empty);
          float corr[2];
          softmax(sc, kt * KEYS, masked, corr);
          pack_p(sc, pa);
        }
        ++n;
        for (kt = nxt; kt < it.num_tiles; kt = nxt, ++n) {
          nxt = next_tile(it, kt + 1);
          const bool masked = needs_mask(kt);
          const int s = n % STAGES;
          const uint32_t ph = (n / STAGES) & 1;
          float sc[KEYS / 2];
          mbar_wait(k_full(s), ph);
          mbar_wait(v_full(prev_s), prev_ph);
          turn_wait();
          issue_qk(sc, s);
          issue_pv(pa, prev_s);
          turn_pass();
          wgmma_wait<1>();  // S of tile n (groups complete in order)
          reg_fence(sc);
          mbar_arrive(k_empty(s));
          if (nxt >= it.num_tiles) mbar_arrive(q_empty);
          float corr[2];
          softmax(sc, kt * KEYS, masked, corr);
          wgmma_wait<0>();  // P V of tile n - 1: O and pa are free again
          reg_fence(o);
          reg_fence(pa);
          mbar_arrive(v_empty(prev_s));
          rescale_o(corr);
          pack_p(sc, pa);
          prev_s = s;
          prev_ph = ph;
        }
        mbar_wait(v_full(prev_s), prev_ph);
        turn_wait();
        issue_pv(pa, prev_s);
        turn_pass();
        wgmma_wait<0>();
        reg_fence(o);
        reg_fence(pa);
        mbar_arrive(v_empty(prev_s));
      }

      // ---- epilogue: normalize, stage this warpgroup's rows in s_o, 16-byte stores (lean:
      // straight from the accumulators) ----
      // the previous item's reads of s_o are done
      if constexpr (Tl::kStageO) named_barrier(kBarEpilogue + wg, 128);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        const float inv = li > 0.f ? 1.f / li : 0.f;
        const int r = r_base + 8 * i;
        const int pr = it.row0 + r;
        if (p.o_f32 || it.slot >= 0) {  // unrounded: straight from the accumulators
          if (pr < it.num_rows) {
            const int tok = pr / group, h = it.kvh * group + pr % group;
            float* dst =
                it.slot >= 0
                    ? split.partial_o + (int64_t(it.slot) * kRows + r) * kD + t4 * 2
                    : p.o_f32 + (int64_t(it.q_start + tok) * p.num_qo_heads + h) * kD + t4 * 2;
#pragma unroll
            for (int j = 0; j < kD / 8; ++j)
              *reinterpret_cast<float2*>(dst + j * 8) =
                  make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
          }
        } else if constexpr (!Tl::kStageO) {  // a quad's 16 bytes of a row per store
          if (pr < it.num_rows) {
            const int tok = pr / group, h = it.kvh * group + pr % group;
            T* dst = out + (int64_t(it.q_start + tok) * p.num_qo_heads + h) * kD + t4 * 2;
#pragma unroll
            for (int j = 0; j < kD / 8; ++j)
              *reinterpret_cast<uint32_t*>(dst + j * 8) =
                  pack2<T>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kD / 8; ++j) {
            const uint32_t v = pack2<T>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            *reinterpret_cast<uint32_t*>(s_o + swizzle128_offset(kRows, r, j) + t4 * 4) = v;
          }
        }
        if ((p.lse || it.slot >= 0) && t4 == 0 && pr < it.num_rows) {
          const int tok = pr / group, h = it.kvh * group + pr % group;
          const float lse =
              li > 0.f ? (m[i] * scale_log2 + __log2f(li)) * 0.6931471805599453f : -INFINITY;
          if (it.slot >= 0)
            split.partial_lse[int64_t(it.slot) * kRows + r] = lse;
          else
            p.lse[int64_t(it.q_start + tok) * p.num_qo_heads + h] = lse;
        }
      }
      if constexpr (!Tl::kStageO) continue;
      named_barrier(kBarEpilogue + wg, 128);
      for (int id = wt; id < (p.o_f32 || it.slot >= 0 ? 0 : 64 * kChunks); id += 128) {
        const int r = wg * 64 + id / kChunks, c = id % kChunks;
        const int pr = it.row0 + r;
        if (pr >= it.num_rows) continue;
        const int tok = pr / group, h = it.kvh * group + pr % group;
        *reinterpret_cast<uint4*>(out + (int64_t(it.q_start + tok) * p.num_qo_heads + h) * kD +
                                  c * 8) =
            *reinterpret_cast<const uint4*>(s_o + swizzle128_offset(kRows, r, c));
      }
    }
  }
#else
  // Other targets: never launched (see paged_prefill_sm90_available); references keep the
  // compiler quiet about the constants only the sm_90a body uses.
  static_assert(Tl::kKeys > 0 && Tl::kStages > 0 && (Tl::kPersistent || !Tl::kPersistent) &&
                Tl::kConsumerThreads > 0 && Tl::kQBytes > 0);
#endif  // LONGCTX_SM90A_DEVICE
}

// Pages the TMA's 64-key boxes can take: pages of a multiple of 64 tokens (a box never crosses
// one), or any run of consecutive pages (kv_contiguous). Boxes of one page of 16 tokens, issued by
// 8 lanes, measured slower than the cp.async row copies (H200, causal 32K / 8K and the chunk,
// head_dim 128: 483 / 462 / 492 TF against 500 / 513 / 533; head_dim 64: 368 / 337 against
// 403 / 389), so small pages keep cp.async.
bool sm90_tma_pages(const PagedPrefillParams& p) {
  return p.kv_contiguous || p.page_size % 64 == 0;
}

// The pieces of each cut unit (PrefillMergeGroup) merged into o / o_f32 and lse: a warp per row
// (detail::merge_row_warp, the stable merge of kernels/cuda/merge.cu), kMergeRowsPerCta rows per
// CTA, grid (groups, ROWS / kMergeRowsPerCta). A row's merge is a chain of dependent L2 loads,
// so the rows must run side by side: one CTA per group, its 8 warps walking 16 rows each, made
// the whole prefill 15 % slower (H200: a 640-token chunk over 30K keys 522 against 614 TF, a
// 256-token chunk over 256K keys 606 against 639).
constexpr int kMergeRowsPerCta = 4;
template <typename T, int D, int ROWS>
__global__ void __launch_bounds__(32 * kMergeRowsPerCta)
    prefill_merge_kernel(const PagedPrefillParams p, const int32_t* __restrict__ work,
                         const Sm90Units units, const int32_t* __restrict__ groups,
                         const float* __restrict__ po, const float* __restrict__ plse) {
  const int unit = groups[kPrefillMergeGroupInts * blockIdx.x];
  const int s0 = groups[kPrefillMergeGroupInts * blockIdx.x + 1];
  const int count = groups[kPrefillMergeGroupInts * blockIdx.x + 2];
  const PrefillUnit u = prefill_unit(unit, units.num_items, units.unit_heads);
  const int kvh = u.kv_head;
  const int b = work[2 * u.item], row0 = work[2 * u.item + 1] * ROWS;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int q_start = p.qo_indptr[b];
  const int num_rows = (p.qo_indptr[b + 1] - q_start) * group;
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * kMergeRowsPerCta + (threadIdx.x >> 5);
  if (row0 + r < num_rows) {
    const int pr = row0 + r;
    const int64_t row = int64_t(q_start + pr / group) * p.num_qo_heads + kvh * group + pr % group;
    auto lse_at = [&](int j) { return plse[int64_t(s0 + j) * ROWS + r]; };
    auto o_at = [&](int j) { return po + (int64_t(s0 + j) * ROWS + r) * D; };
    const float lse =
        p.o_f32 ? detail::merge_row_warp<float, float>(count, D, lse_at, o_at, p.o_f32 + row * D)
                : detail::merge_row_warp<float, T>(count, D, lse_at, o_at,
                                                   static_cast<T*>(p.o) + row * D);
    if (lane == 0 && p.lse) p.lse[row] = lse;
  }
}

template <typename T, typename Tl>
void launch(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  require_dynamic_smem(paged_prefill_sm90_kernel<T, Tl>, Tl::kSmemBytes);
  const int num_sms = current_sm_count();  // this device's (cached per device id)
  const int64_t total = int64_t(plan.num_work_items) * p.num_kv_heads;
  if (total == 0) return;
  // A split plan fixes the grid (its ranges, one per CTA); it was made for this device's SMs.
  const bool split = plan.split_ctas > 0;
  const int64_t grid = split             ? plan.split_ctas
                       : Tl::kPersistent ? std::min<int64_t>(total, num_sms)
                                         : total;
  // Boxes of 64 tokens (the caller checked sm90_tma_pages()).
  CUtensorMap maps[2] = {};
  if constexpr (Tl::kTma) {
    maps[0] =
        kv_cache_tensor_map(p.k_cache, kKvTensorMapAnySlot, p.num_kv_heads, Tl::kD, 64, p.dtype);
    maps[1] =
        kv_cache_tensor_map(p.v_cache, kKvTensorMapAnySlot, p.num_kv_heads, Tl::kD, 64, p.dtype);
  }
  const Sm90Split sp{split ? plan.split_ranges : nullptr, plan.split_dp_rounds, plan.partial_o,
                     plan.partial_lse};
  const Sm90Units units{plan.num_work_items,
                        plan.unit_heads > 0 ? plan.unit_heads : p.num_kv_heads};
  LONGCTX_CHECK(p.num_kv_heads % units.unit_heads == 0, ErrorCode::kInvalidArgument,
                "paged prefill: a plan of {} kv heads per unit block over {} kv heads",
                units.unit_heads, p.num_kv_heads);
  paged_prefill_sm90_kernel<T, Tl><<<unsigned(grid), Tl::kThreads, Tl::kSmemBytes, stream>>>(
      p, plan.work_items, int(total), units, sp, maps[0], maps[1]);
  LONGCTX_CUDA_CHECK_LAUNCH("paged_prefill_sm90_kernel");
  if (split && plan.num_merge_groups > 0) {
    const dim3 grid(unsigned(plan.num_merge_groups), Tl::kRows / kMergeRowsPerCta);
    prefill_merge_kernel<T, Tl::kD, Tl::kRows><<<grid, 32 * kMergeRowsPerCta, 0, stream>>>(
        p, plan.work_items, units, plan.merge_groups, plan.partial_o, plan.partial_lse);
    LONGCTX_CUDA_CHECK_LAUNCH("prefill_merge_kernel");
  }
}

// Keys per K/V tile at head_dim D (the plan's split counts tiles of as many keys).
template <int D>
constexpr int kTileKeys = prefill_sm90_tile_keys(D);

// The default (pingpong, persistent) kernel, with the TMA or without.
template <typename T, int D, int STAGES, int CONSUMERS, bool LEAN>
void launch_pingpong(const PagedPrefillParams& p, const PrefillPlan& plan, bool tma,
                     cudaStream_t stream) {
  constexpr int K = kTileKeys<D>;
  if (tma)
    launch<T, Sm90Tiling<D, K, STAGES, true, true, true, CONSUMERS, LEAN>>(p, plan, stream);
  else
    launch<T, Sm90Tiling<D, K, STAGES, true, true, false, CONSUMERS, LEAN>>(p, plan, stream);
}

// K/V stages of the lean tiling for this call, 0 for the full one (block-sparse plans need its
// bitmaps). PrefillTuning::lean overrides, for measurement. H200, one call, against
// the full tiling (TFLOP/s, docs/benchmarks.md): head_dim 128 causal 32K on pages of 128 (TMA)
// 608-613 against 590-593 with 2 stages (a third: within 1 % of two), on pages of 16 (cp.async)
// 529.5 against 510-512 with 3 (2 stages 515-516), the 2K chunk on pages of 16 580-584 against
// 542 (2 stages 559-560); head_dim 64 (192-row tiles) causal 32K 499 against 482-486, its chunk
// 528-534 against 505-510, 2 and 3 stages alike.
int lean_stages(const PagedPrefillParams& p, bool tma, PrefillLean lean) {
  return prefill_lean_stages(p.block_mask != nullptr, p.head_dim, tma, lean);
}

// Variants (PrefillTuning::variant, for measurement; the plan carries it):
//   pingpong    persistent, the consumer warpgroups taking turns at the tensor cores (default)
//   persistent  one CTA per SM walking the work items
//   grid        one CTA per work item
// All: 128-key tiles x 2 stages, software-pipelined consumers, 200 KB of shared memory (the
// default adds the lean tiling where no block mask is given, see lean_stages).
// Measured on H200 in one call (harness: causal 8K / 32K page 16 / 32K page 128 / 2K chunk vs
// 30K keys / 32K block-sparse 25% with one mask per KV group, TFLOP/s):
//   pingpong 504 / 505 / 509 / 546 / 467; persistent 496 / 505 / 510 / 551 / 449;
//   grid 495 / 505 / 506 / 547 / 458. bench_xattn_prefill at 128K, 25-28% kept per KV group:
//   pingpong 3-4% faster than persistent; block-causal block 64: 294 vs 285 TF.
// Earlier variants, same harness: 64-key tiles x 4 stages 440 TF; no consumer software
// pipelining 468 TF; a page-table lookup per row in the producer's critical path 268 TF. Head_dim
// 64 (causal 8K / 32K): pingpong 344 / 376, persistent 311 / 348, pingpong with 3 stages 342 /
// 377 (not kept). A quarter (half) of the softmax's exp2 on the FMA pipe (a Cody-Waite + degree-4
// polynomial, 9 instructions for one MUFU ex2): 7 % (18 %) slower at head_dim 64 and 128 alike,
// so the consumers are bound by issue slots and latency, not by the MUFU unit. Lazy rescaling
// (the softmax base moving only when a row's max passes it by 2^8, O rescaled only when some row
// of the warp moved): +1-2 % on the cp.async path at head_dim 128, unchanged with the TMA, 2-4 %
// slower at head_dim 64 (not kept). Head_dim 64 row sums from the P V GEMM (m64n72, 8 columns of
// ones): 2-5 % slower, and its LSE from bf16-rounded P missed the 1e-3 tolerance (not kept).
// Head_dim 64 in 192-row tiles (3 consumer warpgroups, FA3's tile there) against 128-row ones,
// causal, two rounds in one call (TFLOP/s; cuDNN 414-424 at 8K, 459-463 at 32K): pages of 128,
// 8K 460-462 against 391-398, 32K 481-484 against 420-422; pages of 16, 8K 438-445 against
// 385-387, 32K 460 against 399-400. Without the turns ("persistent") 422-424 / 466 / 393-396 /
// 427-430. Three K/V stages at 192 rows: within 1 % of two (not kept).
template <typename T, int D>
void launch_variant(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  const PrefillSm90Variant v = plan.tuning.variant;
  // TMA where the pages allow it (PrefillTuning::tma = false turns it off, for measurement).
  // H200, causal, pages of 128: head_dim 128 542 TF against 510 with cp.async (32K); head_dim 64
  // 418 against 403 with the boxes issued by two lanes (one thread issuing them measured 362
  // against 379).
  const bool tma = sm90_tma_pages(p) && plan.tuning.tma;
  const int lean = lean_stages(p, tma, plan.tuning.lean);
  if constexpr (D == 64) {
    if (plan.tile_rows == kPrefillMaxTileRows) {  // 3 consumer warpgroups (paged_prefill_tile_rows)
      if (v == PrefillSm90Variant::kPersistent) {
        if (tma) return launch<T, Sm90Tiling<D, 128, 2, true, false, true, 3>>(p, plan, stream);
        return launch<T, Sm90Tiling<D, 128, 2, true, false, false, 3>>(p, plan, stream);
      }
      if (lean == 2) return launch_pingpong<T, D, 2, 3, true>(p, plan, tma, stream);
      if (lean == 3) return launch_pingpong<T, D, 3, 3, true>(p, plan, tma, stream);
      return launch_pingpong<T, D, 2, 3, false>(p, plan, tma, stream);
    }
  }
  LONGCTX_CHECK(plan.tile_rows == kPrefillTileRows, ErrorCode::kInvalidArgument,
                "paged prefill: a plan of {}-row tiles at head_dim {}", plan.tile_rows, D);
  if (v == PrefillSm90Variant::kGrid)
    return launch<T, Sm90Tiling<D, 128, 2, false, false>>(p, plan, stream);
  if (v == PrefillSm90Variant::kPersistent)
    return launch<T, Sm90Tiling<D, 128, 2, true, false>>(p, plan, stream);
  if constexpr (D == 128) {  // head_dim 64 in 128-row tiles (a measurement) keeps the full tiling
    if (lean == 2) return launch_pingpong<T, D, 2, 2, true>(p, plan, tma, stream);
    if (lean == 3) return launch_pingpong<T, D, 3, 2, true>(p, plan, tma, stream);
  }
  launch_pingpong<T, D, 2, 2, false>(p, plan, tma, stream);
}

// Head_dim 256: 64-key tiles (kTileKeys), two K/V stages (a third passes the 227 KB), the lean
// tiling or the full one (block masks), the TMA where the pages allow it. The persistent and grid
// variants (no turns between the consumer warpgroups; one CTA per work item) are built in their
// lean, cp.async-only form, for measurement and so that every path can be held to the same bits
// (PrefillD256.RepeatedLaunchesWriteTheSameBits); elsewhere they are refused.
template <typename T>
void launch_d256(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  LONGCTX_CHECK(plan.tile_rows == kPrefillTileRows, ErrorCode::kInvalidArgument,
                "paged prefill: a plan of {}-row tiles at head_dim 256", plan.tile_rows);
  const bool tma = sm90_tma_pages(p) && plan.tuning.tma;
  const bool lean = lean_stages(p, tma, plan.tuning.lean) > 0;
  const PrefillSm90Variant v = plan.tuning.variant;
  if (v != PrefillSm90Variant::kPingpong) {
    LONGCTX_CHECK(lean && !tma, ErrorCode::kUnsupported,
                  "paged prefill: head_dim 256 takes the {} variant in the lean tiling without "
                  "the TMA only (block masks or TMA pages: the pingpong variant)",
                  v == PrefillSm90Variant::kGrid ? "grid" : "persistent");
    if (v == PrefillSm90Variant::kGrid)
      return launch<T, Sm90Tiling<256, 64, 2, false, false, false, 2, true>>(p, plan, stream);
    return launch<T, Sm90Tiling<256, 64, 2, true, false, false, 2, true>>(p, plan, stream);
  }
  if (lean) return launch_pingpong<T, 256, 2, 2, true>(p, plan, tma, stream);
  launch_pingpong<T, 256, 2, 2, false>(p, plan, tma, stream);
}

// FP8 caches: the default kernel (persistent, ping-pong; PrefillTuning::variant is not taken),
// cp.async only (see Sm90Tiling::kFp8), two K/V stages (head_dim 128: a third beside the code
// ring would pass the 227 KB), lean where no block mask is given, else the full tiling with a
// ring of 3 code slots. The lean tiling keeps 2 code slots (one K, one V): on the H100 the 3-slot
// ring measured 259-264 TFLOP/s against 2 slots' 273-278 (docs/fp8_kv.md), so the gathers'
// latency is not the bound; PrefillTuning::lean = kLean3 (--prefill-lean 3) takes 3 slots, for
// measurement.
template <typename T, int D, int CONSUMERS>
void launch_fp8(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  if (lean_stages(p, /*tma=*/false, plan.tuning.lean) > 0) {
    if (plan.tuning.lean == PrefillLean::kLean3)
      return launch<T, Sm90Tiling<D, 128, 2, true, true, false, CONSUMERS, true, 3>>(p, plan,
                                                                                     stream);
    return launch<T, Sm90Tiling<D, 128, 2, true, true, false, CONSUMERS, true, 2>>(p, plan, stream);
  }
  launch<T, Sm90Tiling<D, 128, 2, true, true, false, CONSUMERS, false, 3>>(p, plan, stream);
}

template <typename T>
void launch_head_dim(const PagedPrefillParams& p, const PrefillPlan& plan, cudaStream_t stream) {
  if (p.kv_format == KvCacheFormat::kFp8E4M3) {
    if (p.head_dim == 128) {
      LONGCTX_CHECK(plan.tile_rows == kPrefillTileRows, ErrorCode::kInvalidArgument,
                    "paged prefill: a plan of {}-row tiles at head_dim 128", plan.tile_rows);
      return launch_fp8<T, 128, 2>(p, plan, stream);
    }
    if (plan.tile_rows == kPrefillMaxTileRows) return launch_fp8<T, 64, 3>(p, plan, stream);
    LONGCTX_CHECK(plan.tile_rows == kPrefillTileRows, ErrorCode::kInvalidArgument,
                  "paged prefill: a plan of {}-row tiles at head_dim 64", plan.tile_rows);
    return launch<T, Sm90Tiling<64, 128, 2, true, true, false, 2, false, 3>>(p, plan, stream);
  }
  if (p.head_dim == 64)
    launch_variant<T, 64>(p, plan, stream);
  else if (p.head_dim == 128)
    launch_variant<T, 128>(p, plan, stream);
  else
    launch_d256<T>(p, plan, stream);
}

}  // namespace

bool paged_prefill_sm90_available(const PagedPrefillParams& p) {
  // Not FP8 caches at head_dim 256 (no prefill kernel takes them: paged_prefill_supported): here
  // the code staging would not fit beside the 192 KB of 16-bit tiles.
  const bool d256 = p.head_dim == 256 && p.kv_format == KvCacheFormat::kDtype;
  if (p.head_dim != 64 && p.head_dim != 128 && !d256) return false;
  // The device must be sm_90 and this binary must carry the sm_90a kernel (not a JIT from PTX
  // of another target, where the body is empty).
  // Per device id: a process may drive GPUs of different models.
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static bool ok[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  std::call_once(once[dev], [dev] {
    const DeviceProps& props = device_props(dev);
    if (props.major != 9 || props.minor != 0) return;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(
            &attr, paged_prefill_sm90_kernel<__nv_bfloat16, Sm90Tiling<128, 128, 2, true, true>>) !=
        cudaSuccess) {
      cudaGetLastError();
      return;
    }
    ok[dev] = attr.binaryVersion == 90;
  });
  return ok[dev];
}

void paged_prefill_sm90_run(const PagedPrefillParams& p, const PrefillPlan& plan,
                            cudaStream_t stream) {
  if (p.dtype == DType::kBF16)
    launch_head_dim<__nv_bfloat16>(p, plan, stream);
  else
    launch_head_dim<__half>(p, plan, stream);
}

}  // namespace longctx::kernels::cuda
