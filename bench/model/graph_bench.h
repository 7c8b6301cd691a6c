// bench_model --cuda-graphs: decode ms/step with CUDA graphs (engine/cuda_graphs.h) against the
// eager forward, alternating step by step over the same sequences, after one real prefill.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "longctx/kernels/kernel_tuning.h"
#include "longctx/models/model.h"

namespace longctx::bench {

struct GraphBenchArgs {
  int64_t context = 32768;             // prompt tokens (prefilled once, for real)
  std::vector<int64_t> batches = {1};  // decode batch sizes timed
  int decode_steps = 32;               // per mode and batch size
  int64_t block_size = 128;
  int64_t max_num_batched_tokens = 16384;  // prefill chunk
  kernels::KernelTuning tuning;            // the attention backend's (bench_model's flags)
  int op_profile_steps = 8;                // eager batch-1 steps timed op by op (0: no op profile)
};

// Prints one line per (batch, mode). Batches above 1 decode copies of the prompt's KV (each
// sequence its own blocks, so nothing is shared in the cache). Returns 0, or 1 after printing an
// error.
int run_graph_bench(std::shared_ptr<Model> model, const GraphBenchArgs& args);

}  // namespace longctx::bench
