// The KV page-size sweep of bench_attention (--page-sizes): prefill and decode over a pool of
// shuffled pages of each size, and the pages' host-to-device stream, as a markdown table.
#pragma once

#include <cuda_runtime.h>

#include <vector>

namespace longctx::bench {

void page_size_sweep(const std::vector<int>& page_sizes, cudaStream_t stream);

}  // namespace longctx::bench
