// A causal LM built from a checkpoint. One file per architecture under src/models/ implements
// it, reading top to bottom like the Hugging Face modeling file.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "longctx/core/tensor.h"
#include "longctx/kv/kv_cache.h"
#include "longctx/loader/checkpoint.h"

namespace longctx {

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;

  // Runs `ids` (one sequence) at `positions`, appending their K/V to `cache` after the tokens
  // already there. Returns f32 logits [n, vocab], or [1, vocab] for the last token when
  // last_only. Throws Error(kOutOfRange) when the cache has no room (nothing is appended then).
  virtual Tensor forward(std::span<const int32_t> ids, std::span<const int64_t> positions,
                         KVCache& cache, bool last_only = false) = 0;

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
};

// Builds the model registered for checkpoint.config.architecture (CPU reference backend).
// Throws Error(kUnsupported) listing the supported architectures.
std::unique_ptr<Model> create_model(std::shared_ptr<const Checkpoint> checkpoint,
                                    const ModelBuildOptions& options = {});

}  // namespace longctx
