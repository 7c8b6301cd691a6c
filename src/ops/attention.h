// Multi-head attention of new queries over a sequence's cached keys/values (GQA), fp32:
//   out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, g]) v[j, g],  g = h / (Hq / Hkv),
// over the keys j < kv_len with k_positions[j] <= q_positions[i] (causal by position; the new
// tokens' own keys must already be in the cache), and with a sliding window W only the keys with
// k_positions[j] > q_positions[i] - W (transformers' sliding_window_overlay). Softmax subtracts the
// row max (computed online over key chunks, so memory stays O(chunk) for any kv_len). A query that
// sees no key gets zeros.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"

namespace longctx::ops {

struct AttentionArgs {
  Tensor q;            // [n, Hq, head_dim] f32
  Tensor k;            // [capacity, Hkv, head_dim] f32 (the cache; rows >= kv_len unread)
  Tensor v;            // [capacity, Hkv, head_dim] f32
  Tensor q_positions;  // [n] i64
  Tensor k_positions;  // [capacity] i64 (rows >= kv_len unread)
  int64_t kv_len = 0;  // keys [0, kv_len) exist
  float scale = 0.f;   // usually 1 / sqrt(head_dim)
  int64_t window = 0;  // > 0: sliding window (keys a query sees, itself included); 0: all
  Tensor out;          // [n, Hq, head_dim] f32 (must not overlap q, k, v)
};

void attention(const AttentionArgs& args);
void attention_cpu(const AttentionArgs& args);

}  // namespace longctx::ops
