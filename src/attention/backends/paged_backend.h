// The GPU-resident paged attention backend: K/V of every sequence live in a PagedKVPool; plan()
// checks the batch's block tables and slot mapping against the pool, stages the index arrays
// into one pinned buffer and copies them to the device once per step; per layer store_kv()
// writes the new tokens into their slots and attend() runs the paged kernels:
//   every sequence decoding (q_len 1) and head_dim 64/128 -> split-KV decode (decode.h);
//   head_dim 64/128 otherwise                               -> paged prefill (prefill.h);
//   any other head_dim (8..256)                             -> the generic kernel (paged_generic.h).
// Nothing after plan() reads host memory or synchronizes.
#pragma once

#include <cstdint>
#include <memory>

#include "kv/paged_kv_pool.h"
#include "longctx/models/forward_batch.h"

namespace longctx {

struct PagedBackendLimits {
  int64_t max_tokens = 0;  // tokens per step
  int64_t max_seqs = 0;    // sequences per step
  int64_t max_blocks = 0;  // block-table entries per step (all sequences)
};

// Throws Error(kUnsupported) in a build without CUDA or for a pool not on a CUDA device.
std::unique_ptr<AttentionBackend> make_paged_attention_backend(const PagedKVPool& pool,
                                                               int64_t num_qo_heads,
                                                               float sm_scale,
                                                               const PagedBackendLimits& limits);

// The checks plan() makes on the host, exposed for tests: block ids inside the pool, each
// sequence's table long enough for its kv_len, every new token's slot equal to the one its
// table names, sizes within `limits`. Throws Error(kInvalidArgument / kOutOfRange) naming the
// first problem.
void check_paged_batch(const ForwardBatch& batch, int64_t block_size, int64_t num_blocks,
                       const PagedBackendLimits& limits);

}  // namespace longctx
