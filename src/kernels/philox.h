// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC11): a counter-based generator, so a random number is a pure function of (key, counter).
// The sampler's uniform for a request's k-th generated token is sampling_uniform(seed, k): the
// CPU sampler and the CUDA kernel compute the same number from the same two integers, whatever
// else runs in the batch. Usable from host and device code.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace longctx::kernels {

struct PhiloxBlock {
  uint32_t v[4];
};

// Rounds is a parameter only so the 7-round known-answer vectors can check the round function
// too; the sampler uses 10 (the standard Philox4x32-10).
template <int Rounds>
LONGCTX_HD_INLINE PhiloxBlock philox4x32(PhiloxBlock ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
  for (int r = 0; r < Rounds; ++r) {
    if (r > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    const uint64_t p0 = uint64_t(kMul0) * ctr.v[0];
    const uint64_t p1 = uint64_t(kMul1) * ctr.v[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr = PhiloxBlock{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// A double uniform in [0, 1) with 53 random bits: key = seed, counter = (step, 0).
LONGCTX_HD_INLINE double sampling_uniform(uint64_t seed, uint64_t step) {
  const PhiloxBlock out =
      philox4x32<10>(PhiloxBlock{{uint32_t(step), uint32_t(step >> 32), 0u, 0u}}, uint32_t(seed),
                     uint32_t(seed >> 32));
  const uint64_t bits = ((uint64_t(out.v[0]) << 32) | out.v[1]) >> 11;
  return double(bits) * 0x1.0p-53;  // exact: bits < 2^53
}

// Speculative decoding's acceptance test of the draft token at a request's k-th generated token:
// a second uniform of (seed, k), independent of sampling_uniform's (counter (step, 1)).
LONGCTX_HD_INLINE double speculative_accept_uniform(uint64_t seed, uint64_t step) {
  const PhiloxBlock out =
      philox4x32<10>(PhiloxBlock{{uint32_t(step), uint32_t(step >> 32), 1u, 0u}}, uint32_t(seed),
                     uint32_t(seed >> 32));
  const uint64_t bits = ((uint64_t(out.v[0]) << 32) | out.v[1]) >> 11;
  return double(bits) * 0x1.0p-53;
}

}  // namespace longctx::kernels
