// PTX wrappers of Hopper's asynchronous copies, shared by decode.cu and prefill_sm90.cu: mbarriers
// (arrivals, cp.async completions, the bytes of TMA copies landing in shared memory),
// cp.async.bulk.tensor loads of a 3-D box described by a CUtensorMap (kernels/cuda/tensor_map.h),
// and the 128-byte swizzle both the TMA and wgmma use. sm_90 and later only: on older targets
// the bodies are empty (the TMA load traps), and the host never launches a kernel that uses them
// there.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace longctx::kernels::cuda::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LONGCTX_TMA_DEVICE 1
#endif

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Arrives on `bar` once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Makes the initialized barriers visible to the async proxy (the TMA unit) before any copy.
__device__ __forceinline__ void mbar_init_fence() {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// The one arrival of the phase, announcing `bytes` of copies that complete it.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

// Adds `bytes` of copies to the current phase of `bar` without arriving (the arrivals come from
// elsewhere, e.g. cp.async completions of the same phase).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "TMA_WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra TMA_WAIT_LOOP;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Byte offset of (row r, 16-byte chunk c) in a tile of `rows` rows stored as [c / 8][rows][128 B]
// with the 128-byte swizzle (chunk c % 8 XOR r % 8 inside each 128 bytes, from a 1024-byte
// aligned base): CU_TENSOR_MAP_SWIZZLE_128B's layout of boxes 64 16-bit elements wide, and
// wgmma's 128B-swizzled operands.
__host__ __device__ __forceinline__ constexpr uint32_t swizzle128_offset(int rows, int r, int c) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Box at coordinates (c0, c1, c2) of `map` (innermost first) into shared memory at `dst`; the
// bytes complete the current phase of `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2) {
#ifdef LONGCTX_TMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#else
  __trap();
#endif
}

}  // namespace longctx::kernels::cuda::detail
