// The CPU reference's one-sequence forward: a model run over one contiguous fp32 KVCache through
// the CPU reference attention backend (the numerics debugging path of `longctx forward` and the
// model tests' reference). Serving goes through the engine and the paged backends instead.
#pragma once

#include <cstdint>
#include <span>

#include "longctx/attention/kv_cache.h"
#include "longctx/core/tensor.h"
#include "longctx/models/model.h"

namespace longctx {

// Runs `ids` (one sequence) at `positions`, appending their K/V to `cache` after the tokens
// already there. Returns f32 logits [n, vocab], or [1, vocab] for the last token when last_only.
// Throws Error(kOutOfRange) when the cache has no room (nothing is appended then), and
// Error(kInvalidArgument / kUnsupported) for a cache of another model or a model not on the CPU.
Tensor reference_forward(Model& model, std::span<const int32_t> ids,
                         std::span<const int64_t> positions, KVCache& cache,
                         bool last_only = false);

}  // namespace longctx
