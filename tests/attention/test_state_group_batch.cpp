// A state KV group in a paged step: one state slot per sequence and no token slots, checked
// against the pool of slots (a backend without one refuses the group by name).
#include <gtest/gtest.h>

#include <string>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/paged_backend.h"
#include "longctx/core/error.h"

namespace longctx {
namespace {

// Two layers: linear attention, then full attention; blocks of 4 tokens.
ModelConfig hybrid_config() {
  ModelConfig c;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.layer_types = {LayerAttention::kLinear, LayerAttention::kFull};
  c.linear = {1, 2, 4, 4, 3};
  return c;
}

// Two sequences: 3 new tokens at 0, 1 new token after 5 cached; state slots `slots`.
ForwardBatch batch_with_slots(std::vector<int32_t> slots) {
  ForwardBatch b;
  const int32_t ids[3] = {1, 2, 3};
  b.add_sequence(10, ids, 3, 0, true);
  b.add_sequence(11, ids, 1, 5, true);
  b.block_table_indptr = {0, 1, 3};
  b.block_tables = {0, 1, 2};
  b.slot_mapping = {0, 1, 2, 2 * 4 + 1};
  GroupBlockTables st;
  st.block_table_indptr = {0, 1, 2};
  st.block_tables = std::move(slots);
  b.group_tables.push_back(st);
  return b;
}

std::string error_of(const ForwardBatch& b, int64_t slots) {
  const KvGroups groups = KvGroups::from_config(hybrid_config(), DType::kF32);
  try {
    check_group_batch(b, groups, 4, 8, slots);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StateGroupBatch, OneSlotPerSequenceWithinThePool) {
  EXPECT_EQ(error_of(batch_with_slots({1, 0}), 2), "");
  EXPECT_NE(error_of(batch_with_slots({1, 2}), 2).find("names state slot 2 in KV group 1"),
            std::string::npos);
  EXPECT_NE(error_of(batch_with_slots({-1, 0}), 2).find("names state slot -1"), std::string::npos);
  ForwardBatch two = batch_with_slots({0, 1});
  two.group_tables[0].block_tables.push_back(1);  // a second slot for the last sequence
  two.group_tables[0].block_table_indptr.back() = 3;
  EXPECT_NE(error_of(two, 2).find("must name one state slot per sequence"), std::string::npos)
      << error_of(two, 2);
  EXPECT_NE(error_of(batch_with_slots({0, 1}), 0).find("holds no state pool"), std::string::npos);
}

}  // namespace
}  // namespace longctx
