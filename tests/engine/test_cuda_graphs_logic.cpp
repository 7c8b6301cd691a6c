// The host-side logic of the decode CUDA graphs (src/engine/cuda_graphs.h), without a GPU:
// bucket lists and choice, the padded batch a graph replays (a valid paged batch whose padding
// sequences only name the scratch block), the refusals, ForwardBatch's padding field, and the
// model's device-only forward (forward_on_device after plan() equals forward() on the CPU).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "attention/backends/cpu_backend.h"
#include "attention/backends/paged_backend.h"
#include "common/test_data.h"
#include "engine/cuda_graphs.h"
#include "kv/paged_kv_pool.h"
#include "longctx/core/error.h"
#include "longctx/engine/reference_forward.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/loader/model_config.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

TEST(DecodeGraphBuckets, PowersOfTwoThenTheMax) {
  EXPECT_EQ(decode_graph_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(decode_graph_buckets(2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(decode_graph_buckets(32), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(decode_graph_buckets(48), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 48}));
  EXPECT_EQ(decode_graph_buckets(256).size(), 9u);
  EXPECT_THROW(decode_graph_buckets(0), Error);
  const std::vector<int64_t> b = {1, 2, 4, 8, 16, 32, 48};
  EXPECT_EQ(pick_decode_bucket(b, 1), 1);
  EXPECT_EQ(pick_decode_bucket(b, 3), 4);
  EXPECT_EQ(pick_decode_bucket(b, 8), 8);
  EXPECT_EQ(pick_decode_bucket(b, 17), 32);
  EXPECT_EQ(pick_decode_bucket(b, 33), 48);
  EXPECT_EQ(pick_decode_bucket(b, 49), 0);
}

// Decode steps of sequences with kv_lens `lens` (block size 16): sequence s owns blocks
// 1 + 10 s, 2 + 10 s, ... (block 0 is kept as the scratch block).
ForwardBatch decode_batch(const std::vector<int32_t>& lens) {
  ForwardBatch b;
  b.block_table_indptr.push_back(0);
  for (size_t s = 0; s < lens.size(); ++s) {
    const int32_t id = 5 + int32_t(s);
    b.add_sequence(s, &id, 1, lens[s] - 1, true);
    const int32_t blocks = (lens[s] + 15) / 16;
    for (int32_t i = 0; i < blocks; ++i) b.block_tables.push_back(1 + 10 * int32_t(s) + i);
    b.block_table_indptr.push_back(int32_t(b.block_tables.size()));
    const int32_t j = lens[s] - 1;
    b.slot_mapping.push_back(int64_t(b.block_tables[b.block_table_indptr[s] + j / 16]) * 16 +
                             j % 16);
  }
  return b;
}

TEST(DecodeGraphPadding, PaddedBatchIsValidAndOnlyNamesTheScratchBlock) {
  const ForwardBatch b = decode_batch({1, 16, 17});
  PagedBackendLimits limits{64, 8, 64};
  check_paged_batch(b, 16, 64, limits);
  const ForwardBatch p = pad_decode_batch(b, 8, {0, 16});
  EXPECT_EQ(p.num_seqs(), 8);
  EXPECT_EQ(p.num_tokens(), 8);
  EXPECT_EQ(p.num_padding_seqs, 5);
  EXPECT_TRUE(p.fixed_launch_shapes);
  p.validate(1000, 4096);
  check_paged_batch(p, 16, 64, limits);
  EXPECT_EQ(p.logits_indices, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // The real sequences are untouched, in front.
  for (int64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(p.kv_lens[s], b.kv_lens[s]);
    EXPECT_EQ(p.slot_mapping[s], b.slot_mapping[s]);
    EXPECT_EQ(p.input_ids[s], b.input_ids[s]);
  }
  EXPECT_EQ(std::vector<int32_t>(p.block_tables.begin(), p.block_tables.begin() + 4),
            b.block_tables);
  for (int64_t s = 3; s < 8; ++s) {
    EXPECT_EQ(p.kv_lens[s], 1);
    EXPECT_EQ(p.positions[s], 0);
    EXPECT_EQ(p.input_ids[s], 0);
    EXPECT_EQ(p.slot_mapping[s], 0);  // scratch block 0, slot 0
    EXPECT_EQ(p.block_tables[p.block_table_indptr[s]], 0);
    EXPECT_EQ(p.q_len(s), 1);
  }
  // Exactly a bucket: nothing added, but the flags are set (the fixed grid).
  const ForwardBatch same = pad_decode_batch(b, 3, {0, 16});
  EXPECT_EQ(same.num_seqs(), 3);
  EXPECT_EQ(same.num_padding_seqs, 0);
  EXPECT_TRUE(same.fixed_launch_shapes);
  EXPECT_THROW(pad_decode_batch(b, 2, {0, 16}), Error);
}

// A model of several KV groups (Gemma 3: full + sliding): the padding sequences name the scratch
// block in every group's table, and a real table naming the scratch block is refused per group.
TEST(DecodeGraphPadding, EveryKvGroupsTablePadsWithTheScratchBlock) {
  ForwardBatch b = decode_batch({1, 40});
  GroupBlockTables t{b.block_table_indptr, b.block_tables, b.slot_mapping};
  for (int32_t& id : t.block_tables) id += 100;  // the sliding group's own blocks
  for (size_t s = 0; s < t.slot_mapping.size(); ++s) t.slot_mapping[s] += 100 * 16;
  t.block_tables[1] = -1;  // dropped behind the window
  b.group_tables.push_back(t);
  const ForwardBatch p = pad_decode_batch(b, 4, {0, 16});
  ASSERT_EQ(p.group_tables.size(), 1u);
  const BlockTablesView g = p.tables(1);
  ASSERT_EQ(g.block_table_indptr.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(g.block_tables.begin(), g.block_tables.begin() + 4),
            t.block_tables);
  for (int64_t s = 2; s < 4; ++s) {
    EXPECT_EQ(g.block_table_indptr[s + 1] - g.block_table_indptr[s], 1);
    EXPECT_EQ(g.block_tables[g.block_table_indptr[s]], 0);
    EXPECT_EQ(g.slot_mapping[s], 0);
  }
  EXPECT_EQ(decode_graph_refusal(b, std::vector<int64_t>{4}, {0, 16}, 64), "");
  b.group_tables[0].block_tables[0] = 0;
  EXPECT_NE(decode_graph_refusal(b, std::vector<int64_t>{4}, {0, 16}, 64).find("KV group 1"),
            std::string::npos);
}

TEST(DecodeGraphPadding, RefusalsNameTheProblem) {
  const std::vector<int64_t> buckets = {1, 2, 4};
  auto refusal = [&](const ForwardBatch& b, int64_t max_blocks = 0) {
    return decode_graph_refusal(b, buckets, {0, 16}, max_blocks);
  };
  EXPECT_EQ(refusal(decode_batch({1, 16, 17})), "");
  EXPECT_NE(refusal(decode_batch({1, 2, 3, 4, 5})).find("more than the largest graph (4)"),
            std::string::npos);
  ForwardBatch prefill;
  const int32_t ids[3] = {1, 2, 3};
  prefill.add_sequence(0, ids, 3, 0, true);
  EXPECT_NE(refusal(prefill).find("not a decode step"), std::string::npos) << refusal(prefill);
  ForwardBatch two = decode_batch({5, 6});
  two.logits_indices = {1};
  EXPECT_NE(refusal(two).find("1 logits rows for 2 sequences"), std::string::npos);
  ForwardBatch scratch = decode_batch({5, 6});
  scratch.block_tables[1] = 0;
  EXPECT_NE(refusal(scratch).find("scratch block 0"), std::string::npos) << refusal(scratch);
  const ForwardBatch three = decode_batch({40, 6, 7});  // 5 entries + 1 padding
  EXPECT_EQ(refusal(three, 6), "");
  EXPECT_NE(refusal(three, 5).find("6 block-table entries"), std::string::npos);
  EXPECT_NE(refusal(pad_decode_batch(three, 4, {0, 16})).find("padded already"), std::string::npos);
  EXPECT_NE(refusal(ForwardBatch{}).find("empty"), std::string::npos);
}

// A model with linear-attention layers (a state group after the full one): the padding
// sequences take the scratch state slot in the state group's table (no token slot), the padded
// batch passes the backend's checks, and a real sequence holding that slot is refused.
TEST(DecodeGraphPadding, StateGroupPadsWithTheScratchStateSlot) {
  ModelConfig c = load_model_config(testing::test_data_dir() + "/fixtures/tiny-llama3/config.json");
  c.num_hidden_layers = 4;
  c.layer_types.assign(4, LayerAttention::kLinear);
  c.layer_types[3] = LayerAttention::kFull;
  c.linear = {2, 4, 16, 32, 4};
  const KvGroups groups = KvGroups::from_config(c, DType::kBF16);
  ASSERT_EQ(groups[1].kind, KvGroupKind::kState);
  ForwardBatch b = decode_batch({1, 40});
  b.group_tables.push_back({{0, 1, 2}, {2, 0}, {}});  // state slots 2 and 0
  check_group_batch(b, groups, 16, 64, 8);
  const DecodePadding padding{0, 16, &groups, 7};
  const ForwardBatch p = pad_decode_batch(b, 4, padding);
  check_group_batch(p, groups, 16, 64, 8);
  const BlockTablesView st = p.tables(1);
  EXPECT_EQ(std::vector<int32_t>(st.block_tables.begin(), st.block_tables.end()),
            (std::vector<int32_t>{2, 0, 7, 7}));
  EXPECT_EQ(std::vector<int32_t>(st.block_table_indptr.begin(), st.block_table_indptr.end()),
            (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(st.slot_mapping.empty());
  // The full group still pads with the scratch block.
  EXPECT_EQ(p.block_tables.back(), 0);
  EXPECT_EQ(p.slot_mapping.back(), 0);
  // Slot 0 is a state slot, not the scratch block: no refusal; the scratch state slot is.
  const std::vector<int64_t> buckets = {4};
  EXPECT_EQ(decode_graph_refusal(b, buckets, padding, 64), "");
  b.group_tables[0].block_tables[1] = 7;
  EXPECT_NE(decode_graph_refusal(b, buckets, padding, 64).find("scratch state slot 7"),
            std::string::npos)
      << decode_graph_refusal(b, buckets, padding, 64);
  // A state group without a scratch state slot cannot be padded.
  EXPECT_THROW(pad_decode_batch(b, 4, DecodePadding{0, 16, &groups, -1}), Error);
}

TEST(DecodeGraphPadding, PaddingCountIsValidated) {
  ForwardBatch b = decode_batch({3, 4});
  b.num_padding_seqs = 2;
  EXPECT_THROW(b.validate(1000, 0), Error);  // every sequence padding
  b.num_padding_seqs = -1;
  EXPECT_THROW(b.validate(1000, 0), Error);
  b.num_padding_seqs = 1;
  EXPECT_NO_THROW(b.validate(1000, 0));
}

// The device half of forward() is forward() minus validation, plan and upload: on the CPU
// reference the two give the same bits.
TEST(DecodeGraphModel, ForwardOnDeviceEqualsForward) {
  auto ck = std::make_shared<const Checkpoint>(
      load_checkpoint(testing::test_data_dir() + "/fixtures/tiny-qwen3"));
  auto model = create_model(ck, {});
  const ModelConfig& c = model->config();
  std::vector<int32_t> ids = {3, 17, 99, 5, 250, 8};
  std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
  auto batch = [&] {
    ForwardBatch b;
    b.add_sequence(0, ids.data(), int64_t(ids.size()), 0, false);
    b.logits_indices = {2, 5};
    return b;
  };
  auto cache_a = std::make_unique<KVCache>(model->config(), 16),
       cache_b = std::make_unique<KVCache>(model->config(), 16);
  CpuAttentionBackend a({cache_a.get()}, model->attention_scale());
  Tensor want = model->forward(batch(), a);
  CpuAttentionBackend b({cache_b.get()}, model->attention_scale());
  const ForwardBatch planned = batch();  // the backend keeps a view of its positions
  b.plan(planned);
  Tensor got = Tensor::empty({2, c.vocab_size}, DType::kF32);
  std::vector<int32_t> rows = {2, 5};
  model->forward_on_device(Tensor::from_blob(ids.data(), {6}, DType::kI32),
                           Tensor::from_blob(pos.data(), {6}, DType::kI64),
                           Tensor::from_blob(rows.data(), {2}, DType::kI32), b, got);
  ASSERT_EQ(want.shape(), got.shape());
  EXPECT_EQ(std::memcmp(want.data_ptr(), got.data_ptr(), want.nbytes()), 0);
  // Shapes and dtypes are checked, naming them.
  Tensor wrong = Tensor::empty({3, c.vocab_size}, DType::kF32);
  EXPECT_THROW(model->forward_on_device(Tensor::from_blob(ids.data(), {6}, DType::kI32),
                                        Tensor::from_blob(pos.data(), {6}, DType::kI64),
                                        Tensor::from_blob(rows.data(), {2}, DType::kI32), b, wrong),
               Error);
  EXPECT_THROW(model->forward_on_device(Tensor::from_blob(ids.data(), {6}, DType::kI32),
                                        Tensor::from_blob(ids.data(), {6}, DType::kI32),
                                        Tensor::from_blob(rows.data(), {2}, DType::kI32), b, got),
               Error);
}

// Graphs need the model on a GPU (and a CUDA build): a clear error otherwise.
TEST(DecodeGraphModel, CpuModelIsRefused) {
  auto ck = std::make_shared<const Checkpoint>(
      load_checkpoint(testing::test_data_dir() + "/fixtures/tiny-qwen3"));
  auto model = create_model(ck, {});
  const ModelConfig& c = model->config();
  PagedKVPool pool(
      {c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 4, DType::kF32, Device::cpu()});
  auto cache = std::make_unique<KVCache>(model->config(), 4);
  CpuAttentionBackend attn({cache.get()}, model->attention_scale());
  DecodeGraphOptions o;
  o.max_num_seqs = 4;
  try {
    DecodeGraphs g(*model, attn, pool, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kUnsupported || e.code() == ErrorCode::kInvalidArgument)
        << e.what();
    std::printf("%s\n", e.what());
  }
}

}  // namespace
}  // namespace longctx
