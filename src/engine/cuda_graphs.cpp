// The host-side logic of the decode graphs (buckets, padding, refusals, the memory estimate):
// plain C++, built and tested without CUDA. The graphs themselves are in cuda_graphs.cu.
#include "engine/cuda_graphs.h"

#include <fmt/format.h>

#include <algorithm>

#include "longctx/core/error.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/model_config.h"

namespace longctx {

namespace {

// The capture stream's cuBLASLt workspace (ops/linear_cuda.cu) and the pool's 2 MiB segment
// rounding of a few activation size classes.
constexpr int64_t kGraphOverheadBytes = 48ll << 20;

}  // namespace

std::vector<int64_t> decode_graph_buckets(int64_t max_num_seqs) {
  LONGCTX_CHECK(max_num_seqs >= 1, ErrorCode::kInvalidArgument,
                "decode graphs: max_num_seqs must be >= 1, got {}", max_num_seqs);
  std::vector<int64_t> b;
  for (int64_t n = 1; n < max_num_seqs; n *= 2) b.push_back(n);
  b.push_back(max_num_seqs);
  return b;
}

int64_t pick_decode_bucket(std::span<const int64_t> buckets, int64_t num_seqs) {
  auto it = std::lower_bound(buckets.begin(), buckets.end(), num_seqs);
  return it == buckets.end() ? 0 : *it;
}

namespace {

bool is_state_group(const DecodePadding& padding, int64_t g) {
  return padding.groups != nullptr && g < padding.groups->size() &&
         (*padding.groups)[g].kind == KvGroupKind::kState;
}

}  // namespace

std::string decode_graph_refusal(const ForwardBatch& batch, std::span<const int64_t> buckets,
                                 const DecodePadding& padding, int64_t max_blocks) {
  const int64_t s = batch.num_seqs();
  if (s == 0) return "an empty batch";
  if (batch.fixed_launch_shapes || batch.num_padding_seqs != 0)
    return "the batch is padded already";
  const int64_t bucket = pick_decode_bucket(buckets, s);
  if (bucket == 0)
    return fmt::format("{} sequences, more than the largest graph ({})", s,
                       buckets.empty() ? 0 : buckets.back());
  if (batch.num_tokens() != s || static_cast<int64_t>(batch.qo_indptr.size()) != s + 1)
    return fmt::format("{} tokens for {} sequences: not a decode step", batch.num_tokens(), s);
  for (int64_t i = 0; i < s; ++i)
    if (batch.qo_indptr[i] != i || batch.qo_indptr[i + 1] != i + 1)
      return fmt::format("sequence {} has {} new tokens (a graph decodes one per sequence)", i,
                         batch.q_len(i));
  if (static_cast<int64_t>(batch.logits_indices.size()) != s)
    return fmt::format("{} logits rows for {} sequences (a graph gives every sequence's)",
                       batch.logits_indices.size(), s);
  for (int64_t i = 0; i < s; ++i)
    if (batch.logits_indices[i] != i)
      return fmt::format("logits row {} is {}", i, batch.logits_indices[i]);
  for (int64_t g = 0; g < batch.num_groups(); ++g) {
    const std::span<const int32_t> tables = batch.tables(g).block_tables;
    if (is_state_group(padding, g)) {
      for (size_t i = 0; i < tables.size(); ++i)
        if (tables[i] == padding.scratch_state_slot)
          return fmt::format("sequence {} has the graphs' scratch state slot {} (KV group {})", i,
                             padding.scratch_state_slot, g);
      continue;
    }
    for (size_t i = 0; i < tables.size(); ++i)
      if (tables[i] == padding.scratch_block)
        return fmt::format("block-table entry {} of KV group {} names the graphs' scratch block {}",
                           i, g, padding.scratch_block);
    const int64_t entries = static_cast<int64_t>(tables.size()) + (bucket - s);
    if (max_blocks > 0 && entries > max_blocks)
      return fmt::format(
          "{} block-table entries of KV group {} with the padding, past the "
          "backend's {}",
          entries, g, max_blocks);
  }
  return "";
}

ForwardBatch pad_decode_batch(const ForwardBatch& batch, int64_t bucket,
                              const DecodePadding& padding) {
  const int32_t scratch_block = padding.scratch_block;
  const int64_t block_size = padding.block_size;
  const int64_t s = batch.num_seqs();
  for (int64_t g = 1; g < batch.num_groups(); ++g)
    LONGCTX_CHECK(!is_state_group(padding, g) || padding.scratch_state_slot >= 0,
                  ErrorCode::kInvalidArgument,
                  "pad_decode_batch: KV group {} keeps per-sequence states but no scratch state "
                  "slot was given",
                  g);
  LONGCTX_CHECK(bucket >= s && s >= 1 && scratch_block >= 0 && block_size >= 1,
                ErrorCode::kInvalidArgument,
                "pad_decode_batch: {} sequences into a bucket of {} (scratch block {}, block "
                "size {})",
                s, bucket, scratch_block, block_size);
  ForwardBatch p = batch;
  if (p.block_table_indptr.empty()) p.block_table_indptr.push_back(0);
  for (int64_t i = s; i < bucket; ++i) {
    p.input_ids.push_back(0);
    p.positions.push_back(0);
    p.qo_indptr.push_back(static_cast<int32_t>(p.input_ids.size()));
    p.kv_lens.push_back(1);
    p.block_tables.push_back(scratch_block);
    p.block_table_indptr.push_back(static_cast<int32_t>(p.block_tables.size()));
    p.slot_mapping.push_back(int64_t(scratch_block) * block_size);
    // Every paged KV group's table names the scratch block too (a block id serves any group);
    // a state group's names the scratch state slot.
    for (size_t g = 0; g < p.group_tables.size(); ++g) {
      GroupBlockTables& t = p.group_tables[g];
      if (t.block_table_indptr.empty()) t.block_table_indptr.push_back(0);
      const bool state = is_state_group(padding, static_cast<int64_t>(g) + 1);
      t.block_tables.push_back(state ? padding.scratch_state_slot : scratch_block);
      t.block_table_indptr.push_back(static_cast<int32_t>(t.block_tables.size()));
      if (!state) t.slot_mapping.push_back(int64_t(scratch_block) * block_size);
    }
    if (!p.seq_ids.empty()) p.seq_ids.push_back(~uint64_t(0));
  }
  p.logits_indices.resize(bucket);
  for (int64_t i = 0; i < bucket; ++i) p.logits_indices[i] = static_cast<int32_t>(i);
  p.fixed_launch_shapes = true;
  p.num_padding_seqs = static_cast<int32_t>(bucket - s);
  return p;
}

int64_t decode_graph_memory_bytes(const ModelConfig& config, int64_t max_bucket) {
  const int64_t inputs = max_bucket * (4 + 8 + 4);
  const int64_t logits = max_bucket * config.vocab_size * 4;
  // The final norm's gathered rows and lm_head input beside the layers' activations.
  const int64_t rows = max_bucket * config.hidden_size * (4 + 2 + 2);
  return max_bucket * activation_bytes_per_token(config) + inputs + logits + rows +
         kGraphOverheadBytes;
}

}  // namespace longctx
