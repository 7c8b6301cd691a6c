// The GPU executor of an engine property (common/engine_properties.h): the model on cuda:0
// (f16 or bf16 activations), a GpuRunner with the spec's blocks, steps and offload geometry.
#pragma once

#include <memory>

#include "common/engine_properties.h"
#include "longctx/engine/gpu_runner.h"

namespace longctx::testing {

struct GpuExecutorFactory {
  bool enforce_eager = false;  // no decode graphs
  DType activation_dtype = DType::kBF16;
  // The runner of the last executor made (its memory plan, counters), shared with the engine.
  std::shared_ptr<GpuRunner>* last_runner = nullptr;

  std::unique_ptr<Executor> operator()(const EngineSpec& s) const {
    ModelBuildOptions mo = s.model_options;
    mo.device = Device::cuda(0);
    mo.activation_dtype = activation_dtype;
    GpuRunnerOptions r;
    r.block_size = s.block_size;
    r.max_num_batched_tokens = s.max_num_batched_tokens;
    r.max_num_seqs = s.max_num_seqs;
    r.max_model_len = s.max_model_len;
    r.enforce_eager = enforce_eager;
    r.num_speculative_tokens = s.num_speculative_tokens;
    r.sparse = s.sparse;
    r.num_gpu_blocks = s.num_blocks;
    if (s.offload_gpu_blocks > 0) {
      r.kv_offload = true;
      r.num_gpu_blocks = s.offload_gpu_blocks;
      r.offload_slots = s.offload_slots;
      r.offload_slot_tokens = s.offload_slot_blocks * s.block_size;
      // The host pool holds num_blocks blocks of the plan's size (the offloaded group's layers).
      const GpuMemoryPlan plan = plan_gpu_memory(s.checkpoint->config, r, int64_t{1} << 50);
      r.host_kv_bytes = s.num_blocks * plan.kv_block_bytes;
    }
    auto runner = std::make_shared<GpuRunner>(create_model(s.checkpoint, mo), r);
    if (last_runner != nullptr) *last_runner = runner;
    return make_gpu_executor(std::move(runner));
  }
};

}  // namespace longctx::testing
