// Batched token sampling (kernels/sampling_kernel_params.h): row r of batch.logits is sampled
// with batch.rows[r] (penalties, greedy or temperature, min_p, top_k, top_p, a Philox draw of
// (seed, step)) into batch.results[r], with raw logprobs when asked. A row that cannot be
// sampled (NaN, +inf, nothing finite) gets a status, not an exception. Both twins pick the same
// token from the same inputs; the CPU twin (kernels/cpu/sampling_cpu.h) is the reference.
#pragma once

#include "kernels/sampling_kernel_params.h"
#include "longctx/core/device.h"

namespace longctx::ops {

// Every pointer of `batch` is memory of `device` (host memory for the CPU). CUDA: enqueued on
// the device's current stream, no host synchronization.
void sample_rows(const kernels::SamplingBatch& batch, Device device);
void sample_rows_cpu(const kernels::SamplingBatch& batch);
void sample_rows_cuda(const kernels::SamplingBatch& batch, Device device);

}  // namespace longctx::ops
