// The CPU reference attention backend: each sequence's K/V live in its own contiguous fp32
// KVCache (slot i = the sequence's i-th token); attention is ops::attention (fp32, causal by
// position). Block tables and slot mappings of the batch are not used.
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/attention/forward_batch.h"
#include "longctx/attention/kv_cache.h"

namespace longctx {

class CpuAttentionBackend final : public AttentionBackend {
 public:
  // caches[s] holds sequence s of the batches this backend plans (same order as the batch).
  // layer_windows[l] > 0: layer l attends a sliding window of that many keys (empty: none do);
  // the caches keep every token, so this is the dense reference of a sliding model.
  CpuAttentionBackend(std::vector<KVCache*> caches, float sm_scale,
                      std::vector<int64_t> layer_windows = {});

  // Checks each cache: made for the model (layers), holds kv_len - q_len tokens, has room for
  // q_len more (Error(kOutOfRange) otherwise); records the new tokens' positions.
  void plan(const ForwardBatch& batch) override;
  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  Tensor attend(int64_t layer, const Tensor& q) override;
  // Each cache's state of a linear-attention layer.
  LinearLayerStates linear_states(int64_t layer) override;
  // After the forward of the planned batch succeeded: the caches take the new tokens.
  void commit();

 private:
  struct Segment {
    int64_t begin = 0, n = 0;  // rows [begin, begin + n) of the batch
    int64_t start = 0;         // cache slot of the first new token
  };
  std::vector<KVCache*> caches_;
  std::vector<Segment> segments_;  // [S] of the planned batch
  Tensor positions_;               // [T] i64 of the planned batch
  float sm_scale_ = 0.f;
  std::vector<int64_t> layer_windows_;  // [layers] or empty
  bool planned_ = false;
};

}  // namespace longctx
