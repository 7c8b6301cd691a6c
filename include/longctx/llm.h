// The offline API, after vLLM's LLM class:
//
//   longctx::LLM llm({.model = "path/to/Qwen3-0.6B"});
//   longctx::SamplingParams sp;  sp.temperature = 0;  sp.max_tokens = 64;
//   for (auto& out : llm.generate({"Hello"}, sp)) std::cout << out.text;
//
// Requests run through the model on the GPU or the CPU reference, both over a paged KV cache
// with prefix caching, batched continuously (requests join and leave the running batch every
// step, long prompts are prefilled in chunks); outputs come back in prompt order with tokens,
// text, finish reason, logprobs and timings.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/attention/sparse_options.h"
#include "longctx/core/device.h"
#include "longctx/engine/kv_events_config.h"
#include "longctx/engine/request_output.h"
#include "longctx/engine/sampling_params.h"
#include "longctx/engine/speculative_config.h"
#include "longctx/kernels/kernel_tuning.h"
#include "longctx/kv/kv_cache_dtype.h"
#include "longctx/models/build_options.h"

namespace longctx {

class EngineCore;
class Executor;
class Tokenizer;
struct Checkpoint;
struct GpuMemoryPlan;  // longctx/engine/gpu_runner.h
struct ModelConfig;

struct EngineConfig {
  std::string model;         // Hugging Face checkpoint folder
  std::string dummy_preset;  // instead of `model`: random weights of a preset ("qwen3-0.6b", ...)
  std::string tokenizer;     // folder with tokenizer.json; empty: the model folder's, if it has one
  // A Jinja chat template replacing tokenizer_config.json's (vLLM's --chat-template); empty: the
  // tokenizer folder's.
  std::string chat_template;
  int64_t max_model_len = 0;  // tokens per sequence; 0: the model's max_position_embeddings
  // "auto" (a GPU when one is present, else the CPU reference), "cpu", "cuda" or "cuda:N".
  std::string device = "auto";
  int64_t gpu_memory_limit = 0;         // bytes the device pool may take; 0: no hard limit
  double gpu_memory_utilization = 0.9;  // fraction of the GPU's memory the pool may take
  int64_t block_size = 0;               // tokens per KV block; 0: 128 on a GPU, 16 on the CPU
  int64_t max_num_batched_tokens = 0;   // tokens per step (prefill chunk); 0: 16384 GPU, 1024 CPU
  int64_t max_num_seqs = 256;           // sequences per step
  bool enable_prefix_caching = true;    // reuse the KV of full blocks of earlier prompts
  // Models with linear-attention layers: snapshots of their state kept for prefix hits
  // (docs/architecture.md, KV groups); -1: 64 with prefix caching; none without it.
  int64_t max_state_snapshots = -1;
  // Publishes the prefix cache's changes for KV-aware routers (docs/fleet.md).
  KvEventsConfig kv_events;
  // A KV store shared by replicas, redis://HOST:PORT (docs/fleet.md); empty: none.
  std::string kv_store;
  bool enforce_eager = false;      // no CUDA graphs (GPU)
  int64_t num_gpu_blocks = 0;      // GPU KV blocks; 0: what the memory plan leaves
  int64_t cpu_kv_cache_bytes = 0;  // CPU KV pool; 0: 4 GiB
  // The KV cache's elements (docs/fp8_kv.md): auto follows the checkpoint's quantization_config.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // KV offload to pinned host memory (GPU only; docs/offload.md): the KV cache lives in a host
  // pool, the GPU keeps a cache of blocks and streams the rest through a ring of slots.
  bool kv_offload = false;
  int64_t host_kv_budget = 0;           // host pool bytes; 0: half the machine's memory
  int64_t gpu_kv_budget = 0;            // GPU cache bytes; 0: what the memory plan leaves
  int64_t offload_slots = 4;            // ring slots
  int64_t offload_slot_tokens = 32768;  // tokens of one layer per slot
  SparseOptions sparse;  // sparse attention policy (docs/sparse.md; CPU and GPU engines)
  // The GPU attention kernels' choices (defaults: the measured ones; benchmarks pin them).
  kernels::KernelTuning kernel_tuning;
  // Ranks of a tensor-parallel model (docs/tensor_parallel.md): the CPU runs them as threads
  // (thread communicators), a GPU engine on cuda:i .. cuda:i+N-1 over NCCL.
  int64_t tensor_parallel_size = 1;
  // Speculative decoding with prompt-lookup drafts (docs/engine.md); off by default.
  SpeculativeConfig speculative;
  uint64_t seed = 0;                // seeds the requests that bring no seed of their own
  ModelBuildOptions model_options;  // numerics choices of the model (see ModelBuildOptions)
};

// A prompt is text (needs a tokenizer; encoded with the tokenizer's special tokens, e.g. BOS,
// unless add_special_tokens is false, as for a rendered chat template) or token ids used as
// they are.
struct Prompt {
  Prompt(std::string text) : text(std::move(text)) {}  // NOLINT: implicit on purpose
  Prompt(const char* text) : text(text) {}             // NOLINT
  Prompt(std::vector<int32_t> ids) : token_ids(std::move(ids)), is_ids(true) {}  // NOLINT
  std::string text;
  std::vector<int32_t> token_ids;
  bool is_ids = false;
  bool add_special_tokens = true;
};

// One streaming update: new text of request `index` (may be empty while text is held back),
// its newly generated token ids, and the complete output once it finished.
struct StreamEvent {
  size_t index = 0;
  std::string_view text;
  std::span<const int32_t> new_token_ids;
  bool finished = false;
  const RequestOutput* output = nullptr;  // set when finished
};
using StreamCallback = std::function<void(const StreamEvent&)>;

// How LLM::generate_stream runs, besides its callback.
struct StreamOptions {
  // When given and it becomes true (a signal handler or another thread may set it; it is only
  // read), every request still running is aborted at the next step boundary: it finishes with
  // FinishReason::kAbort and the tokens and text generated so far, its final event is sent, and
  // its KV blocks are freed.
  const std::atomic<bool>* cancel = nullptr;
  // The prefill's progress drawn on stderr (when it is a terminal) until the first token.
  bool prefill_progress = false;
};

class LLM {
 public:
  // Loads the checkpoint (or builds the dummy one) and its tokenizer. Throws Error naming the
  // problem (missing folder, unsupported architecture, max_model_len over the model's limit).
  explicit LLM(const EngineConfig& config);
  // An already loaded (or dummy) checkpoint; config.model / dummy_preset are ignored, the
  // tokenizer comes from config.tokenizer, else from the checkpoint's folder.
  LLM(std::shared_ptr<const Checkpoint> checkpoint, const EngineConfig& config);
  // Any backend, e.g. scripted logits in tests; `tokenizer` may be null (token-id prompts only).
  LLM(std::unique_ptr<Executor> executor, std::shared_ptr<const Tokenizer> tokenizer,
      int64_t max_model_len, std::vector<int64_t> eos_token_ids, uint64_t seed = 0,
      const SpeculativeConfig& speculative = {});
  ~LLM();
  LLM(const LLM&) = delete;
  LLM& operator=(const LLM&) = delete;

  // Every prompt is checked before any runs: an empty prompt (no tokens) or one longer than
  // max_model_len throws Error and nothing is generated. With use_progress_bar, progress goes to
  // stderr: a bar redrawn after every step (prompt tokens prefilled, throughput) on a terminal,
  // one summary line at the end otherwise.
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const SamplingParams& params, bool use_progress_bar = true);
  // One SamplingParams per prompt.
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const std::vector<SamplingParams>& params,
                                      bool use_progress_bar = true);
  // As generate(), calling on_event after every generated token; see StreamOptions.
  std::vector<RequestOutput> generate_stream(const std::vector<Prompt>& prompts,
                                             const SamplingParams& params,
                                             const StreamCallback& on_event,
                                             const StreamOptions& options = {});

  // The tokenizer_config.json chat template applied to `messages_json` (a JSON array
  // [{"role": ..., "content": ...}, ...], as OpenAI's API sends it), as transformers'
  // apply_chat_template(tokenize=False); extra_vars_json a JSON object, e.g.
  // {"enable_thinking": false}. Encode the result with add_special_tokens = false. Throws
  // Error(kNotFound) when the tokenizer folder has no chat template, Error(kInvalidArgument)
  // for malformed JSON. (JSON text, so this header needs no JSON library.)
  std::string render_chat(std::string_view messages_json, bool add_generation_prompt = true,
                          std::string_view extra_vars_json = "{}") const;

  // The prompt's token ids as generate() would feed them.
  std::vector<int32_t> encode(const Prompt& prompt) const;
  const Tokenizer* tokenizer() const;       // null when there is none
  const ModelConfig* model_config() const;  // null for a custom executor
  // The device the model runs on, and its memory plan (null on the CPU).
  Device device() const;
  const GpuMemoryPlan* memory_plan() const;
  int64_t max_model_len() const;
  // The fraction of causal key blocks a sparse prefill policy (xattention on the GPU) read so
  // far, as {kept, causal} block counts, and a sparse policy's host reads with KV offload; zeros
  // without one.
  struct SparseStats {
    int64_t prefill_blocks_kept = 0, prefill_blocks_causal = 0;
    // With KV offload: host bytes a sparse policy read in place, and (quest with --quest-reuse)
    // (page, KV head) pairs its decode steps copied from kept pages instead.
    int64_t host_bytes_read = 0, pages_reused = 0;
  };
  SparseStats sparse_stats() const;

 private:
  friend EngineCore& engine_core(LLM& llm);  // src/engine/llm_internal.h (the server's loop)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx
