// The batched model interface on the CPU reference: a ForwardBatch of several sequences of
// different lengths (some with cached tokens) gives each sequence the logits it gets alone;
// malformed batches and paged tables are clear errors.
#include <gtest/gtest.h>

#include <cmath>

#include "attention/backends/cpu_backend.h"
#include "attention/backends/paged_backend.h"
#include "kv/paged_kv_pool.h"
#include "longctx/core/error.h"
#include "longctx/engine/reference_forward.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

class ForwardBatchCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardBatchCpu, MixedLengthsEqualOneAtATime) {
  auto model = load_fixture_model(GetParam());
  const int64_t vocab = model->config().vocab_size;
  // (cached tokens, new tokens): a fresh prompt, a decode step, a chunk after a prefix, one token.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{0, 37}, {20, 1}, {64, 30}, {0, 1}};
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::unique_ptr<KVCache>> caches, alone_caches;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto [cached, n] = shapes[s];
    ids.push_back(make_ids(cached + n, s, std::min<int64_t>(vocab, 1000)));
    caches.push_back(std::make_unique<KVCache>(model->config(), cached + n));
    alone_caches.push_back(std::make_unique<KVCache>(model->config(), cached + n));
    if (cached > 0) {  // fill the prefix in both caches
      std::span<const int32_t> prefix(ids[s].data(), cached);
      reference_forward(*model, prefix, iota_positions(0, cached), *caches[s]);
      reference_forward(*model, prefix, iota_positions(0, cached), *alone_caches[s]);
    }
  }
  ForwardBatch batch;
  std::vector<KVCache*> ptrs;
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto [cached, n] = shapes[s];
    batch.add_sequence(s, ids[s].data() + cached, n, cached, /*want_logits=*/true);
    ptrs.push_back(caches[s].get());
  }
  CpuAttentionBackend attention(ptrs, model->attention_scale());
  Tensor together = model->forward(batch, attention);
  attention.commit();
  ASSERT_EQ(together.size(0), static_cast<int64_t>(shapes.size()));
  for (size_t s = 0; s < shapes.size(); ++s) {
    const auto [cached, n] = shapes[s];
    std::span<const int32_t> news(ids[s].data() + cached, n);
    Tensor alone =
        reference_forward(*model, news, iota_positions(cached, n), *alone_caches[s], true);
    EXPECT_LE(max_abs_diff(alone.data<float>(), together.data<float>() + s * vocab, vocab), 1e-4)
        << "sequence " << s;
    EXPECT_EQ(caches[s]->length(), cached + n);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ForwardBatchCpu,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-qwen3",
                                           "tiny-qwen3-moe", "tiny-qwen2-moe"));

TEST(ForwardBatch, ValidateNamesTheProblem) {
  std::vector<int32_t> ids = {1, 2, 3};
  ForwardBatch b;
  b.add_sequence(7, ids.data(), 3, 0, true);
  EXPECT_NO_THROW(b.validate(10, 100));
  auto expect = [](const ForwardBatch& x, ErrorCode code, const char* what) {
    try {
      x.validate(10, 100);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    }
  };
  ForwardBatch c = b;
  c.input_ids[1] = 10;
  expect(c, ErrorCode::kOutOfRange, "id past the vocabulary");
  c = b;
  c.positions[2] = 100;
  expect(c, ErrorCode::kOutOfRange, "position past max_position_embeddings");
  c = b;
  c.qo_indptr.back() = 2;
  expect(c, ErrorCode::kInvalidArgument, "qo_indptr not ending at T");
  c = b;
  c.kv_lens[0] = 2;
  expect(c, ErrorCode::kInvalidArgument, "kv_len < q_len");
  c = b;
  c.logits_indices = {2, 1};
  expect(c, ErrorCode::kInvalidArgument, "logits rows not ascending");
  c = b;
  c.positions.pop_back();
  expect(c, ErrorCode::kInvalidArgument, "positions shorter than ids");
}

ForwardBatch paged_one(int64_t cached, int64_t n, int64_t bs) {
  ForwardBatch b;
  std::vector<int32_t> ids(n, 1);
  b.add_sequence(1, ids.data(), n, cached, true);
  const int64_t blocks = (cached + n + bs - 1) / bs;
  b.block_table_indptr = {0, static_cast<int32_t>(blocks)};
  for (int64_t i = 0; i < blocks; ++i) b.block_tables.push_back(static_cast<int32_t>(10 + i));
  for (int64_t j = cached; j < cached + n; ++j)
    b.slot_mapping.push_back((10 + j / bs) * bs + j % bs);
  return b;
}

TEST(PagedBatchCheck, AcceptsConsistentTablesAndRejectsTheRest) {
  const PagedBackendLimits lim{64, 4, 16};
  EXPECT_NO_THROW(check_paged_batch(paged_one(30, 5, 16), 16, 32, lim));
  auto expect = [&](const ForwardBatch& b, const char* what) {
    try {
      check_paged_batch(b, 16, 32, lim);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      SUCCEED() << e.what();
    }
  };
  ForwardBatch b = paged_one(30, 5, 16);  // 35 tokens need 3 blocks of 16
  b.block_tables.pop_back();
  b.block_table_indptr = {0, 2};
  expect(b, "table shorter than the context");
  b = paged_one(30, 5, 16);
  b.block_tables[0] = 32;
  expect(b, "block outside the pool");
  b = paged_one(30, 5, 16);
  b.slot_mapping[2] += 1;
  expect(b, "slot not where the table puts it");
  b = paged_one(30, 5, 16);
  b.positions[0] = 3;
  expect(b, "position not the KV index");
  expect(paged_one(0, 65, 16), "more tokens than the plan");
  b = paged_one(30, 5, 16);
  b.slot_mapping.pop_back();
  expect(b, "slot_mapping shorter than the tokens");
  const PagedBackendLimits short_seqs{64, 4, 16, 34};  // 35 keys > 34 per sequence
  EXPECT_THROW(check_paged_batch(paged_one(30, 5, 16), 16, 32, short_seqs), Error);
  EXPECT_NO_THROW(check_paged_batch(paged_one(29, 5, 16), 16, 32, short_seqs));
}

TEST(PagedKVPool, AllocatesFreesAndRefusesOverdraft) {
  PagedKVPool pool({2, 2, 16, 8, 5, DType::kBF16, Device::cpu()});
  EXPECT_EQ(pool.k(0).shape(), (Shape{5, 8, 2, 16}));
  EXPECT_EQ(pool.config().bytes_per_block(), 2 * 2 * 8 * 2 * 16 * 2);
  auto a = pool.allocate(3);
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  try {
    pool.allocate(3);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  }
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.free(a);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  EXPECT_THROW(pool.free({1}), Error);  // double free
}

// An FP8 pool: one-byte codes, fp32 scales [blocks, kv_heads] per layer for K and V that start at
// zero (a block's first write restarts them; a copy of an unwritten block copies zeros), and the
// attention's q / o in the dtype it encodes (compute_dtype); a 16-bit pool computes in its own.
TEST(PagedKVPool, Fp8PoolHoldsCodesAndZeroedScales) {
  PagedKVPoolConfig c{2, 2, 16, 8, 5, DType::kFP8E4M3, Device::cpu()};
  c.fp8_source_dtype = DType::kF16;
  PagedKVPool pool(c);
  EXPECT_EQ(pool.k(1).dtype(), DType::kFP8E4M3);
  EXPECT_EQ(pool.k(1).shape(), (Shape{5, 8, 2, 16}));
  EXPECT_EQ(pool.k_scale(1).shape(), (Shape{5, 2}));
  EXPECT_EQ(pool.v_scale(0).dtype(), DType::kF32);
  for (int64_t l = 0; l < 2; ++l)
    for (const Tensor* t : {&pool.k_scale(l), &pool.v_scale(l)})
      for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ(t->data<float>()[i], 0.f);
  EXPECT_EQ(pool.config().bytes_per_block(), 2 * 2 * (8 * 2 * 16 + 2 * 4));
  EXPECT_EQ(pool.config().compute_dtype(), DType::kF16);
  PagedKVPoolConfig bf16{2, 2, 16, 8, 5, DType::kBF16, Device::cpu()};
  EXPECT_EQ(bf16.compute_dtype(), DType::kBF16);
  EXPECT_EQ(PagedKVPool(bf16).k_scale(0).numel(), 0);
}

}  // namespace
}  // namespace longctx::testing
