// The parts of the GPU memory plan the runner shares (include/longctx/engine/gpu_memory_plan.h
// is the plan itself): what the plan counted must be what the runner builds.
#pragma once

#include <cstdint>

#include "longctx/engine/gpu_memory_plan.h"

namespace longctx {

class KvGroups;
struct GpuRunnerOptions;
struct ModelConfig;

// Decode steps replay CUDA graphs unless eager, or under a policy whose decode steps do not
// (streaming); with KV offload only a decode policy's (quest: its steps skip the ring), of a
// model of one full KV group (the second form). Linear-attention layers read their states
// through the backend's per-step device arrays, which a replay sees refreshed.
bool decode_graphs(const GpuRunnerOptions& o);
bool decode_graphs(const GpuRunnerOptions& o, const KvGroups& groups);

// The decode graphs' largest batch: max_num_seqs, but no bucket past the step's token budget (a
// decode step of S sequences is S tokens).
int64_t decode_graph_max_seqs(const GpuRunnerOptions& o);

// State slots beyond the sequences' and the snapshots': the graphs' padding sequences' one.
int64_t scratch_state_slots(const GpuRunnerOptions& o, const KvGroups& groups);

// The weights of a config's checkpoint on the device: bf16, a quantized checkpoint's Linears
// packed (with their workspace).
int64_t weight_bytes(const ModelConfig& config);

}  // namespace longctx
