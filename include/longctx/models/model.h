// A causal LM built from a checkpoint. One file per architecture under src/models/ implements
// it, reading top to bottom like the Hugging Face modeling file.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "longctx/core/communicator.h"
#include "longctx/core/tensor.h"
#include "longctx/kv/kv_cache.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/forward_batch.h"

namespace longctx {

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // Where the weights live and the forward runs (CPU reference: fp32 activations; CUDA: bf16
  // activations, fp32 residual stream and logits).
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;
  // Softmax scale of the attention (1 / sqrt(head_dim) for every supported architecture).
  float attention_scale() const;

  // Runs every sequence of `batch` through the model; `attention` stores and reads K/V.
  // Returns f32 logits [batch.logits_indices.size(), vocab] on device(). Throws Error naming the
  // problem for a malformed batch (before anything is written to the KV).
  virtual Tensor forward(const ForwardBatch& batch, AttentionBackend& attention) = 0;

  // The device half of forward(), for CUDA-graph capture (engine/cuda_graphs.h): the batch was
  // validated and attention.plan()ned already, and its input_ids [T] i32, positions [T] i64 and
  // logits_indices [R] i32 are on device(). Writes f32 logits [R, vocab] into `logits`. Only
  // launches work on the current stream and allocates from the device pool: no host sync, no
  // host-to-device copy, so it can be captured. Rope that depends on a sequence's length
  // (longrope, dynamic NTK) takes each token's position + 1 as that length here, which is exact
  // for the decode batches (one token per sequence) the graphs run.
  virtual void forward_on_device(const Tensor& input_ids, const Tensor& positions,
                                 const Tensor& logits_indices, AttentionBackend& attention,
                                 const Tensor& logits) = 0;

  // CPU reference convenience: runs `ids` (one sequence) at `positions`, appending their K/V to
  // `cache` after the tokens already there. Returns f32 logits [n, vocab], or [1, vocab] for the
  // last token when last_only. Throws Error(kOutOfRange) when the cache has no room (nothing is
  // appended then).
  Tensor forward(std::span<const int32_t> ids, std::span<const int64_t> positions, KVCache& cache,
                 bool last_only = false);

  // A cache sized for max_tokens tokens of this model.
  std::unique_ptr<KVCache> make_cache(int64_t max_tokens) const {
    return std::make_unique<KVCache>(config(), max_tokens);
  }
};

// Numerics choices that depend on which reference a model should reproduce.
struct ModelBuildOptions {
  // The dtype rope's inv_freq is rounded to before use (then upcast to float32 for the angles).
  // Unset (or DType::kF32): exact float32, as transformers 5.17's from_pretrained (also at
  // dtype=bfloat16: the buffer stays float32), vLLM and the training code. DType::kBF16
  // reproduces a model whose buffers were cast with .to(torch.bfloat16): the tiny fixtures'
  // reference logits were made that way, and at long context the difference matters (a model
  // trained with exact inv_freq, models/needle, moves by up to 7.6 logits at 1K tokens).
  std::optional<DType> rope_inv_freq_dtype;
  // Device of the weights and the forward. CUDA: weights are uploaded as bf16 (QKV and gate/up
  // fused), through pinned staging (see activation_dtype).
  Device device = Device::cpu();
  // Weights, activations and KV on a GPU: bf16 (default) or f16 (3 more mantissa bits, the range
  // of f16: for models whose activations stay below 65504, and for checking numerics). The CPU
  // reference is f32 whatever this says.
  DType activation_dtype = DType::kBF16;
  // Tensor parallelism (docs/tensor_parallel.md): with a communicator of size > 1 the model is
  // rank communicator->rank(), holding its slice of every weight; config() is then the rank's
  // (its q / KV heads and MLP width), the logits the whole vocabulary's. Every rank must run the
  // same forwards: thread communicators (CPU) or NCCL (one thread per GPU).
  std::shared_ptr<Communicator> communicator;
};

// Builds the model registered for checkpoint.config.architecture on options.device.
// Throws Error(kUnsupported) listing the supported architectures.
std::unique_ptr<Model> create_model(std::shared_ptr<const Checkpoint> checkpoint,
                                    const ModelBuildOptions& options = {});

}  // namespace longctx
