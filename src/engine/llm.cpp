// LLM: builds the backend (checkpoint or dummy weights -> CPU model -> executor) and the
// tokenizer, then drives EngineCore until every request finished.
#include "longctx/llm.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attention/sparse/sparse_policy.h"
#include "engine/engine_core.h"
#include "engine/llm_internal.h"
#include "engine/progress_bar.h"
#include "engine/tensor_parallel_executor.h"
#include "engine/text_stream.h"
#include "longctx/core/communicator.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/logging.h"
#include "longctx/core/stream.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "longctx/template/chat_template.h"
#include "models/tensor_parallel.h"

namespace longctx {

struct LLM::Impl {
  std::shared_ptr<const Checkpoint> checkpoint;  // null for a custom executor
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string tokenizer_dir;
  nlohmann::ordered_json tokenizer_config;  // tokenizer_config.json, null when absent
  Device device;                            // where the model runs
  std::shared_ptr<GpuRunner> runner;        // null on the CPU
  std::unique_ptr<EngineCore> core;
};

namespace {

// Tokens per step when EngineConfig::max_num_batched_tokens is 0. The CPU's is small because the
// engine applies aborts, admits requests and refreshes its stats only between steps, and the
// CPU reference runs ~10^3 times fewer tokens per second than a GPU: one 16K-token prefill step
// late in a long prompt took minutes there. A smaller chunk costs the CPU no throughput (the
// same attention work, cut differently; see docs/server.md for the measurement).
constexpr int64_t kGpuStepTokens = 16384;
constexpr int64_t kCpuStepTokens = 1024;

namespace fs = std::filesystem;

int64_t resolve_max_model_len(const ModelConfig& config, int64_t requested) {
  const int64_t limit = config.max_positions();  // max_position_embeddings, or yarn's reach
  if (requested == 0) return limit;
  LONGCTX_CHECK(requested > 0, ErrorCode::kInvalidArgument, "max_model_len must be > 0, got {}",
                requested);
  // As vLLM: a longer context than the model was built for is refused, not silently allowed.
  LONGCTX_CHECK(
      limit <= 0 || requested <= limit, ErrorCode::kInvalidArgument,
      "max_model_len {} is greater than the model's max_position_embeddings {} (with rope scaling)",
      requested, limit);
  return requested;
}

}  // namespace

namespace {

std::shared_ptr<const Checkpoint> load_for(const EngineConfig& config) {
  LONGCTX_CHECK(config.model.empty() != config.dummy_preset.empty(), ErrorCode::kInvalidArgument,
                "give exactly one of a model folder or a dummy preset");
  if (!config.model.empty())
    return std::make_shared<const Checkpoint>(load_checkpoint(config.model));
  return std::make_shared<const Checkpoint>(
      make_dummy_checkpoint(dummy_preset_config(config.dummy_preset), config.seed));
}

// The KV store's name for a model: the same checkpoint gives the same name on every replica,
// another one (a fine-tune of the same shapes included) another name. Hashes config.json and,
// per tensor, its name, shape, dtype and first and last 4 KiB (reading every byte of an 8B
// model would cost seconds at start-up).
std::string model_fingerprint(const Checkpoint& c) {
  constexpr size_t kSample = 4096;
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  auto add = [&](const void* p, size_t n) { XXH64_update(st, p, n); };
  if (!c.dir.empty()) {
    std::ifstream in(fs::path(c.dir) / "config.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    add(text.data(), text.size());
  }
  auto add_tensor = [&](const std::string& name, const Tensor& t) {
    add(name.data(), name.size() + 1);
    for (int64_t d : t.shape()) add(&d, sizeof d);
    const auto dtype = static_cast<int>(t.dtype());
    add(&dtype, sizeof dtype);
    const size_t n = t.nbytes();
    if (!t.device().is_cpu() || t.data_ptr() == nullptr) return;
    const auto* p = static_cast<const char*>(t.data_ptr());
    add(p, std::min(n, kSample));
    if (n > kSample) add(p + n - std::min(n - kSample, kSample), std::min(n - kSample, kSample));
  };
  for (const auto& [name, t] : c.weights.all()) add_tensor(name, t);
  // A quantized checkpoint's Linears as stored (packed: they have no dense copy to hash).
  for (const auto& [name, w] : c.quantized) {
    int part = 0;
    for (const Tensor* t : {&w.qweight, &w.scales, &w.qzeros, &w.g_idx})
      if (t->defined()) add_tensor(fmt::format("{}#{}", name, part++), *t);
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return fmt::format("{:016x}", h);
}

}  // namespace

LLM::LLM(const EngineConfig& config) : LLM(load_for(config), config) {}

LLM::LLM(std::shared_ptr<const Checkpoint> checkpoint, const EngineConfig& config)
    : impl_(std::make_unique<Impl>()) {
  LONGCTX_CHECK(checkpoint != nullptr, ErrorCode::kInvalidArgument, "null checkpoint");
  impl_->checkpoint = std::move(checkpoint);
  std::string tok_dir = config.tokenizer;
  const std::string& model_dir = impl_->checkpoint->dir;
  if (tok_dir.empty() && !model_dir.empty() && fs::exists(fs::path(model_dir) / "tokenizer.json")) {
    tok_dir = model_dir;
  }
  if (!tok_dir.empty()) {
    impl_->tokenizer = load_tokenizer_for_engine(tok_dir);
    impl_->tokenizer_dir = tok_dir;
    const fs::path cfg = fs::path(tok_dir) / "tokenizer_config.json";
    if (fs::exists(cfg)) {
      std::ifstream in(cfg);
      try {
        impl_->tokenizer_config = nlohmann::ordered_json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        LONGCTX_THROW(ErrorCode::kInvalidArgument, "{}: invalid JSON: {}", cfg.string(), e.what());
      }
    }
  }
  if (!config.chat_template.empty()) {
    if (!impl_->tokenizer_config.is_object())
      impl_->tokenizer_config = nlohmann::ordered_json::object();
    impl_->tokenizer_config["chat_template"] = config.chat_template;
  }
  const ModelConfig& mc = impl_->checkpoint->config;
  EngineCoreOptions options;
  options.max_model_len = resolve_max_model_len(mc, config.max_model_len);
  options.eos_token_ids = mc.eos_token_ids;
  options.seed = config.seed;
  impl_->device = resolve_device(config.device);
  LONGCTX_CHECK(config.max_num_batched_tokens >= 0, ErrorCode::kInvalidArgument,
                "max_num_batched_tokens must be > 0 (or 0: the device's default), got {}",
                config.max_num_batched_tokens);
  const int64_t step_tokens = config.max_num_batched_tokens > 0 ? config.max_num_batched_tokens
                              : impl_->device.is_cuda()         ? kGpuStepTokens
                                                                : kCpuStepTokens;
  options.scheduler.max_num_batched_tokens = step_tokens;
  options.scheduler.max_num_seqs = config.max_num_seqs;
  options.enable_prefix_caching = config.enable_prefix_caching;
  options.kv_events = config.kv_events;
  options.kv_store = config.kv_store;
  options.speculative = config.speculative.resolved();
  if (!config.kv_store.empty()) options.kv_store_namespace = model_fingerprint(*impl_->checkpoint);
  ModelBuildOptions build = config.model_options;
  build.device = impl_->device;
  std::unique_ptr<Executor> executor;
  const int64_t tp = config.tensor_parallel_size;
  LONGCTX_CHECK(tp >= 1 && tp <= 64, ErrorCode::kInvalidArgument,
                "--tensor-parallel-size {} must be in [1, 64]", tp);
  if (tp > 1) models::tp_shard(impl_->checkpoint->config, 0, static_cast<int>(tp));  // divisible
  if (impl_->device.is_cuda()) {
    configure_device_memory(impl_->device.index, config.gpu_memory_limit,
                            config.gpu_memory_utilization);
    config.sparse.validate();
    GpuRunnerOptions gpu;
    gpu.block_size = config.block_size;
    gpu.max_num_batched_tokens = step_tokens;
    gpu.max_num_seqs = config.max_num_seqs;
    gpu.max_state_snapshots =
        resolve_state_snapshots(config.enable_prefix_caching, config.max_state_snapshots);
    gpu.max_model_len = options.max_model_len;
    gpu.num_gpu_blocks = config.num_gpu_blocks;
    gpu.kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, mc.kv_cache_fp8, DType::kBF16);
    // The CUDA engine reads FP8 in its dense kernels and with quest, resident or offloaded; the
    // other sparse policies' kernels read bf16 (an explicit --kv-cache-dtype fp8 there is refused
    // by name).
    const bool fp8_runs = sparse::policy_def(config.sparse.policy).reads_fp8;
    if (config.kv_cache_dtype == KvCacheDtype::kAuto && gpu.kv_dtype == DType::kFP8E4M3 &&
        !fp8_runs) {
      LONGCTX_LOG_WARN(
          "the checkpoint asks for an FP8 KV cache, which the CUDA engine does not run with "
          "--sparse-policy {} yet: keeping bf16 (docs/fp8_kv.md)",
          sparse_policy_name(config.sparse.policy));
      gpu.kv_dtype = DType::kBF16;
    }
    gpu.enforce_eager = config.enforce_eager;
    gpu.kv_offload = config.kv_offload;
    // Offloaded, the block manager's blocks are the host pool's (the GPU cache only stages them).
    options.kv_medium = config.kv_offload ? KvMedium::kCpu : KvMedium::kGpu;
    gpu.host_kv_bytes = config.host_kv_budget;
    gpu.gpu_kv_bytes = config.gpu_kv_budget;
    gpu.offload_slots = config.offload_slots;
    gpu.offload_slot_tokens = config.offload_slot_tokens;
    gpu.sparse = config.sparse;
    gpu.tuning = config.kernel_tuning;
    gpu.num_speculative_tokens = options.speculative.num_speculative_tokens;
    if (tp == 1) {
      impl_->runner = std::make_shared<GpuRunner>(create_model(impl_->checkpoint, build), gpu);
      executor = make_gpu_executor(impl_->runner);
    } else {
      const int first = impl_->device.index;
      LONGCTX_CHECK(first + tp <= cuda_device_count(), ErrorCode::kInvalidArgument,
                    "--tensor-parallel-size {} needs cuda:{}..cuda:{}; {} GPUs are visible", tp,
                    first, first + tp - 1, cuda_device_count());
      std::vector<int> ids;
      for (int64_t r = 0; r < tp; ++r) ids.push_back(first + static_cast<int>(r));
      auto comms = make_nccl_communicators(ids);
      std::vector<std::unique_ptr<Executor>> ranks;
      std::vector<Device> devices;
      for (int64_t r = 0; r < tp; ++r) {
        DeviceGuard guard(ids[r]);
        if (r > 0)
          configure_device_memory(ids[r], config.gpu_memory_limit, config.gpu_memory_utilization);
        ModelBuildOptions b = build;
        b.device = Device::cuda(ids[r]);
        b.communicator = comms[r];
        auto runner = std::make_shared<GpuRunner>(create_model(impl_->checkpoint, b), gpu);
        if (r == 0) impl_->runner = runner;
        ranks.push_back(make_gpu_executor(runner));
        devices.push_back(b.device);
      }
      executor = make_tensor_parallel_executor(std::move(ranks), std::move(devices));
    }
  } else {
    LONGCTX_CHECK(!config.kv_offload, ErrorCode::kUnsupported,
                  "--kv-offload needs a CUDA device (the CPU engine's KV cache is in host memory "
                  "already)");
    CpuExecutorOptions cpu;
    if (config.block_size > 0) cpu.block_size = config.block_size;
    cpu.kv_cache_bytes = config.cpu_kv_cache_bytes;
    cpu.kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, mc.kv_cache_fp8, DType::kF32);
    cpu.sparse = config.sparse;
    cpu.max_state_seqs = config.max_num_seqs;
    cpu.max_state_snapshots =
        resolve_state_snapshots(config.enable_prefix_caching, config.max_state_snapshots);
    if (tp == 1) {
      executor = make_cpu_executor(create_model(impl_->checkpoint, build), cpu);
    } else {
      auto comms = make_thread_communicators(static_cast<int>(tp));
      std::vector<std::unique_ptr<Executor>> ranks;
      for (int64_t r = 0; r < tp; ++r) {
        ModelBuildOptions b = build;
        b.communicator = comms[r];
        ranks.push_back(make_cpu_executor(create_model(impl_->checkpoint, b), cpu));
      }
      executor =
          make_tensor_parallel_executor(std::move(ranks), std::vector<Device>(tp, Device::cpu()));
    }
  }
  impl_->core =
      std::make_unique<EngineCore>(std::move(executor), impl_->tokenizer.get(), std::move(options));
}

LLM::LLM(std::unique_ptr<Executor> executor, std::shared_ptr<const Tokenizer> tokenizer,
         int64_t max_model_len, std::vector<int64_t> eos_token_ids, uint64_t seed,
         const SpeculativeConfig& speculative)
    : impl_(std::make_unique<Impl>()) {
  impl_->tokenizer = std::move(tokenizer);
  EngineCoreOptions options;
  options.max_model_len = max_model_len;
  options.eos_token_ids = std::move(eos_token_ids);
  options.seed = seed;
  options.speculative = speculative;
  impl_->core =
      std::make_unique<EngineCore>(std::move(executor), impl_->tokenizer.get(), std::move(options));
}

LLM::~LLM() = default;

EngineCore& engine_core(LLM& llm) { return *llm.impl_->core; }

const Tokenizer* LLM::tokenizer() const { return impl_->tokenizer.get(); }

const ModelConfig* LLM::model_config() const {
  return impl_->checkpoint ? &impl_->checkpoint->config : nullptr;
}

Device LLM::device() const { return impl_->device; }

LLM::SparseStats LLM::sparse_stats() const {
  if (!impl_->runner) return {};
  const GpuRunner::SparseCounters c = impl_->runner->sparse_counters();
  const GpuRunner::OffloadCounters o = impl_->runner->offload_counters();
  return {c.prefill_blocks_kept, c.prefill_blocks_causal, o.sparse_host_bytes_read,
          o.sparse_pages_reused};
}

const GpuMemoryPlan* LLM::memory_plan() const {
  return impl_->runner ? &impl_->runner->memory_plan() : nullptr;
}

int64_t LLM::max_model_len() const { return impl_->core->options().max_model_len; }

std::string LLM::render_chat(std::string_view messages_json, bool add_generation_prompt,
                             std::string_view extra_vars_json) const {
  LONGCTX_CHECK(impl_->tokenizer_config.is_object(), ErrorCode::kNotFound,
                "no tokenizer_config.json (with a chat_template) in the tokenizer folder '{}'",
                impl_->tokenizer_dir);
  const auto messages = parse_ordered_json(messages_json, "chat messages");
  const auto extra_vars = parse_ordered_json(extra_vars_json, "chat template variables");
  return longctx::render_chat(impl_->tokenizer_config, messages, add_generation_prompt, extra_vars);
}

std::vector<int32_t> LLM::encode(const Prompt& prompt) const {
  if (prompt.is_ids) return prompt.token_ids;
  LONGCTX_CHECK(impl_->tokenizer != nullptr, ErrorCode::kInvalidArgument,
                "a text prompt needs a tokenizer, and this model has none (no tokenizer.json in "
                "the model folder and no tokenizer folder given): pass token ids instead");
  return encode_prompt(*impl_->tokenizer, prompt.text, prompt.add_special_tokens);
}

namespace {

std::vector<RequestOutput> run(EngineCore& core, const std::vector<std::vector<int32_t>>& ids,
                               const std::vector<SamplingParams>& params, bool progress,
                               const StreamCallback* on_event,
                               const std::atomic<bool>* cancel = nullptr) {
  // Check every request before running any, so a bad one leaves nothing half done.
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      core.check_request(ids[i], params[i]);
    } catch (const Error& e) {
      if (ids.size() == 1) throw;
      throw Error(e.code(), fmt::format("prompt {}: {}", i, e.what()));
    }
  }
  std::vector<RequestOutput> outputs(ids.size());
  try {
    const double arrival = now_seconds();
    std::vector<uint64_t> request_ids;
    int64_t prompt_tokens = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      request_ids.push_back(core.add_request(i, ids[i], params[i], arrival));
      prompt_tokens += static_cast<int64_t>(ids[i].size());
    }
    // A streamed request shows its decode as text: the bar shows its prefill only.
    ProgressBar bar(
        static_cast<int64_t>(ids.size()), prompt_tokens, progress,
        on_event == nullptr ? ProgressBar::Mode::kFull : ProgressBar::Mode::kPrefillOnly);
    auto keep = [&](RequestOutput& out) {
      bar.add_done(static_cast<int64_t>(out.token_ids.size()));
      const size_t index = out.index;
      outputs[index] = std::move(out);
    };
    while (core.has_unfinished()) {
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        // Finished requests are no longer live, so this aborts only the ones still running.
        for (uint64_t id : request_ids) core.abort(id);
        for (RequestOutput& out : core.take_finished()) {
          if (on_event != nullptr) {
            StreamEvent ev;
            ev.index = out.index;
            ev.finished = true;
            ev.output = &out;
            (*on_event)(ev);
          }
          keep(out);
        }
        break;
      }
      StepStats stats;
      auto updates = core.step(&stats);
      bar.add_tokens(stats.prefill_tokens, stats.prefill_tokens > 0 ? stats.seconds : 0.0,
                     stats.decode_tokens, stats.decode_tokens > 0 ? stats.seconds : 0.0);
      if (on_event != nullptr && !updates.empty()) bar.stop();
      for (const StepUpdate& u : updates) {
        if (on_event != nullptr) {
          const auto& toks = u.seq->output.token_ids;
          StreamEvent ev;
          ev.index = u.seq->output.index;
          ev.text = u.text;
          ev.new_token_ids = std::span<const int32_t>(toks).last(u.num_new_tokens);
          ev.finished = u.finished;
          ev.output = u.finished ? &u.seq->output : nullptr;
          (*on_event)(ev);
        }
      }
      for (RequestOutput& out : core.take_finished()) keep(out);
    }
  } catch (...) {
    core.abort_all();
    throw;
  }
  return outputs;
}

}  // namespace

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const std::vector<SamplingParams>& params,
                                         bool use_progress_bar) {
  LONGCTX_CHECK(params.size() == prompts.size(), ErrorCode::kInvalidArgument,
                "{} prompts but {} sampling parameter sets", prompts.size(), params.size());
  std::vector<std::vector<int32_t>> ids;
  for (const Prompt& p : prompts) ids.push_back(encode(p));
  return run(*impl_->core, ids, params, use_progress_bar, nullptr);
}

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const SamplingParams& params, bool use_progress_bar) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params), use_progress_bar);
}

std::vector<RequestOutput> LLM::generate_stream(const std::vector<Prompt>& prompts,
                                                const SamplingParams& params,
                                                const StreamCallback& on_event,
                                                const StreamOptions& options) {
  std::vector<std::vector<int32_t>> ids;
  for (const Prompt& p : prompts) ids.push_back(encode(p));
  return run(*impl_->core, ids, std::vector<SamplingParams>(prompts.size(), params),
             options.prefill_progress, &on_event, options.cancel);
}

}  // namespace longctx
