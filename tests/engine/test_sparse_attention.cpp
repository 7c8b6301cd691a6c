// The CPU paged backend under a sparse policy: a decode row that reads only a KV head's selected
// blocks and a prefill chunk under a block mask equal direct attention (fp32) with the same keys
// masked out; Full and a Quest budget that covers the context give the dense result bit for bit;
// the engine runs Quest and XAttention end to end on the tiny model.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/engine_test_util.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/attention_ref.h"
#include "kv/paged_kv_pool.h"
#include "longctx/engine/executor.h"

namespace longctx::testing {
namespace {

using sparse::DecodeSelection;
using sparse::Phase;
using sparse::PrefillMask;
using sparse::SeqKeys;

// Selects random subsets (decode: blocks per KV head; prefill: a random block mask per q head).
class RandomPolicy final : public sparse::SparsePolicy {
 public:
  RandomPolicy(int64_t hq, int64_t hkv, int64_t bs) : hq_(hq), hkv_(hkv), bs_(bs) {}
  SparsePolicyKind kind() const override { return SparsePolicyKind::kFull; }  // not registered
  std::string_view name() const override { return "random"; }
  bool selects(Phase) const override { return true; }
  DecodeSelection select_decode(int64_t, const float*, const SeqKeys& k) override {
    DecodeSelection s;
    s.page_tokens = bs_;  // whole blocks
    s.per_kv_head.resize(hkv_);
    const int64_t nb = (k.kv_len + bs_ - 1) / bs_;
    for (auto& l : s.per_kv_head)
      for (int32_t j = 0; j < nb; ++j)
        if (j == nb - 1 || rng_() % 2) l.push_back(j);
    last_decode = s;
    return s;
  }
  PrefillMask select_prefill(int64_t, const float*, int64_t, int64_t n, const SeqKeys& k) override {
    const int64_t B = kernels::kSparseBlock;
    PrefillMask m;
    m.q_blocks = (n + B - 1) / B;
    m.k_blocks = (k.kv_len + B - 1) / B;
    m.mask.resize(hq_ * m.q_blocks * m.k_blocks);
    for (auto& x : m.mask) x = rng_() % 3 != 0;
    last_prefill = m;
    return m;
  }
  DecodeSelection last_decode;
  PrefillMask last_prefill;

 private:
  int64_t hq_, hkv_, bs_;
  std::mt19937 rng_{7};
};

struct SmallPool {
  static constexpr int64_t kHq = 4, kHkv = 2, kD = 16, kBs = 16;
  PagedKVPool pool{{1, kHkv, kD, kBs, 64, DType::kF32, Device::cpu()}};
  std::mt19937 rng{1};
  Tensor random(std::vector<int64_t> shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n01(rng);
    return t;
  }
};

// Direct attention of one sequence's rows under a [Hq, n, kv_len] token mask.
std::vector<float> direct(const Tensor& q, int64_t q0, int64_t n, const std::vector<float>& k,
                          const std::vector<float>& v, int64_t kv_len,
                          const std::vector<uint8_t>& mask) {
  std::vector<float> o(n * SmallPool::kHq * SmallPool::kD);
  kernels::cpu::dense_attention_masked_ref(
      q.data<float>() + q0 * SmallPool::kHq * SmallPool::kD, k.data(), v.data(), mask.data(),
      int(n), int(kv_len), SmallPool::kHq, SmallPool::kHkv, SmallPool::kD,
      1.f / std::sqrt(float(SmallPool::kD)), o.data(), nullptr);
  return o;
}

TEST(SparseAttention, SelectedBlocksEqualDirectAttentionWithTheRestMasked) {
  SmallPool st;
  const int64_t bs = SmallPool::kBs, hq = SmallPool::kHq, hkv = SmallPool::kHkv, d = SmallPool::kD;
  // Sequence 0 decodes at kv_len 333 (blocks 0..20), sequence 1 prefills 300 tokens after 200.
  const int64_t len0 = 333, cached1 = 200, n1 = 300, len1 = cached1 + n1;
  ForwardBatch b;
  std::vector<int32_t> ids0(1, 5), ids1(n1, 7);
  b.add_sequence(0, ids0.data(), 1, len0 - 1, true);
  b.add_sequence(1, ids1.data(), n1, cached1, true);
  const int64_t nb0 = (len0 + bs - 1) / bs, nb1 = (len1 + bs - 1) / bs;
  b.block_table_indptr = {0, int32_t(nb0), int32_t(nb0 + nb1)};
  for (int32_t j = 0; j < nb0 + nb1; ++j) b.block_tables.push_back(int32_t((j * 37) % 64));
  for (int64_t t = 0; t < b.num_tokens(); ++t) {
    const int64_t s = t == 0 ? 0 : 1, pos = b.positions[t];
    b.slot_mapping.push_back(int64_t(b.block_tables[b.block_table_indptr[s] + pos / bs]) * bs +
                             pos % bs);
  }
  // Every cached row of both sequences, straight into the pool.
  for (int64_t s = 0; s < 2; ++s) {
    const int64_t cached = s == 0 ? len0 - 1 : cached1;
    for (int64_t pos = 0; pos < cached; ++pos) {
      const int64_t slot =
          int64_t(b.block_tables[b.block_table_indptr[s] + pos / bs]) * bs + pos % bs;
      Tensor k = st.random({hkv, d}), v = st.random({hkv, d});
      std::copy_n(k.data<float>(), hkv * d, st.pool.k(0).data<float>() + slot * hkv * d);
      std::copy_n(v.data<float>(), hkv * d, st.pool.v(0).data<float>() + slot * hkv * d);
    }
  }
  const Tensor q = st.random({b.num_tokens(), hq, d});
  const Tensor k = st.random({b.num_tokens(), hkv, d}), v = st.random({b.num_tokens(), hkv, d});
  RandomPolicy policy(hq, hkv, bs);
  CpuPagedBackend backend(st.pool, 1.f / std::sqrt(float(d)), &policy);
  backend.plan(b);
  backend.store_kv(0, k, v);
  const Tensor out = backend.attend(0, q);

  auto gather = [&](int64_t s, int64_t len, const Tensor& pool_x) {
    std::vector<float> x(len * hkv * d);
    for (int64_t pos = 0; pos < len; ++pos) {
      const int64_t slot =
          int64_t(b.block_tables[b.block_table_indptr[s] + pos / bs]) * bs + pos % bs;
      std::copy_n(pool_x.data<float>() + slot * hkv * d, hkv * d, x.data() + pos * hkv * d);
    }
    return x;
  };
  auto check = [&](const std::vector<float>& want, int64_t q0, const char* what) {
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, double(std::fabs(want[i] - out.data<float>()[q0 * hq * d + i])));
    EXPECT_LE(worst, 1e-5) << what;
  };
  {  // decode: q head g sees the keys of the blocks its KV head's list names
    std::vector<uint8_t> mask(hq * len0, 0);
    ASSERT_EQ(policy.last_decode.per_kv_head.size(), size_t(hkv));
    for (int64_t g = 0; g < hq; ++g)
      for (int32_t j : policy.last_decode.per_kv_head[g / (hq / hkv)])
        for (int64_t pos = j * bs; pos < std::min(len0, (j + 1) * bs); ++pos)
          mask[g * len0 + pos] = 1;
    check(direct(q, 0, 1, gather(0, len0, st.pool.k(0)), gather(0, len0, st.pool.v(0)), len0, mask),
          0, "decode");
  }
  {  // prefill: the block mask and causality
    const PrefillMask& m = policy.last_prefill;
    ASSERT_FALSE(m.all());
    const int64_t B = kernels::kSparseBlock;
    std::vector<uint8_t> mask(hq * n1 * len1, 0);
    for (int64_t g = 0; g < hq; ++g)
      for (int64_t i = 0; i < n1; ++i)
        for (int64_t j = 0; j <= cached1 + i; ++j)
          mask[(g * n1 + i) * len1 + j] = m.mask[(g * m.q_blocks + i / B) * m.k_blocks + j / B];
    check(
        direct(q, 1, n1, gather(1, len1, st.pool.k(0)), gather(1, len1, st.pool.v(0)), len1, mask),
        1, "prefill");
  }
}

std::vector<RequestOutput> run_engine(const SparseOptions& sparse, int64_t prompt_len,
                                      int64_t offload_gpu_blocks = 0) {
  CpuExecutorOptions o;
  o.sparse = sparse;
  if (offload_gpu_blocks > 0) {  // most blocks on the simulated host, write-backs landing late
    o.num_blocks = 512;
    o.offload_gpu_blocks = offload_gpu_blocks;
    o.offload_slots = 2;
    o.offload_slot_blocks = 3;
    o.offload_write_back_lag = 2;
  }
  EngineCore core(make_cpu_executor(tiny_model(), o), nullptr, core_options(128, 4));
  std::mt19937 rng(3);
  std::vector<int32_t> ids(prompt_len);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 500);
  SamplingParams sp = greedy(24);
  sp.logprobs = 1;
  core.add_request(0, ids, sp, 0);
  core.add_request(1, std::vector<int32_t>(ids.begin(), ids.begin() + prompt_len / 2), sp, 0);
  std::vector<RequestOutput> outs(2);
  while (core.has_unfinished()) {
    core.step();
    for (RequestOutput& out : core.take_finished()) outs[out.index] = std::move(out);
  }
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  return outs;
}

TEST(SparseAttention, FullAndACoveringQuestBudgetAreTheDenseResultExactly) {
  SparseOptions none;
  const auto dense = run_engine(none, 300);
  SparseOptions full;
  full.policy = SparsePolicyKind::kFull;
  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.budget_tokens = 512;  // >= every context here: Quest selects everything
  for (const SparseOptions& o : {full, quest}) {
    const auto got = run_engine(o, 300);
    ASSERT_EQ(got.size(), dense.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token_ids, dense[i].token_ids) << sparse_policy_name(o.policy);
      for (size_t t = 0; t < got[i].logprobs.size(); ++t)
        EXPECT_EQ(got[i].logprobs[t].logprob, dense[i].logprobs[t].logprob)
            << sparse_policy_name(o.policy);
    }
  }
}

TEST(SparseAttention, QuestAndXAttentionRunInTheEngine) {
  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.budget_tokens = 96;
  quest.sink_tokens = 16;
  quest.window_tokens = 32;
  SparseOptions avg = quest;
  avg.per_head = false;
  SparseOptions xattn;
  xattn.policy = SparsePolicyKind::kXAttention;
  xattn.xattn_min_len = 0;  // prompts of 400
  const auto dense = run_engine({}, 400);
  for (const SparseOptions& o : {quest, avg, xattn}) {
    const auto got = run_engine(o, 400);
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].token_ids.size(), 24u);
      // The first token comes from the prefill: Quest (decode only) leaves it dense.
      if (o.policy == SparsePolicyKind::kQuest)
        EXPECT_EQ(got[i].token_ids[0], dense[i].token_ids[0]);
    }
  }
}

// Quest through the simulated offload (the GPU path's reference kernels, host pages read in
// place) selects what the resident CPU engine's policy selects: the same tokens, logprobs equal
// to fp32 rounding (the two sum the softmax in another order).
TEST(SparseAttention, QuestThroughTheSimulatedOffloadIsTheResidentQuest) {
  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.budget_tokens = 96;
  quest.sink_tokens = 16;
  quest.window_tokens = 32;
  SparseOptions avg = quest;
  avg.per_head = false;
  for (const SparseOptions& o : {quest, avg}) {
    const auto resident = run_engine(o, 400);
    const auto offload = run_engine(o, 400, /*offload_gpu_blocks=*/20);
    ASSERT_EQ(offload.size(), resident.size());
    for (size_t i = 0; i < offload.size(); ++i) {
      EXPECT_EQ(offload[i].token_ids, resident[i].token_ids) << (o.per_head ? "per-head" : "avg");
      for (size_t t = 0; t < offload[i].logprobs.size(); ++t)
        EXPECT_NEAR(offload[i].logprobs[t].logprob, resident[i].logprobs[t].logprob, 1e-4);
    }
  }
}

TEST(SparseAttention, XAttentionThroughTheSimulatedOffloadIsTheResidentXAttention) {
  SparseOptions x;
  x.policy = SparsePolicyKind::kXAttention;
  x.threshold = 0.9;
  x.xattn_min_len = 0;
  const auto resident = run_engine(x, 480);
  const auto offload = run_engine(x, 480, /*offload_gpu_blocks=*/20);
  ASSERT_EQ(offload.size(), resident.size());
  for (size_t i = 0; i < offload.size(); ++i) {
    EXPECT_EQ(offload[i].token_ids, resident[i].token_ids);
    for (size_t t = 0; t < offload[i].logprobs.size(); ++t)
      EXPECT_NEAR(offload[i].logprobs[t].logprob, resident[i].logprobs[t].logprob, 1e-4);
  }
}

}  // namespace
}  // namespace longctx::testing
