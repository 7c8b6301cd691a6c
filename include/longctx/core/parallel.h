// A small persistent thread pool for the CPU reference backend. The CPU ops split their outer
// loop over it; LONGCTX_NUM_THREADS overrides the default (hardware concurrency).
#pragma once

#include <cstdint>
#include <functional>

namespace longctx {

int num_threads();
void set_num_threads(int n);
// Calls fn(begin, end) on disjoint chunks covering [0, n), in parallel, and waits. Runs inline
// when n is small (below grain) or when called from inside a pool worker.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

}  // namespace longctx
