#include "engine/step_batch.h"

#include "longctx/core/error.h"

namespace longctx {

ForwardBatch make_forward_batch(std::span<const StepInput> inputs, int64_t block_size,
                                std::span<const KvGroupAlloc> groups) {
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
                       in.num_computed, in.want_logits, in.num_logits);
    batch.block_tables.insert(batch.block_tables.end(), in.block_table.begin(),
                              in.block_table.begin() + blocks);
    batch.block_table_indptr.push_back(static_cast<int32_t>(batch.block_tables.size()));
    for (int64_t j = in.num_computed; j < end; ++j)
      batch.slot_mapping.push_back(int64_t(in.block_table[j / block_size]) * block_size +
                                   j % block_size);
    // Groups 1..G-1 (a model of several KV groups): the same layout, from their own tables.
    if (&in == inputs.data()) batch.group_tables.resize(in.group_tables.size());
    LONGCTX_CHECK(in.group_tables.size() == batch.group_tables.size(), ErrorCode::kInternal,
                  "step: sequence {} has {} extra KV group tables, the step {}", in.seq_id,
                  in.group_tables.size(), batch.group_tables.size());
    for (size_t g = 0; g < in.group_tables.size(); ++g) {
      std::span<const int32_t> table = in.group_tables[g];
      GroupBlockTables& t = batch.group_tables[g];
      if (t.block_table_indptr.empty()) t.block_table_indptr.push_back(0);
      if (g + 1 < groups.size() && groups[g + 1].kind == KvGroupKind::kState) {
        LONGCTX_CHECK(table.size() == 1, ErrorCode::kInternal,
                      "step: sequence {} holds {} state slots in KV group {}", in.seq_id,
                      table.size(), g + 1);
        t.block_tables.push_back(table[0]);
        t.block_table_indptr.push_back(static_cast<int32_t>(t.block_tables.size()));
        continue;
      }
      LONGCTX_CHECK(static_cast<int64_t>(table.size()) >= blocks, ErrorCode::kInternal,
                    "step: sequence {} needs {} blocks in KV group {}, its table has {}", in.seq_id,
                    blocks, g + 1, table.size());
      t.block_tables.insert(t.block_tables.end(), table.begin(), table.begin() + blocks);
      t.block_table_indptr.push_back(static_cast<int32_t>(t.block_tables.size()));
      for (int64_t j = in.num_computed; j < end; ++j)
        t.slot_mapping.push_back(int64_t(table[j / block_size]) * block_size + j % block_size);
    }
  }
  return batch;
}

void copy_state_snapshots(const StateSlots& slots, std::span<const StepInput> inputs, bool save,
                          ExecutorCounters& counters, const char* who) {
  for (const StepInput& in : inputs) {
    const int32_t snap = save ? in.state_save : in.state_restore;
    if (snap < 0) continue;
    LONGCTX_CHECK(slots.pool != nullptr && slots.group > 0 && snap < slots.num_snapshots &&
                      static_cast<int64_t>(in.group_tables.size()) >= slots.group &&
                      in.group_tables[slots.group - 1].size() == 1,
                  ErrorCode::kInternal,
                  "{}: sequence {} names state snapshot {} (of {}) without a state slot", who,
                  in.seq_id, snap, slots.num_snapshots);
    const int32_t slot = in.group_tables[slots.group - 1][0];
    LONGCTX_CHECK(slot >= 0 && slot < slots.num_seqs, ErrorCode::kInternal,
                  "{}: sequence {} has state slot {} of {}", who, in.seq_id, slot, slots.num_seqs);
    const int64_t snap_slot = slots.num_seqs + snap;
    if (save) {
      slots.pool->copy(slot, snap_slot);
      ++counters.state_snapshots_saved;
    } else {
      slots.pool->copy(snap_slot, slot);
      ++counters.state_snapshots_restored;
    }
    counters.state_snapshot_bytes += slots.pool->slot_bytes();
  }
}

}  // namespace longctx
