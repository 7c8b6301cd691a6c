// The options every model-running subcommand shares: --model DIR, or
// --load-format dummy --preset NAME (random weights of a real model's shapes).
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>

#include "longctx/engine/gpu_runner.h"
#include "longctx/kernels/kernel_tuning.h"
#include "longctx/llm.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::cli {

// "24GiB", "500MB", "1073741824" -> bytes; throws Error(kInvalidArgument) naming `what`.
int64_t parse_byte_size(const std::string& text, const std::string& what);

// The sets of flags ModelOptions::add_to adds, each a heading of --help.
enum ModelFlagSet : unsigned {
  kModelFlags = 1U << 0,    // the checkpoint, device and dtype
  kEngineFlags = 1U << 1,   // memory, KV cache, scheduling, tensor parallelism
  kOffloadFlags = 1U << 2,  // --kv-offload and its budgets
  kSparseFlags = 1U << 3,   // --sparse-policy and its parameters
  kTuningFlags = 1U << 4,   // the GPU attention kernels' tuning
  kAllModelFlags = (1U << 5) - 1,
};

struct ModelOptions {
  std::string model;                        // checkpoint folder
  std::string load_format = "auto";         // auto | dummy
  std::string preset;                       // dummy preset name
  uint64_t seed = 0;                        // dummy weights' seed
  int64_t dummy_layers = 0;                 // > 0: the preset's first N layers only
  std::string quantization;                 // dummy weights' format (fp8 | ct-fp8 | awq | gptq)
  bool packed_weights = false;              // a quantized checkpoint's Linears kept packed
  bool dense_weights = false;               // ... or dequantized at load (neither: the default)
  std::string rope_inv_freq_dtype = "f32";  // f32 | checkpoint
  std::string device = "auto";              // auto | cpu | cuda | cuda:N
  std::string dtype = "bfloat16";           // GPU activations: bfloat16 | float16
  std::string gpu_memory_limit;             // bytes, e.g. 24GiB; empty: none
  double gpu_memory_utilization = 0.9;
  int64_t block_size = 0;              // 0: the device's default
  int64_t max_num_batched_tokens = 0;  // 0: the device's default (EngineConfig)
  int64_t max_num_seqs = 256;
  bool enable_prefix_caching = true;
  int64_t max_state_snapshots = -1;  // -1: the engine's default
  bool enforce_eager = false;
  std::string kv_cache_memory;                        // CPU KV pool bytes, e.g. 8GiB; empty: 4 GiB
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;  // --kv-cache-dtype
  std::string kv_events_config;  // vLLM's --kv-events-config JSON; empty: no events
  std::string kv_store;          // redis://HOST:PORT; empty: none
  bool kv_offload = false;
  std::string host_kv_budget;  // e.g. 64GiB; empty: half the machine's memory
  std::string gpu_kv_budget;   // e.g. 4GiB; empty: what the memory plan leaves
  int64_t offload_slots = 4;
  int64_t offload_slot_tokens = 32768;
  SparseOptions sparse;  // --sparse-policy and its parameters
  int64_t tensor_parallel_size = 1;
  SpeculativeConfig speculative;  // --speculative-method and its sizes
  // Kernel tuning flags as given (name -> value; empty: the default), for benchmarks
  // (longctx/kernels/kernel_tuning.h).
  std::map<std::string, std::string> kernel_tuning_flags;

  // The kernel tuning of the flags; throws Error(kInvalidArgument) naming a bad value.
  kernels::KernelTuning kernel_tuning() const;

  void add_to(CLI::App* cmd, unsigned sets = kAllModelFlags);
  // Loads (or makes) the checkpoint; throws Error naming what is wrong with the options.
  std::shared_ptr<const Checkpoint> load() const;
  // --load-format dummy: the preset's config with --quantization applied.
  ModelConfig dummy_config() const;
  // The model's numerics options for this checkpoint.
  ModelBuildOptions build_options(const Checkpoint& checkpoint) const;
  // --gpu-memory-limit in bytes (0 when not given); throws Error naming a malformed value.
  int64_t gpu_memory_limit_bytes() const;
  // The device, memory and scheduling options into an engine config.
  void apply_to(EngineConfig& engine) const;
  // The same for a GPU runner built directly (forward, info). `config` (optional) resolves
  // --kv-cache-dtype auto (without it, auto is bf16).
  GpuRunnerOptions runner_options(const ModelConfig* config = nullptr) const;
  // The model on the resolved device; for CUDA also sets the device pool's budget. (A command
  // whose runner cannot apply a sparse policy does not take the sparse flags: kSparseFlags.)
  std::shared_ptr<Model> create(std::shared_ptr<const Checkpoint> checkpoint) const;
};

}  // namespace longctx::cli
