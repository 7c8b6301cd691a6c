#include "model_options.h"

#include <cctype>
#include <cmath>

#include "loader/quantize_checkpoint.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"

namespace longctx::cli {

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  LONGCTX_CHECK(pos > 0 && scale > 0 && std::isfinite(value) && value > 0 && value * scale < 9.0e18,
                ErrorCode::kInvalidArgument,
                "{} '{}': expected a positive size such as 24GiB, 500MB or 1073741824", what, text);
  return static_cast<int64_t>(value * scale);
}

void ModelOptions::add_to(CLI::App* cmd, unsigned sets) {
  // Each set under its own heading in --help; a command lists only the sets it reads.
  if ((sets & kModelFlags) != 0U) {
    cmd->option_defaults()->group("Model");
    cmd->add_option("--model,-m", model, "Hugging Face checkpoint folder");
    cmd->add_option("--load-format", load_format, "auto (read --model) or dummy (random weights)")
        ->check(CLI::IsMember({"auto", "dummy"}));
    cmd->add_option("--preset", preset, "shape preset for --load-format dummy (e.g. qwen3-0.6b)");
    cmd->add_option("--dummy-seed", seed, "seed of the dummy weights");
    cmd->add_option("--dummy-layers", dummy_layers,
                    "dummy weights of the preset's first N decoder layers only (their attention "
                    "and MLP kinds as the preset has them): per-layer speed of a model that does "
                    "not fit the GPU")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--quantization", quantization,
                    "dummy weights' Linears packed in a quantized format: fp8 (128x128 blocks), "
                    "ct-fp8 (per-channel), awq or gptq (int4, groups of 128)")
        ->check(CLI::IsMember({"fp8", "ct-fp8", "awq", "gptq"}));
    cmd->add_flag("--packed-weights", packed_weights,
                  "run a quantized checkpoint's Linears packed (int4 / FP8 GEMVs reading the "
                  "checkpoint's bytes); the default on a GPU and for dummy quantized weights");
    cmd->add_flag("--dense-weights", dense_weights,
                  "dequantize a quantized checkpoint's Linears to bf16 at load; the default on "
                  "the CPU");
    cmd->add_option("--rope-inv-freq-dtype", rope_inv_freq_dtype,
                    "f32: exact rope inv_freq (transformers from_pretrained, vLLM); checkpoint: "
                    "rounded to the checkpoint dtype, as a model cast with .to(dtype)")
        ->check(CLI::IsMember({"checkpoint", "f32"}))
        ->capture_default_str();
    cmd->add_option("--device", device, "auto (a GPU when present), cpu, cuda or cuda:N")
        ->capture_default_str();
    cmd->add_option("--dtype", dtype, "GPU weights/activations/KV: bfloat16 or float16")
        ->check(CLI::IsMember({"bfloat16", "float16"}))
        ->capture_default_str();
  }
  if ((sets & kEngineFlags) != 0U) {
    cmd->option_defaults()->group("Engine");
    cmd->add_option("--gpu-memory-limit", gpu_memory_limit,
                    "hard limit of the GPU memory longctx takes, e.g. 24GiB (emulates a smaller "
                    "GPU)");
    cmd->add_option("--gpu-memory-utilization", gpu_memory_utilization,
                    "fraction of the GPU's memory longctx may take")
        ->check(CLI::Range(0.01, 1.0))
        ->capture_default_str();
    cmd->add_option("--block-size", block_size,
                    "KV cache block size in tokens (default 128 on a GPU, 16 on the CPU)");
    cmd->add_option("--max-num-batched-tokens", max_num_batched_tokens,
                    "tokens per engine step, the prefill chunk size (default 16384 on a GPU, 1024 "
                    "on the CPU)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--max-num-seqs", max_num_seqs, "sequences per engine step")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", enable_prefix_caching,
                  "reuse the KV cache of earlier prompts' full blocks")
        ->capture_default_str();
    cmd->add_option("--max-state-snapshots", max_state_snapshots,
                    "models with linear-attention layers (Qwen3-Next): snapshots of their state "
                    "at block boundaries kept for prefix hits, each as large as one sequence's "
                    "state (default 64; 0: such models take no prefix hits)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--enforce-eager", enforce_eager, "no CUDA graphs for decode steps");
    cmd->add_option("--kv-cache-memory", kv_cache_memory,
                    "bytes of the CPU KV cache, e.g. 8GiB (default 4GiB)");
    // Parsed here, once: below this it is an enum.
    cmd->add_option_function<std::string>(
           "--kv-cache-dtype",
           [this](const std::string& name) { kv_cache_dtype = parse_kv_cache_dtype(name); },
           "KV cache elements: auto (FP8 when the checkpoint's quantization_config asks for it, "
           "else bf16), bf16, or fp8 (E4M3 with per-block scales; dense attention and quest, "
           "resident or offloaded; docs/fp8_kv.md)")
        ->default_str(std::string(kv_cache_dtype_name(kv_cache_dtype)));
    cmd->add_option("--kv-events-config", kv_events_config,
                    "publish KV-cache events as vLLM does, e.g. '{\"enable_kv_cache_events\": "
                    "true, \"endpoint\": \"tcp://*:5557\"}' (docs/fleet.md)");
    cmd->add_option("--kv-store", kv_store,
                    "share full KV blocks with other replicas through a Redis-protocol store, "
                    "redis://HOST:PORT (CPU engine; docs/fleet.md)");
    cmd->add_option(
           "--tensor-parallel-size,--tp", tensor_parallel_size,
           "ranks of a tensor-parallel model: CPU threads, or GPUs from --device's index on "
           "(docs/tensor_parallel.md)")
        ->capture_default_str();
    cmd->option_defaults()->group("Speculative decoding");
    // Parsed here, once: below this the method is an enum.
    cmd->add_option_function<std::string>(
           "--speculative-method",
           [this](const std::string& name) { speculative.method = parse_speculative_method(name); },
           "draft tokens for speculative decoding: ngram (prompt lookup: the tokens that followed "
           "the last n-gram's earlier occurrence) or none; docs/engine.md")
        ->default_str("none");
    cmd->add_option("--num-speculative-tokens", speculative.num_speculative_tokens,
                    "draft tokens verified per sequence and step (K)");
    cmd->add_option("--prompt-lookup-min", speculative.prompt_lookup_min,
                    "ngram: the shortest n-gram looked up (default: --prompt-lookup-max, or 5)");
    cmd->add_option("--prompt-lookup-max", speculative.prompt_lookup_max,
                    "ngram: the longest n-gram looked up (default: --prompt-lookup-min, or 5)");
  }
  if ((sets & kOffloadFlags) != 0U) {
    cmd->option_defaults()->group("KV offload");
    cmd->add_flag("--kv-offload", kv_offload,
                  "keep the KV cache in pinned host memory, a GPU cache of blocks and a ring of "
                  "slots on the GPU (docs/offload.md)");
    cmd->add_option("--host-kv-budget", host_kv_budget,
                    "bytes of the pinned host KV pool with --kv-offload, e.g. 64GiB (default: half "
                    "the machine's memory)");
    cmd->add_option("--gpu-kv-budget", gpu_kv_budget,
                    "bytes of the GPU's cache of KV blocks with --kv-offload, e.g. 4GiB (default: "
                    "what the memory plan leaves)");
    cmd->add_option("--offload-slots", offload_slots, "ring slots with --kv-offload")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    cmd->add_option("--offload-slot-tokens", offload_slot_tokens,
                    "tokens of one layer per ring slot with --kv-offload")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
  }
  if ((sets & kSparseFlags) != 0U) {
    cmd->option_defaults()->group("Sparse attention");
    // Parsed here, once: below this the policy is an enum the registry describes.
    cmd->add_option_function<std::string>(
           "--sparse-policy",
           [this](const std::string& name) { sparse.policy = parse_sparse_policy(name); },
           "attention over selected KV pages: full (exact), quest (decode), xattention (prefill) "
           "or streaming (sinks + recent window); docs/sparse.md")
        ->default_str(std::string(sparse_policy_name(sparse.policy)));
    cmd->add_option("--sparse-budget", sparse.budget_tokens,
                    "quest: KV tokens read per KV head per decode step (sink and window included)")
        ->capture_default_str();
    cmd->add_option("--sparse-sink", sparse.sink_tokens,
                    "quest, streaming: first tokens always read")
        ->capture_default_str();
    cmd->add_option("--sparse-window", sparse.window_tokens,
                    "quest, streaming: last tokens always read")
        ->capture_default_str();
    cmd->add_flag(
        "--sparse-head-averaged", [this](int64_t) { sparse.per_head = false; },
        "quest: one block list from scores averaged over heads (default: per KV head)");
    cmd->add_option("--sparse-page", sparse.page_tokens,
                    "quest, streaming: tokens per selected page, dividing --block-size")
        ->capture_default_str();
    cmd->add_flag("--quest-reuse", sparse.quest_reuse,
                  "quest: decode steps copy the pages a sequence kept from its previous decode "
                  "step instead of reading them again (exact; GPU memory per sequence)");
    cmd->add_option("--quest-reuse-seqs", sparse.quest_reuse_seqs,
                    "quest with --quest-reuse: the first N sequences of a step keep their pages")
        ->capture_default_str();
    cmd->add_option("--xattn-threshold", sparse.threshold,
                    "xattention: attention mass each query block keeps")
        ->capture_default_str();
    cmd->add_option("--xattn-stride", sparse.stride, "xattention: antidiagonal stride")
        ->capture_default_str();
    cmd->add_flag(
        "--xattn-per-q-head", [this](int64_t) { sparse.xattn_per_kv_head = false; },
        "xattention: one mask per q head (default: per KV head, from its q heads' summed masses)");
    cmd->add_option("--xattn-dense-tail", sparse.xattn_dense_tail,
                    "xattention: the query blocks holding a prefill chunk's last N queries attend "
                    "densely (the prompt's end)")
        ->capture_default_str();
    cmd->add_option("--xattn-min-len", sparse.xattn_min_len,
                    "xattention: prefill chunks that see fewer keys attend densely")
        ->capture_default_str();
  }
  // The GPU attention kernels' tuning, for benchmarks and exactness experiments (e.g.
  // --attention-kernel generic); the defaults are the measured choices.
  for (const kernels::KernelTuningFlag& f : kernels::kernel_tuning_flags()) {
    if ((sets & kTuningFlags) == 0U) break;
    const std::string name(f.name);
    cmd->add_option("--" + name, kernel_tuning_flags[name],
                    "kernel tuning: " + std::string(f.help) + " (" + std::string(f.values) + ")")
        ->group("Kernel tuning");
  }
  cmd->option_defaults()->group("Options");
}

kernels::KernelTuning ModelOptions::kernel_tuning() const {
  kernels::KernelTuning t;
  for (const auto& [name, value] : kernel_tuning_flags) {
    std::string error;
    if (!value.empty())
      LONGCTX_CHECK(kernels::parse_kernel_tuning_flag(name, value, &t, &error),
                    ErrorCode::kInvalidArgument, "{}", error);
  }
  return t;
}

GpuRunnerOptions ModelOptions::runner_options(const ModelConfig* config) const {
  GpuRunnerOptions r;
  r.kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, config != nullptr && config->kv_cache_fp8,
                                      DType::kBF16);
  r.block_size = block_size;
  if (max_num_batched_tokens > 0) r.max_num_batched_tokens = max_num_batched_tokens;
  r.max_num_seqs = max_num_seqs;
  r.max_state_snapshots = resolve_state_snapshots(enable_prefix_caching, max_state_snapshots);
  r.enforce_eager = enforce_eager;
  r.kv_offload = kv_offload;
  r.host_kv_bytes =
      host_kv_budget.empty() ? 0 : parse_byte_size(host_kv_budget, "--host-kv-budget");
  r.gpu_kv_bytes = gpu_kv_budget.empty() ? 0 : parse_byte_size(gpu_kv_budget, "--gpu-kv-budget");
  r.offload_slots = offload_slots;
  r.offload_slot_tokens = offload_slot_tokens;
  r.sparse = sparse;
  r.tuning = kernel_tuning();
  return r;
}

int64_t ModelOptions::gpu_memory_limit_bytes() const {
  if (gpu_memory_limit.empty()) return 0;
  return parse_byte_size(gpu_memory_limit, "--gpu-memory-limit");
}

void ModelOptions::apply_to(EngineConfig& engine) const {
  engine.device = device;
  engine.gpu_memory_limit = gpu_memory_limit_bytes();
  engine.gpu_memory_utilization = gpu_memory_utilization;
  engine.block_size = block_size;
  engine.max_num_batched_tokens = max_num_batched_tokens;
  engine.max_num_seqs = max_num_seqs;
  engine.enable_prefix_caching = enable_prefix_caching;
  engine.max_state_snapshots = max_state_snapshots;
  engine.enforce_eager = enforce_eager;
  engine.cpu_kv_cache_bytes =
      kv_cache_memory.empty() ? 0 : parse_byte_size(kv_cache_memory, "--kv-cache-memory");
  engine.kv_cache_dtype = kv_cache_dtype;
  const GpuRunnerOptions r = runner_options();
  engine.kv_offload = r.kv_offload;
  engine.host_kv_budget = r.host_kv_bytes;
  engine.gpu_kv_budget = r.gpu_kv_bytes;
  engine.offload_slots = r.offload_slots;
  engine.offload_slot_tokens = r.offload_slot_tokens;
  engine.sparse = sparse;
  engine.kernel_tuning = r.tuning;
  engine.tensor_parallel_size = tensor_parallel_size;
  engine.speculative = speculative.resolved();
  if (!kv_events_config.empty()) engine.kv_events = parse_kv_events_config(kv_events_config);
  engine.kv_store = kv_store;
}

std::shared_ptr<Model> ModelOptions::create(std::shared_ptr<const Checkpoint> checkpoint) const {
  LONGCTX_CHECK(tensor_parallel_size == 1, ErrorCode::kUnsupported,
                "--tensor-parallel-size {}: this command runs the model directly; tensor "
                "parallelism runs in the engine's commands (generate, needle, ruler, serve, bench "
                "throughput)",
                tensor_parallel_size);
  ModelBuildOptions options = build_options(*checkpoint);
  options.device = resolve_device(device);
  if (options.device.is_cuda())
    configure_device_memory(options.device.index, gpu_memory_limit_bytes(), gpu_memory_utilization);
  return create_model(std::move(checkpoint), options);
}

ModelBuildOptions ModelOptions::build_options(const Checkpoint& checkpoint) const {
  ModelBuildOptions options;
  options.activation_dtype = parse_dtype(dtype);
  LONGCTX_CHECK(!(packed_weights && dense_weights), ErrorCode::kInvalidArgument,
                "--packed-weights and --dense-weights exclude each other");
  if (packed_weights) options.packed_weights = true;
  if (dense_weights) options.packed_weights = false;
  options.rope_inv_freq_dtype =
      rope_inv_freq_dtype == "checkpoint" ? checkpoint.config.dtype : DType::kF32;
  return options;
}

ModelConfig ModelOptions::dummy_config() const {
  LONGCTX_CHECK(!preset.empty(), ErrorCode::kInvalidArgument,
                "--load-format dummy needs --preset NAME");
  ModelConfig c = dummy_preset_config(preset);
  if (dummy_layers > 0) {
    LONGCTX_CHECK(dummy_layers <= c.num_hidden_layers, ErrorCode::kInvalidArgument,
                  "--dummy-layers {}: preset {} has {} layers", dummy_layers, preset,
                  c.num_hidden_layers);
    c = first_layers(std::move(c), dummy_layers);
  }
  if (!quantization.empty()) {
    QuantFormatOptions f;
    f.format = quant_format_names().at(quantization);
    c.quantization = quant_config_for(f);
  }
  return c;
}

std::shared_ptr<const Checkpoint> ModelOptions::load() const {
  if (load_format == "dummy") {
    return std::make_shared<const Checkpoint>(make_dummy_checkpoint(dummy_config(), seed));
  }
  LONGCTX_CHECK(quantization.empty(), ErrorCode::kInvalidArgument,
                "--quantization {} makes dummy weights; a checkpoint's own quantization_config "
                "says how it is quantized",
                quantization);
  LONGCTX_CHECK(!model.empty(), ErrorCode::kInvalidArgument,
                "give --model DIR (or --load-format dummy --preset NAME)");
  return std::make_shared<const Checkpoint>(load_checkpoint(model));
}

}  // namespace longctx::cli
