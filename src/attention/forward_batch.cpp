#include "longctx/attention/forward_batch.h"

#include <limits>

#include "longctx/core/error.h"

namespace longctx {

void ForwardBatch::add_sequence(uint64_t seq_id, const int32_t* ids, int64_t n, int64_t num_cached,
                                bool want_logits, int64_t num_logits) {
  LONGCTX_CHECK(n > 0 && num_cached >= 0, ErrorCode::kInvalidArgument,
                "ForwardBatch: sequence {} with {} new tokens after {}", seq_id, n, num_cached);
  LONGCTX_CHECK(!want_logits || (num_logits >= 1 && num_logits <= n), ErrorCode::kInvalidArgument,
                "ForwardBatch: sequence {} asks for {} logits rows of {} new tokens", seq_id,
                num_logits, n);
  LONGCTX_CHECK(num_cached + n <= std::numeric_limits<int32_t>::max() &&
                    num_tokens() + n <= std::numeric_limits<int32_t>::max(),
                ErrorCode::kOutOfRange, "ForwardBatch: {} + {} tokens exceed the int32 indices",
                num_cached, n);
  if (qo_indptr.empty()) qo_indptr.push_back(0);
  const int64_t begin = num_tokens();
  input_ids.insert(input_ids.end(), ids, ids + n);
  for (int64_t i = 0; i < n; ++i) positions.push_back(num_cached + i);
  qo_indptr.push_back(static_cast<int32_t>(begin + n));
  kv_lens.push_back(static_cast<int32_t>(num_cached + n));
  seq_ids.push_back(seq_id);
  if (want_logits) {
    for (int64_t i = n - num_logits; i < n; ++i)
      logits_indices.push_back(static_cast<int32_t>(begin + i));
  }
}

void ForwardBatch::validate(int64_t vocab_size, int64_t max_positions) const {
  const int64_t t = num_tokens(), s = num_seqs();
  LONGCTX_CHECK(t > 0, ErrorCode::kInvalidArgument, "forward: no input tokens");
  LONGCTX_CHECK(static_cast<int64_t>(positions.size()) == t, ErrorCode::kInvalidArgument,
                "forward: {} ids but {} positions", t, positions.size());
  LONGCTX_CHECK(
      static_cast<int64_t>(qo_indptr.size()) == s + 1 && qo_indptr[0] == 0 && qo_indptr[s] == t,
      ErrorCode::kInvalidArgument, "forward: qo_indptr must have {} entries from 0 to {} (has {})",
      s + 1, t, qo_indptr.size());
  LONGCTX_CHECK(seq_ids.empty() || static_cast<int64_t>(seq_ids.size()) == s,
                ErrorCode::kInvalidArgument, "forward: {} sequence ids for {} sequences",
                seq_ids.size(), s);
  LONGCTX_CHECK(num_padding_seqs >= 0 && num_padding_seqs < s, ErrorCode::kInvalidArgument,
                "forward: {} padding sequences of {} (at least one must be real)", num_padding_seqs,
                s);
  for (int64_t i = 0; i < s; ++i) {
    const int32_t n = q_len(i);
    LONGCTX_CHECK(n > 0, ErrorCode::kInvalidArgument,
                  "forward: sequence {} has {} new tokens (qo_indptr must increase)", i, n);
    LONGCTX_CHECK(kv_lens[i] >= n, ErrorCode::kInvalidArgument,
                  "forward: sequence {} has kv_len {} < its {} new tokens", i, kv_lens[i], n);
  }
  for (int64_t i = 0; i < t; ++i) {
    LONGCTX_CHECK(input_ids[i] >= 0 && input_ids[i] < vocab_size, ErrorCode::kOutOfRange,
                  "forward: token id {} at row {} is outside the vocabulary [0, {})", input_ids[i],
                  i, vocab_size);
    LONGCTX_CHECK(positions[i] >= 0 && (max_positions <= 0 || positions[i] < max_positions),
                  ErrorCode::kOutOfRange,
                  "forward: position {} at row {} is outside [0, {}) (max_position_embeddings)",
                  positions[i], i, max_positions);
  }
  for (size_t r = 0; r < logits_indices.size(); ++r) {
    LONGCTX_CHECK(logits_indices[r] >= 0 && logits_indices[r] < t, ErrorCode::kInvalidArgument,
                  "forward: logits row {} is outside the batch's {} tokens", logits_indices[r], t);
    LONGCTX_CHECK(r == 0 || logits_indices[r] > logits_indices[r - 1], ErrorCode::kInvalidArgument,
                  "forward: logits rows must ascend ({} after {})", logits_indices[r],
                  logits_indices[r - 1]);
  }
}

LinearLayerStates AttentionBackend::linear_states(int64_t layer) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "layer {} is linear attention, and this attention backend keeps no per-sequence "
                "state (the CPU backends do)",
                layer);
}

}  // namespace longctx
