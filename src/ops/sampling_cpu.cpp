#include "kernels/cpu/sampling_cpu.h"

#include "ops/sampling.h"

namespace longctx::ops {

void sample_rows_cpu(const kernels::SamplingBatch& batch) { kernels::cpu::sample_rows(batch); }

}  // namespace longctx::ops
