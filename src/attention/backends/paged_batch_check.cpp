#include "attention/backends/paged_backend.h"
#include "longctx/core/error.h"

namespace longctx {

void check_paged_batch(const ForwardBatch& batch, int64_t block_size, int64_t num_blocks,
                       const PagedBackendLimits& limits) {
  const int64_t t = batch.num_tokens(), s = batch.num_seqs();
  LONGCTX_CHECK(t <= limits.max_tokens && s <= limits.max_seqs, ErrorCode::kOutOfRange,
                "paged attention: a batch of {} tokens in {} sequences exceeds the plan's "
                "limits ({} tokens, {} sequences)",
                t, s, limits.max_tokens, limits.max_seqs);
  LONGCTX_CHECK(static_cast<int64_t>(batch.block_table_indptr.size()) == s + 1 &&
                    batch.block_table_indptr[0] == 0 &&
                    batch.block_table_indptr[s] == static_cast<int64_t>(batch.block_tables.size()),
                ErrorCode::kInvalidArgument,
                "paged attention: block_table_indptr must have {} entries from 0 to {}", s + 1,
                batch.block_tables.size());
  LONGCTX_CHECK(static_cast<int64_t>(batch.block_tables.size()) <= limits.max_blocks,
                ErrorCode::kOutOfRange,
                "paged attention: {} block-table entries exceed the plan's limit of {}",
                batch.block_tables.size(), limits.max_blocks);
  LONGCTX_CHECK(static_cast<int64_t>(batch.slot_mapping.size()) == t, ErrorCode::kInvalidArgument,
                "paged attention: {} slots for {} tokens", batch.slot_mapping.size(), t);
  for (int64_t q = 0; q < s; ++q) {
    const int32_t b0 = batch.block_table_indptr[q], b1 = batch.block_table_indptr[q + 1];
    LONGCTX_CHECK(b1 >= b0, ErrorCode::kInvalidArgument,
                  "paged attention: block_table_indptr decreases at sequence {}", q);
    const int64_t kv_len = batch.kv_lens[q];
    LONGCTX_CHECK(limits.max_seq_len <= 0 || kv_len <= limits.max_seq_len, ErrorCode::kOutOfRange,
                  "paged attention: sequence {} holds {} tokens, past the plan's {} per sequence",
                  q, kv_len, limits.max_seq_len);
    const int64_t needed = (kv_len + block_size - 1) / block_size;
    LONGCTX_CHECK(b1 - b0 == needed, ErrorCode::kInvalidArgument,
                  "paged attention: sequence {} holds {} tokens, which need {} blocks of {}, but "
                  "its block table has {}",
                  q, kv_len, needed, block_size, b1 - b0);
    for (int32_t i = b0; i < b1; ++i)
      LONGCTX_CHECK(batch.block_tables[i] >= 0 && batch.block_tables[i] < num_blocks,
                    ErrorCode::kOutOfRange,
                    "paged attention: sequence {} names block {}, outside the pool's {} blocks", q,
                    batch.block_tables[i], num_blocks);
    const int64_t first = kv_len - batch.q_len(q);  // KV index of the first new token
    for (int32_t r = batch.qo_indptr[q]; r < batch.qo_indptr[q + 1]; ++r) {
      const int64_t j = first + (r - batch.qo_indptr[q]);
      const int64_t want =
          int64_t(batch.block_tables[b0 + j / block_size]) * block_size + j % block_size;
      LONGCTX_CHECK(batch.slot_mapping[r] == want, ErrorCode::kInvalidArgument,
                    "paged attention: token {} (sequence {}, KV index {}) maps to slot {} but "
                    "its block table puts it at {}",
                    r, q, j, batch.slot_mapping[r], want);
      LONGCTX_CHECK(batch.positions[r] == j, ErrorCode::kInvalidArgument,
                    "paged attention: token {} of sequence {} has position {} but is KV index "
                    "{} (positions must follow the cache)",
                    r, q, batch.positions[r], j);
    }
  }
}

}  // namespace longctx
