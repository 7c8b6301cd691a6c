// What each way of moving K/V into shared memory can read from HBM, without any compute: the
// ceilings a decode kernel's loader is chosen by. The cache is the paged layout's
// [slots, 8 kv heads, 128 dims] of bf16, K and V; each loader streams it through a ring of
// shared-memory stages the way a decode CTA would (one kv head's 256-byte rows, or whole 2 KB
// token rows), waits for each stage and touches one word of it.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "read_ceiling.h"

namespace longctx::bench {

// One loader configuration, parsed from "KIND:TILE:STAGES:CTAS[:THREADS]" where KIND is
//   tma   3-D TMA boxes (64 dims, 1 kv head, TILE slots) with the 128-byte swizzle (the decode's);
//   bulk  1-D cp.async.bulk copies of TILE whole token rows (TILE x 2 KB of K, the same of V);
//   cpa   16-byte cp.async by every thread of one kv head's rows, completion on the mbarrier;
//   cpaw  the same over whole token rows;
//   regs  16-byte loads of one kv head's rows into registers, TILE loads in flight per thread
//         (no shared memory; STAGES unused);
// CTAS is CTAs per SM (the grid is one wave), THREADS per CTA (default 128).
struct LoaderSpec {
  std::string kind;
  int tile = 64, stages = 3, ctas_per_sm = 2, threads = 128;
};

bool parse_loader_spec(const std::string& text, LoaderSpec* out);

// Prints one markdown row per spec and K/V size (32K and 1M slots, i.e. decode at batch 1): GB/s
// of K+V for an isolated launch and for 20 back-to-back launches, timed with `time_ms`.
void loader_table(const std::vector<LoaderSpec>& specs, cudaStream_t stream, const TimeFn& time_ms);

}  // namespace longctx::bench
