// Sparse policies through the offload backend on the CPU simulation, at the backend's seam (the
// GPU twin of Quest's test is tests/gpu_models/test_gpu_sparse.cpp). Quest: random K / V / q
// written by store_kv over prefill chunks of two sequences, then decode steps, through
//   - the resident CPU backend with the CPU engine's QuestPolicy (pages of one block), and
//   - OffloadAttentionBackend over the simulated device with quest (a GPU cache of a few blocks,
//     write-backs landing two steps late), which reads the selected host pages in place;
// the decode outputs must agree to fp32 rounding, the sparse steps must have read host pages,
// and they must differ from dense attention (the budget is much smaller than the context); the
// same over an FP8 cache (the decode rows append to partial blocks, raising their scales), and
// with decode steps shaped as CUDA graphs run them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/cuda_graphs.h"
#include "engine/step_batch.h"
#include "kernels/attention_params.h"
#include "kv/paged_kv_pool.h"
#include "longctx/core/error.h"

namespace longctx::testing {
namespace {

constexpr int64_t kBlock = 16, kHq = 4, kHkv = 2, kD = 8, kChunk = 48;

Tensor random_rows(int64_t t, int64_t h, std::mt19937& rng) {
  Tensor x = Tensor::empty({t, h, kD}, DType::kF32);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n01(rng);
  return x;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// The same random steps through the resident CPU backend with the CPU engine's policy, the
// offload backend over the simulated device with that policy (a GPU cache of a few blocks, rings
// of 2 x 3 blocks, write-backs landing two steps late) and dense resident attention: prefill chunks
// of each sequence, then decode steps of all. fp8: every cache holds FP8 E4M3 codes and scales.
class ThreeBackends {
 public:
  ThreeBackends(const SparseOptions& sparse, std::vector<int64_t> lens, int64_t chunk, int decodes,
                int seed, int64_t gpu_blocks = 12, bool fp8 = false)
      : lens_(std::move(lens)), chunk_(chunk), decodes_(decodes), rng_(seed) {
    int64_t num_blocks = 0;
    for (int64_t len : lens_) num_blocks += (len + decodes + kBlock - 1) / kBlock;
    const float scale = 1.f / std::sqrt(float(kD));
    PagedKVPoolConfig kv{1, kHkv, kD, kBlock, num_blocks, DType::kF32, Device::cpu()};
    if (fp8) {
      kv.dtype = DType::kFP8E4M3;
      kv.fp8_source_dtype = DType::kF32;
    }
    pool_ = std::make_unique<PagedKVPool>(kv);
    dense_pool_ = std::make_unique<PagedKVPool>(kv);
    policy_ = sparse::make_sparse_policy(sparse, {1, num_blocks, kBlock, kHq, kHkv, kD, scale});
    resident_ = std::make_unique<CpuPagedBackend>(*pool_, scale, policy_.get());
    dense_ = std::make_unique<CpuPagedBackend>(*dense_pool_, scale);
    OffloadDeviceConfig d;
    // One host block more: the graph-shaped steps' scratch block (set_graph_bucket).
    scratch_ = static_cast<int32_t>(num_blocks);
    d.geometry = {1, kBlock, num_blocks + 1, gpu_blocks, /*slots=*/2, /*slot blocks=*/3};
    d.num_qo_heads = kHq;
    d.num_kv_heads = kHkv;
    d.head_dim = kD;
    d.dtype = DType::kF32;
    d.sm_scale = scale;
    d.max_tokens = 2 * chunk;
    d.max_seqs = 4;
    d.cpu_write_back_lag = 2;
    d.sparse = sparse;
    if (fp8) d.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    offload_ = std::make_unique<OffloadAttentionBackend>(d.geometry, make_cpu_offload_device(d));
    int32_t next = 0;
    for (int64_t len : lens_) {
      tables_.emplace_back();
      for (int64_t b = 0; b < (len + decodes + kBlock - 1) / kBlock; ++b)
        tables_.back().push_back(next++);
      tokens_.emplace_back(len + decodes, 1);
    }
    done_.assign(lens_.size(), 0);
  }

  // Outputs {resident, offload, dense} of the next prefill step (every sequence with prompt
  // left takes a chunk; `decode_rest` adds a decode row for those whose prompt is done);
  // empty when every prompt is done.
  std::vector<Tensor> prefill_step(bool decode_rest = false) {
    std::vector<StepInput> in;
    std::vector<size_t> decoding;
    for (size_t s = 0; s < lens_.size(); ++s) {
      if (done_[s] < lens_[s]) {
        const int64_t m = std::min(chunk_, lens_[s] - done_[s]);
        in.push_back({uint64_t(s), tokens_[s], done_[s], m, tables_[s], true});
        done_[s] += m;
      } else if (decode_rest && done_[s] < lens_[s] + decodes_) {
        decoding.push_back(s);
      }
    }
    if (in.empty()) return {};
    for (size_t s : decoding)
      in.push_back({uint64_t(s), tokens_[s], done_[s]++, 1, tables_[s], true});
    return step(in);
  }
  std::vector<Tensor> decode_step() {
    std::vector<StepInput> in;
    for (size_t s = 0; s < lens_.size(); ++s)
      in.push_back({uint64_t(s), tokens_[s], done_[s]++, 1, tables_[s], true});
    return step(in);
  }
  const OffloadAttentionBackend& offload() const { return *offload_; }
  // Attention mass on every n-th key block of 128 (XAttention then drops the others).
  void set_hot_blocks(int64_t n) { hot_blocks_ = n; }
  // Decode steps reach the offload backend as a CUDA graph's would: padded to `bucket` sequences
  // in the scratch block (fixed_launch_shapes), the step ended by end_graph_step().
  void set_graph_bucket(int64_t bucket) { graph_bucket_ = bucket; }

 private:
  std::vector<Tensor> step(const std::vector<StepInput>& in) {
    ForwardBatch batch = make_forward_batch(in, kBlock);
    const int64_t t = batch.num_tokens();
    Tensor k = random_rows(t, kHkv, rng_), v = random_rows(t, kHkv, rng_),
           q = random_rows(t, kHq, rng_);
    if (hot_blocks_ > 0) {  // keys of every hot_blocks_-th block of 128 share q's direction
      for (int64_t i = 0; i < t; ++i) {
        float* qi = q.data<float>() + i * kHq * kD;
        for (int64_t e = 0; e < kHq * kD; ++e) qi[e] += kBoost;
        if (batch.positions[i] / kernels::kSparseBlock % hot_blocks_ != 0) continue;
        float* ki = k.data<float>() + i * kHkv * kD;
        for (int64_t e = 0; e < kHkv * kD; ++e) ki[e] += kBoost;
      }
    }
    std::vector<Tensor> outs;
    for (AttentionBackend* be : {static_cast<AttentionBackend*>(resident_.get()),
                                 static_cast<AttentionBackend*>(offload_.get()),
                                 static_cast<AttentionBackend*>(dense_.get())}) {
      if (be == offload_.get() && graph_bucket_ > 0 && batch.num_tokens() == batch.num_seqs()) {
        // Padding rows (zeros) after the real ones; the real rows' output is compared.
        const ForwardBatch padded = pad_decode_batch(batch, graph_bucket_, {scratch_, kBlock});
        be->plan(padded);
        be->store_kv(0, pad_rows(k), pad_rows(v));
        outs.push_back(be->attend(0, pad_rows(q)).slice(0, 0, t).contiguous());
        be->end_graph_step();
        continue;
      }
      be->plan(batch);
      be->store_kv(0, k, v);
      outs.push_back(be->attend(0, q));
    }
    return outs;
  }

  Tensor pad_rows(const Tensor& x) const {
    Tensor p = Tensor::zeros({graph_bucket_, x.size(1), x.size(2)}, DType::kF32);
    std::memcpy(p.data_ptr(), x.data_ptr(), x.nbytes());
    return p;
  }

  std::vector<int64_t> lens_;
  int64_t chunk_;
  int decodes_;
  std::mt19937 rng_;
  std::unique_ptr<PagedKVPool> pool_, dense_pool_;
  std::unique_ptr<sparse::SparsePolicy> policy_;
  std::unique_ptr<CpuPagedBackend> resident_, dense_;
  std::unique_ptr<OffloadAttentionBackend> offload_;
  std::vector<std::vector<int32_t>> tables_, tokens_;
  std::vector<int64_t> done_;
  int64_t hot_blocks_ = 0;
  int64_t graph_bucket_ = 0;
  int32_t scratch_ = -1;
  static constexpr float kBoost = 1.5f;
};

TEST(SparseOffload, QuestThroughTheSimulatedDeviceIsTheResidentPolicy) {
  for (bool per_head : {true, false}) {
    SCOPED_TRACE(per_head ? "per KV head" : "head-averaged");
    SparseOptions quest;
    quest.policy = SparsePolicyKind::kQuest;
    quest.budget_tokens = 64;
    quest.sink_tokens = 16;
    quest.window_tokens = 16;
    quest.per_head = per_head;
    ThreeBackends run(quest, {500, 333}, /*chunk=*/48, /*decodes=*/4, per_head ? 7 : 8);
    while (!run.prefill_step().empty()) {
    }
    for (int k = 0; k < 4; ++k) {
      const std::vector<Tensor> outs = run.decode_step();
      EXPECT_LT(max_diff(outs[1], outs[0]), 1e-5) << "decode step " << k << ": offload vs resident";
      EXPECT_GT(max_diff(outs[0], outs[2]), 1e-3) << "decode step " << k << ": quest vs dense";
    }
    EXPECT_GT(run.offload().sparse_host_bytes_read(), 0);
  }
}

TEST(SparseOffload, QuestOverFp8ThroughTheSimulatedDeviceIsTheResidentPolicy) {
  for (bool per_head : {true, false}) {
    SCOPED_TRACE(per_head ? "per KV head" : "head-averaged");
    SparseOptions quest;
    quest.policy = SparsePolicyKind::kQuest;
    quest.budget_tokens = 64;
    quest.sink_tokens = 16;
    quest.window_tokens = 16;
    quest.per_head = per_head;
    ThreeBackends run(quest, {500, 333}, /*chunk=*/48, /*decodes=*/6, per_head ? 9 : 10,
                      /*gpu_blocks=*/12, /*fp8=*/true);
    while (!run.prefill_step().empty()) {
    }
    for (int k = 0; k < 6; ++k) {
      const std::vector<Tensor> outs = run.decode_step();
      EXPECT_LT(max_diff(outs[1], outs[0]), 1e-5) << "decode step " << k << ": offload vs resident";
      EXPECT_GT(max_diff(outs[0], outs[2]), 1e-3) << "decode step " << k << ": quest vs dense";
    }
    EXPECT_GT(run.offload().sparse_host_bytes_read(), 0);
  }
}

// Decode steps shaped as a CUDA graph runs them (offload_backend.h): padded to a bucket of 4 in
// a scratch host block, the step's write-backs left to end_graph_step(). The real rows equal the
// resident policy's as eager offloaded steps do, over blocks that fill (write-backs) mid-way, bf16
// and FP8; a plan before end_graph_step() is refused, and so is a graph-shaped batch without a
// decode policy, and so is one after a replayed step (planned, no attend()) before its end.
TEST(SparseOffload, GraphShapedQuestStepsEqualTheResidentPolicy) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "f32");
    SparseOptions quest;
    quest.policy = SparsePolicyKind::kQuest;
    quest.budget_tokens = 64;
    quest.sink_tokens = 16;
    quest.window_tokens = 16;
    ThreeBackends run(quest, {500, 333, 90}, /*chunk=*/48, /*decodes=*/20, fp8 ? 21 : 22,
                      /*gpu_blocks=*/14, fp8);
    while (!run.prefill_step().empty()) {
    }
    run.set_graph_bucket(4);
    const int64_t written = run.offload().stats().blocks_written_back;
    for (int k = 0; k < 20; ++k) {
      const std::vector<Tensor> outs = run.decode_step();
      EXPECT_LT(max_diff(outs[1], outs[0]), 1e-5) << "decode step " << k << ": offload vs resident";
      EXPECT_GT(max_diff(outs[0], outs[2]), 1e-3) << "decode step " << k << ": quest vs dense";
    }
    EXPECT_GT(run.offload().stats().blocks_written_back, written) << "blocks filled mid-way";
    EXPECT_GT(run.offload().sparse_host_bytes_read(), 0);
  }

  OffloadDeviceConfig d;
  d.geometry = {1, kBlock, 16, 8, /*slots=*/2, /*slot blocks=*/3};
  d.num_qo_heads = kHq;
  d.num_kv_heads = kHkv;
  d.head_dim = kD;
  d.dtype = DType::kF32;
  d.sm_scale = 0.5f;
  d.max_tokens = 64;
  d.max_seqs = 4;
  ForwardBatch one;
  const int32_t id = 1;
  one.add_sequence(7, &id, 1, 0, true);
  one.block_table_indptr = {0, 1};
  one.block_tables = {0};
  one.slot_mapping = {0};
  const ForwardBatch padded = pad_decode_batch(one, 2, {15, kBlock});
  Tensor rows = Tensor::zeros({2, kHkv, kD}, DType::kF32),
         q = Tensor::zeros({2, kHq, kD}, DType::kF32);
  for (SparsePolicyKind kind : {SparsePolicyKind::kFull, SparsePolicyKind::kQuest}) {
    d.sparse.policy = kind;
    d.sparse.budget_tokens = 64;
    d.sparse.sink_tokens = 16;
    d.sparse.window_tokens = 16;
    OffloadAttentionBackend be(d.geometry, make_cpu_offload_device(d));
    if (kind == SparsePolicyKind::kFull) {
      try {
        be.plan(padded);
        ADD_FAILURE() << "a graph-shaped step without a decode policy was planned";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      }
      continue;
    }
    be.plan(padded);
    be.store_kv(0, rows, rows);
    be.attend(0, q);
    EXPECT_THROW(be.plan(padded), Error) << "planned before the graph step ended";
    be.end_graph_step();
    // A replay runs the graph's kernels, not attend(): the plan alone leaves the step open for
    // end_graph_step's write-backs.
    EXPECT_NO_THROW(be.plan(padded));
    EXPECT_THROW(be.plan(padded), Error) << "planned before the replayed step ended";
    be.end_graph_step();
    EXPECT_NO_THROW(be.plan(padded));
  }
}

// XAttention: every prefill chunk (decode rows of a finished sequence mixed in) through the
// offload device, which reads every host block's keys for the estimate and the values of the
// blocks the mask keeps only, must equal the resident policy's masked attention. Keys of every
// third block of 128 lean towards the queries; at threshold 0.6 the masks are sparse (outputs
// differ from dense, fewer host bytes read than at threshold 1, which keeps every block and equals
// dense attention).
TEST(SparseOffload, XAttentionThroughTheSimulatedDeviceIsTheResidentPolicy) {
  for (bool per_q_head : {false, true}) {
    SCOPED_TRACE(per_q_head ? "per q head" : "per KV head");
    int64_t host_bytes[2] = {0, 0};
    for (int keep_all = 0; keep_all < 2; ++keep_all) {
      SparseOptions x;
      x.policy = SparsePolicyKind::kXAttention;
      x.threshold = keep_all ? 1.0 : 0.6;
      x.stride = 8;
      x.xattn_per_kv_head = !per_q_head;
      x.xattn_dense_tail = 0;  // chunks of 160: a tail of 128 would take both query blocks
      x.xattn_min_len = 0;
      ThreeBackends run(x, {900, 420}, /*chunk=*/160, /*decodes=*/8, per_q_head ? 11 : 12,
                        /*gpu_blocks=*/24);
      run.set_hot_blocks(3);
      int steps = 0, sparse_steps = 0;
      for (std::vector<Tensor> outs; !(outs = run.prefill_step(/*decode_rest=*/true)).empty();) {
        EXPECT_LT(max_diff(outs[1], outs[0]), 1e-5) << "prefill step " << steps;
        if (keep_all) EXPECT_LT(max_diff(outs[1], outs[2]), 1e-5) << "prefill step " << steps;
        sparse_steps += max_diff(outs[0], outs[2]) > 1e-3;
        ++steps;
      }
      if (!keep_all) EXPECT_GE(sparse_steps, 2) << "of " << steps << " steps";
      const std::vector<Tensor> outs = run.decode_step();  // no selection: the ring path
      EXPECT_LT(max_diff(outs[1], outs[2]), 1e-5) << "decode after the prefill";
      host_bytes[keep_all] = run.offload().sparse_host_bytes_read();
    }
    EXPECT_GT(host_bytes[0], 0);
    EXPECT_LT(host_bytes[0], 0.9 * host_bytes[1]);
    std::printf("host bytes read: %lld at threshold 0.6, %lld at 1\n", (long long)host_bytes[0],
                (long long)host_bytes[1]);
  }
}

// The device factory builds a sparse reader beside the ring only under a policy that selects
// (none under full; over an FP8 cache quest's, and the others are refused by name), and the
// backend takes the reader's steps off the ring: under quest, prefill steps load host blocks
// through the ring, decode steps load none.
TEST(SparseOffload, TheReaderComesWithASelectingPolicyAndTakesItsStepsOffTheRing) {
  OffloadDeviceConfig d;
  d.geometry = {1, kBlock, 64, 12, /*slots=*/2, /*slot blocks=*/3};
  d.num_qo_heads = kHq;
  d.num_kv_heads = kHkv;
  d.head_dim = kD;
  d.dtype = DType::kF32;
  d.sm_scale = 0.5f;
  d.max_tokens = 64;
  d.max_seqs = 4;
  for (SparsePolicyKind kind : {SparsePolicyKind::kFull, SparsePolicyKind::kQuest,
                                SparsePolicyKind::kXAttention, SparsePolicyKind::kStreaming}) {
    SCOPED_TRACE(std::string(sparse_policy_name(kind)));
    d.sparse.policy = kind;
    const OffloadDeviceParts parts = make_cpu_offload_device(d);
    EXPECT_NE(parts.ring, nullptr);
    EXPECT_EQ(parts.sparse != nullptr, kind != SparsePolicyKind::kFull);
  }
  d.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  d.sparse.policy = SparsePolicyKind::kQuest;
  EXPECT_NE(make_cpu_offload_device(d).sparse, nullptr);
  for (SparsePolicyKind kind : {SparsePolicyKind::kXAttention, SparsePolicyKind::kStreaming}) {
    d.sparse.policy = kind;
    try {
      make_cpu_offload_device(d);
      ADD_FAILURE() << "a " << sparse_policy_name(kind) << " reader over an FP8 cache was built";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string(sparse_policy_name(kind))),
                std::string::npos)
          << e.what();
    }
  }

  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.budget_tokens = 64;
  quest.sink_tokens = 16;
  quest.window_tokens = 16;
  ThreeBackends run(quest, {500, 333}, /*chunk=*/48, /*decodes=*/3, 9);
  int64_t prefill_items = 0;
  while (!run.prefill_step().empty())
    prefill_items += static_cast<int64_t>(run.offload().last_plan().items.size());
  EXPECT_GT(prefill_items, 0) << "prefill chunks read earlier host blocks through the ring";
  const int64_t ring_blocks = run.offload().stats().ring_blocks_loaded;
  for (int k = 0; k < 3; ++k) {
    run.decode_step();
    EXPECT_TRUE(run.offload().last_plan().items.empty()) << "decode step " << k;
  }
  EXPECT_EQ(run.offload().stats().ring_blocks_loaded, ring_blocks);
  EXPECT_GT(run.offload().sparse_host_bytes_read(), 0);
}

}  // namespace
}  // namespace longctx::testing
