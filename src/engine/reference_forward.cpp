#include "longctx/engine/reference_forward.h"

#include <utility>
#include <vector>

#include "attention/backends/cpu_backend.h"
#include "longctx/core/error.h"

namespace longctx {

Tensor reference_forward(Model& model, std::span<const int32_t> ids,
                         std::span<const int64_t> positions, KVCache& cache, bool last_only) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(ids.size());
  LONGCTX_CHECK(n > 0, ErrorCode::kInvalidArgument, "forward: no input tokens");
  LONGCTX_CHECK(positions.size() == ids.size(), ErrorCode::kInvalidArgument,
                "forward: {} ids but {} positions", ids.size(), positions.size());
  LONGCTX_CHECK(cache.num_layers() == c.num_hidden_layers &&
                    cache.k(0).size(1) == c.num_key_value_heads && cache.k(0).size(2) == c.head_dim,
                ErrorCode::kInvalidArgument,
                "forward: the KV cache ({} layers of {}) was not made for this model",
                cache.num_layers(), cache.k(0).str());
  LONGCTX_CHECK(model.device().is_cpu(), ErrorCode::kUnsupported,
                "forward over a KVCache runs on the CPU model only (this one is on {})",
                model.device().str());
  ForwardBatch batch;
  batch.input_ids.assign(ids.begin(), ids.end());
  batch.positions.assign(positions.begin(), positions.end());
  batch.qo_indptr = {0, static_cast<int32_t>(n)};
  batch.kv_lens = {static_cast<int32_t>(cache.length() + n)};
  batch.seq_ids = {0};
  for (int64_t i = last_only ? n - 1 : 0; i < n; ++i)
    batch.logits_indices.push_back(static_cast<int32_t>(i));
  std::vector<int64_t> windows;  // sliding layers see their window (the dense reference)
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    windows.push_back(c.layer_type(l) == LayerAttention::kSliding ? c.sliding_window : 0);
  CpuAttentionBackend attention({&cache}, model.attention_scale(), std::move(windows));
  Tensor logits = model.forward(batch, attention);
  attention.commit();
  return logits;
}

}  // namespace longctx
