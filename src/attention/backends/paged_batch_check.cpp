#include <algorithm>

#include "attention/backends/paged_backend.h"
#include "longctx/core/error.h"

namespace longctx {

LinearLayerStates paged_linear_states(const ForwardBatch& batch, const KvGroups* groups,
                                      const StatePool* states, int64_t layer, const char* who) {
  LONGCTX_CHECK(
      groups != nullptr && states != nullptr && layer >= 0 && layer < groups->num_layers() &&
          (*groups)[groups->group_of(layer)].kind == KvGroupKind::kState,
      ErrorCode::kInvalidArgument, "{}: layer {} keeps no state in this backend", who, layer);
  const BlockTablesView t = batch.tables(groups->group_of(layer));
  const int64_t j = groups->pool_layer(layer);
  LinearLayerStates st;
  for (int64_t q = 0; q < batch.num_seqs(); ++q) {
    st.recurrent.push_back(states->recurrent(t.block_tables[q], j));
    st.conv.push_back(states->conv(t.block_tables[q], j));
  }
  return st;
}

void reset_new_sequence_states(const ForwardBatch& batch, const KvGroups* groups,
                               StatePool* states) {
  if (groups == nullptr || states == nullptr) return;
  for (int64_t g = 0; g < groups->size(); ++g) {
    if ((*groups)[g].kind != KvGroupKind::kState) continue;
    const BlockTablesView t = batch.tables(g);
    for (int64_t q = 0; q < batch.num_seqs(); ++q)
      if (batch.kv_lens[q] == batch.q_len(q)) states->reset(t.block_tables[q]);
  }
}

void check_paged_limits(const ForwardBatch& batch, const PagedBackendLimits& limits) {
  const int64_t t = batch.num_tokens(), s = batch.num_seqs();
  LONGCTX_CHECK(t <= limits.max_tokens && s <= limits.max_seqs, ErrorCode::kOutOfRange,
                "paged attention: a batch of {} tokens in {} sequences exceeds the plan's "
                "limits ({} tokens, {} sequences)",
                t, s, limits.max_tokens, limits.max_seqs);
  for (int64_t g = 0; g < batch.num_groups(); ++g) {
    const int64_t entries = static_cast<int64_t>(batch.tables(g).block_tables.size());
    LONGCTX_CHECK(entries <= limits.max_blocks, ErrorCode::kOutOfRange,
                  "paged attention: {} block-table entries in KV group {} exceed the plan's limit "
                  "of {}",
                  entries, g, limits.max_blocks);
  }
  for (int64_t q = 0; q < s; ++q)
    LONGCTX_CHECK(limits.max_seq_len <= 0 || batch.kv_lens[q] <= limits.max_seq_len,
                  ErrorCode::kOutOfRange,
                  "paged attention: sequence {} holds {} tokens, past the plan's {} per sequence",
                  q, batch.kv_lens[q], limits.max_seq_len);
}

void check_paged_batch(const ForwardBatch& batch, int64_t block_size, int64_t num_blocks,
                       const PagedBackendLimits& limits) {
  check_paged_limits(batch, limits);
  const int64_t t = batch.num_tokens(), s = batch.num_seqs();
  LONGCTX_CHECK(static_cast<int64_t>(batch.block_table_indptr.size()) == s + 1 &&
                    batch.block_table_indptr[0] == 0 &&
                    batch.block_table_indptr[s] == static_cast<int64_t>(batch.block_tables.size()),
                ErrorCode::kInvalidArgument,
                "paged attention: block_table_indptr must have {} entries from 0 to {}", s + 1,
                batch.block_tables.size());
  LONGCTX_CHECK(static_cast<int64_t>(batch.slot_mapping.size()) == t, ErrorCode::kInvalidArgument,
                "paged attention: {} slots for {} tokens", batch.slot_mapping.size(), t);
  for (int64_t q = 0; q < s; ++q) {
    const int32_t b0 = batch.block_table_indptr[q], b1 = batch.block_table_indptr[q + 1];
    LONGCTX_CHECK(b1 >= b0, ErrorCode::kInvalidArgument,
                  "paged attention: block_table_indptr decreases at sequence {}", q);
    const int64_t kv_len = batch.kv_lens[q];
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

void check_group_batch(const ForwardBatch& b, const KvGroups& groups, int64_t block_size,
                       int64_t num_blocks, int64_t num_state_slots) {
  const int64_t t = b.num_tokens(), s = b.num_seqs();
  LONGCTX_CHECK(b.num_groups() == groups.size(), ErrorCode::kInvalidArgument,
                "paged attention: the batch has tables of {} KV groups, the model {}",
                b.num_groups(), groups.size());
  for (int64_t g = 0; g < groups.size(); ++g) {
    const BlockTablesView v = b.tables(g);
    if (groups[g].kind == KvGroupKind::kState) {  // one state slot per sequence, no slots
      LONGCTX_CHECK(num_state_slots > 0, ErrorCode::kUnsupported,
                    "paged attention: KV group {} keeps a per-sequence state (linear attention) "
                    "but the backend holds no state pool",
                    g);
      LONGCTX_CHECK(static_cast<int64_t>(v.block_table_indptr.size()) == s + 1 &&
                        static_cast<int64_t>(v.block_tables.size()) == s && v.slot_mapping.empty(),
                    ErrorCode::kInvalidArgument,
                    "paged attention: state KV group {} must name one state slot per sequence "
                    "({}) and no token slots",
                    g, s);
      for (int64_t q = 0; q < s; ++q) {
        const int32_t slot = v.block_tables[q];
        LONGCTX_CHECK(v.block_table_indptr[q] == q && slot >= 0 && slot < num_state_slots,
                      ErrorCode::kOutOfRange,
                      "paged attention: sequence {} names state slot {} in KV group {} (pool of "
                      "{} slots)",
                      q, slot, g, num_state_slots);
      }
      continue;
    }
    const int64_t window = groups[g].window;
    LONGCTX_CHECK(static_cast<int64_t>(v.block_table_indptr.size()) == s + 1 &&
                      v.block_table_indptr[0] == 0 &&
                      v.block_table_indptr[s] == static_cast<int64_t>(v.block_tables.size()) &&
                      static_cast<int64_t>(v.slot_mapping.size()) == t,
                  ErrorCode::kInvalidArgument,
                  "paged attention: KV group {}'s block_table_indptr must have {} entries from 0 "
                  "to {} and its slots {} entries",
                  g, s + 1, v.block_tables.size(), t);
    for (int64_t q = 0; q < s; ++q) {
      const int32_t b0 = v.block_table_indptr[q], b1 = v.block_table_indptr[q + 1];
      const int64_t kv_len = b.kv_lens[q], first = kv_len - b.q_len(q);
      LONGCTX_CHECK(b1 - b0 == (kv_len + block_size - 1) / block_size, ErrorCode::kInvalidArgument,
                    "paged attention: sequence {} holds {} tokens but its table in KV group {} "
                    "has {} blocks of {}",
                    q, kv_len, g, b1 - b0, block_size);
      // Blocks wholly before the first new token's window may be dropped (-1).
      const int64_t live = window > 0 ? std::max<int64_t>(0, first - window + 1) / block_size : 0;
      for (int32_t i = b0; i < b1; ++i) {
        const int32_t id = v.block_tables[i];
        LONGCTX_CHECK((id >= 0 && id < num_blocks) || (id == -1 && i - b0 < live),
                      ErrorCode::kOutOfRange,
                      "paged attention: sequence {} names block {} at index {} in KV group {} "
                      "(pool of {} blocks, window from block {})",
                      q, id, i - b0, g, num_blocks, live);
      }
      for (int32_t r = b.qo_indptr[q]; r < b.qo_indptr[q + 1]; ++r) {
        const int64_t j = first + (r - b.qo_indptr[q]);
        const int64_t want =
            int64_t(v.block_tables[b0 + j / block_size]) * block_size + j % block_size;
        LONGCTX_CHECK(v.slot_mapping[r] == want && b.positions[r] == j, ErrorCode::kInvalidArgument,
                      "paged attention: token {} (sequence {}, KV index {}, position {}) maps to "
                      "slot {} in KV group {} but its table puts it at {}",
                      r, q, j, b.positions[r], v.slot_mapping[r], g, want);
      }
    }
  }
}

}  // namespace longctx
