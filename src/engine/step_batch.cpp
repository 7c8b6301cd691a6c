#include "engine/step_batch.h"

#include "longctx/core/error.h"

namespace longctx {

ForwardBatch make_forward_batch(std::span<const StepInput> inputs, int64_t block_size) {
  ForwardBatch batch;
  batch.block_table_indptr.push_back(0);
  for (const StepInput& in : inputs) {
    const int64_t end = in.num_computed + in.num_new;
    LONGCTX_CHECK(in.num_new > 0 && end <= static_cast<int64_t>(in.all_tokens.size()),
                  ErrorCode::kInternal, "step: sequence {} runs tokens [{}, {}) of {}", in.seq_id,
                  in.num_computed, end, in.all_tokens.size());
    const int64_t blocks = (end + block_size - 1) / block_size;
    LONGCTX_CHECK(static_cast<int64_t>(in.block_table.size()) >= blocks, ErrorCode::kInternal,
                  "step: sequence {} needs {} blocks for {} tokens, its table has {}", in.seq_id,
                  blocks, end, in.block_table.size());
    batch.add_sequence(in.seq_id, in.all_tokens.data() + in.num_computed, in.num_new,
                       in.num_computed, in.want_logits);
    batch.block_tables.insert(batch.block_tables.end(), in.block_table.begin(),
                              in.block_table.begin() + blocks);
    batch.block_table_indptr.push_back(static_cast<int32_t>(batch.block_tables.size()));
    for (int64_t j = in.num_computed; j < end; ++j)
      batch.slot_mapping.push_back(int64_t(in.block_table[j / block_size]) * block_size +
                                   j % block_size);
  }
  return batch;
}

}  // namespace longctx
