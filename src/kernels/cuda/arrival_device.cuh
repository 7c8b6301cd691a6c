// The "last CTA to arrive" counter of the kernels whose CTAs write partial results that one of
// them then reduces in the same launch (the decode's split merge, the quantized GEMV's K slices).
#pragma once

#include <cstdint>
#include <type_traits>

namespace longctx::kernels::cuda::detail {

// Counts the calling CTA in at `counter` (one of `of` CTAs): true for the CTA that arrives last,
// which puts the counter back to 0 so the next launch (or CUDA graph replay) starts from zero
// with no memset. Called by thread 0 only, between two __syncthreads(): the first follows every
// thread's partial stores, the second precedes the last CTA's loads of the other CTAs' partials.
//
// Why one acquire-release atomic at gpu scope orders those: its release half is cumulative, so
// the stores the CTA's other threads made before the first barrier (which thread 0 observed
// through it) are published with it, as CUTLASS's generic barrier relies on; its acquire half,
// reading the value the other CTAs' releases wrote (an atomic read-modify-write chain), makes all
// their published stores visible to thread 0, and the second barrier extends that to the CTA's
// other threads. The partials were written by other SMs, so the last CTA reads them through L2
// (ld.global.cg), not a possibly stale L1. No other CTA touches the counter after the last one
// arrived, so a plain store resets it; the next launch sees it after this grid completes (kernel
// boundary, or pdl_wait under programmatic dependent launch).
template <typename Count>
__device__ __forceinline__ bool arrive_last(Count* counter, uint32_t of) {
  static_assert(std::is_same_v<Count, int32_t> || std::is_same_v<Count, uint32_t>,
                "a 32-bit counter");
  uint32_t prev;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;\n"
               : "=r"(prev)
               : "l"(counter)
               : "memory");
  const bool last = prev == of - 1;
  if (last) *counter = 0;
  return last;
}

}  // namespace longctx::kernels::cuda::detail
