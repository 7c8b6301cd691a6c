// Quest's page reuse across decode steps (SparseOptions::quest_reuse, docs/sparse.md) on the CPU:
// the same random steps through four backends, the resident CPU backend and the offload backend
// over the simulated device, each with reuse off and on. Outputs with reuse are bitwise those
// without over many decode steps of a changing batch (prefix-cached blocks, sequences joining,
// finishing, preempted and recomputed, a block table entry changed under a kept page), f32 and
// FP8 (pages of half a block: a later row may raise the block's scale and re-encode a full page),
// eager and shaped as CUDA graphs run them; pages are reused, and fewer host bytes are read.
// A sequence decoding twice with the same query reuses every page it kept but the partial last.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "attention/sparse/page_reuse.h"
#include "attention/sparse/sparse_policy.h"
#include "engine/cuda_graphs.h"
#include "engine/step_batch.h"
#include "kernels/quest_params.h"
#include "kv/paged_kv_pool.h"

namespace longctx::testing {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 8, kLayers = 2, kBlocks = 120;

SparseOptions quest_options(bool reuse) {
  SparseOptions o;
  o.policy = SparsePolicyKind::kQuest;
  o.budget_tokens = 96;
  o.sink_tokens = 16;
  o.window_tokens = 16;
  o.page_tokens = 16;
  o.quest_reuse = reuse;
  o.quest_reuse_seqs = 2;
  return o;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Backends 0 / 1: resident, reuse off / on; 2 / 3: offloaded (a GPU cache of gpu_blocks,
// write-backs two steps late), reuse off / on. Every step writes the same random K / V / q
// (kLayers layers) through all four.
class ReuseRig {
 public:
  ReuseRig(int64_t block_size, bool fp8, int64_t gpu_blocks, int seed, int64_t reuse_seqs = 2)
      : bs_(block_size), rng_(seed) {
    const float scale = 0.5f;
    PagedKVPoolConfig kv{kLayers, kHkv, kD, bs_, kBlocks + 1, DType::kF32, Device::cpu()};
    if (fp8) {
      kv.dtype = DType::kFP8E4M3;
      kv.fp8_source_dtype = DType::kF32;
    }
    for (bool reuse : {false, true}) {
      SparseOptions o = quest_options(reuse);
      o.quest_reuse_seqs = reuse_seqs;
      pools_.push_back(std::make_unique<PagedKVPool>(kv));
      policies_.push_back(
          sparse::make_sparse_policy(o, {kLayers, kBlocks + 1, bs_, kHq, kHkv, kD, scale}));
      backends_.push_back(
          std::make_unique<CpuPagedBackend>(*pools_.back(), scale, policies_.back().get()));
    }
    for (bool reuse : {false, true}) {
      OffloadDeviceConfig d;
      d.geometry = {kLayers, bs_, kBlocks + 1, gpu_blocks, /*slots=*/2, /*slot blocks=*/3};
      d.num_qo_heads = kHq;
      d.num_kv_heads = kHkv;
      d.head_dim = kD;
      d.dtype = DType::kF32;
      d.sm_scale = scale;
      d.max_tokens = 256;
      d.max_seqs = 4;
      d.cpu_write_back_lag = 2;
      d.sparse = quest_options(reuse);
      d.sparse.quest_reuse_seqs = reuse_seqs;
      if (fp8) d.kv_format = kernels::KvCacheFormat::kFp8E4M3;
      auto be = std::make_unique<OffloadAttentionBackend>(d.geometry, make_cpu_offload_device(d));
      offload_.push_back(be.get());
      backends_.push_back(std::move(be));
    }
  }

  // Fresh block ids (the last one, kBlocks, is the graph-shaped steps' scratch block).
  std::vector<int32_t> blocks(int64_t n) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(next_block_++);
    EXPECT_LE(next_block_, kBlocks);
    return ids;
  }
  void set_graph_bucket(int64_t bucket) { graph_bucket_ = bucket; }
  // The next steps' queries are these rows again (null: random).
  void set_fixed_q(const Tensor* q) { fixed_q_ = q; }

  // One step through the four backends; checks reuse on against off, bitwise, on every layer.
  void step(const std::vector<StepInput>& in) {
    const ForwardBatch batch = make_forward_batch(in, bs_);
    const int64_t t = batch.num_tokens();
    bool decode = true;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) decode = decode && batch.q_len(s) == 1;
    std::vector<Tensor> k, v, q;
    for (int64_t l = 0; l < kLayers; ++l) {
      k.push_back(random_rows(t, kHkv));
      // Every fifth decode step's keys are 4096 times larger: over FP8 their block's scale jumps,
      // re-encoding the block's earlier rows, whose small codes lose bits (a page of such a block
      // that was full already changes).
      if (decode && steps_ % 5 == 3)
        for (int64_t i = 0; i < k.back().numel(); ++i) k.back().data<float>()[i] *= 4096.f;
      v.push_back(random_rows(t, kHkv));
      q.push_back(fixed_q_ != nullptr ? fixed_q_->slice(0, l * t, (l + 1) * t).contiguous()
                                      : random_rows(t, kHq));
    }
    last_q_ = Tensor::empty({kLayers * t, kHq, kD}, DType::kF32);
    for (int64_t l = 0; l < kLayers; ++l)
      std::memcpy(last_q_.data<float>() + l * t * kHq * kD, q[l].data_ptr(), q[l].nbytes());
    std::vector<std::vector<Tensor>> outs(backends_.size());
    for (size_t i = 0; i < backends_.size(); ++i) {
      AttentionBackend& be = *backends_[i];
      const bool graph = i >= 2 && graph_bucket_ > 0 && decode;
      const ForwardBatch padded =
          graph ? pad_decode_batch(batch, graph_bucket_, {kBlocks, bs_}) : ForwardBatch{};
      be.plan(graph ? padded : batch);
      for (int64_t l = 0; l < kLayers; ++l) {
        be.store_kv(l, graph ? pad(k[l]) : k[l], graph ? pad(v[l]) : v[l]);
        outs[i].push_back(graph ? be.attend(l, pad(q[l])).slice(0, 0, t).contiguous()
                                : be.attend(l, q[l]));
      }
      if (graph) be.end_graph_step();
    }
    for (int64_t l = 0; l < kLayers; ++l) {
      EXPECT_TRUE(bitwise_equal(outs[0][l], outs[1][l]))
          << "resident, step " << steps_ << " layer " << l << ": reuse on differs from off";
      EXPECT_TRUE(bitwise_equal(outs[2][l], outs[3][l]))
          << "offloaded, step " << steps_ << " layer " << l << ": reuse on differs from off";
    }
    ++steps_;
  }

  const Tensor& last_q() const { return last_q_; }
  int64_t resident_reused() const { return policies_[1]->page_reuse()->reused_pages(); }
  int64_t offload_reused() const { return offload_[1]->sparse_pages_reused(); }
  int64_t host_bytes(bool reuse) const { return offload_[reuse ? 1 : 0]->sparse_host_bytes_read(); }
  int64_t block_size() const { return bs_; }

 private:
  Tensor random_rows(int64_t t, int64_t h) {
    Tensor x = Tensor::empty({t, h, kD}, DType::kF32);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n01(rng_);
    return x;
  }
  Tensor pad(const Tensor& x) const {
    Tensor p = Tensor::zeros({graph_bucket_, x.size(1), x.size(2)}, DType::kF32);
    std::memcpy(p.data_ptr(), x.data_ptr(), x.nbytes());
    return p;
  }

  int64_t bs_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<PagedKVPool>> pools_;
  std::vector<std::unique_ptr<sparse::SparsePolicy>> policies_;
  std::vector<std::unique_ptr<AttentionBackend>> backends_;
  std::vector<OffloadAttentionBackend*> offload_;
  int32_t next_block_ = 0;
  int64_t graph_bucket_ = 0;
  const Tensor* fixed_q_ = nullptr;
  Tensor last_q_;
  int64_t steps_ = 0;
};

// A sequence of the script: its tokens (ids do not matter), its block table and how many of its
// tokens are in its KV.
struct Seq {
  uint64_t id = 0;
  std::vector<int32_t> tokens, table;
  int64_t done = 0, prompt = 0;
  StepInput next(int64_t n) {
    StepInput in{id, tokens, done, n, table, true};
    done += n;
    return in;
  }
  StepInput chunk(int64_t max) { return next(std::min(max, prompt - done)); }
  bool prefilling() const { return done < prompt; }
};

Seq make_seq(ReuseRig& rig, uint64_t id, int64_t prompt, int64_t total,
             std::vector<int32_t> shared = {}, int64_t cached = 0) {
  Seq s;
  s.id = id;
  s.prompt = prompt;
  s.tokens.assign(static_cast<size_t>(total), 1);
  s.table = std::move(shared);
  const int64_t need = (total + rig.block_size() - 1) / rig.block_size();
  const std::vector<int32_t> fresh = rig.blocks(need - static_cast<int64_t>(s.table.size()));
  s.table.insert(s.table.end(), fresh.begin(), fresh.end());
  s.done = cached;
  return s;
}

// The script: A's prompt; B's, sharing A's first blocks (prefix-cached), with A decoding in the
// same steps; both decode; C joins (its prefill chunks beside the others' decode rows); all
// decode; A finishes; B is recomputed, decodes, sits out, comes back; D prefills a block that
// then replaces C's first block (its sink page, read every step) in C's table.
void run_script(ReuseRig& rig) {
  constexpr int64_t kChunk = 64;
  Seq a = make_seq(rig, 1, 400, 460);
  while (a.prefilling()) rig.step({a.chunk(kChunk)});
  const int64_t shared_blocks = 160 / rig.block_size();
  Seq b = make_seq(rig, 2, 300, 380,
                   std::vector<int32_t>(a.table.begin(), a.table.begin() + shared_blocks), 160);
  while (b.prefilling()) rig.step({b.chunk(kChunk), a.next(1)});
  for (int k = 0; k < 6; ++k) rig.step({a.next(1), b.next(1)});
  Seq c = make_seq(rig, 3, 250, 330);
  while (c.prefilling()) rig.step({a.next(1), c.chunk(kChunk), b.next(1)});
  for (int k = 0; k < 6; ++k) rig.step({c.next(1), a.next(1), b.next(1)});  // new order
  for (int k = 0; k < 4; ++k) rig.step({b.next(1), c.next(1)});             // A finished
  // B recomputed from its first token into the same block ids, in the steps right after its
  // decode steps (only dropping its pages at a prefill step keeps it from reusing old rows).
  b.prompt = b.done;
  b.done = 0;
  while (b.prefilling()) rig.step({c.next(1), b.chunk(kChunk)});
  for (int k = 0; k < 5; ++k) rig.step({b.next(1), c.next(1)});
  for (int k = 0; k < 2; ++k) rig.step({c.next(1)});  // B swapped out, then back
  for (int k = 0; k < 3; ++k) rig.step({b.next(1), c.next(1)});
  Seq d = make_seq(rig, 4, rig.block_size(), rig.block_size());
  rig.step({d.chunk(kChunk), b.next(1), c.next(1)});
  for (int k = 0; k < 2; ++k) rig.step({b.next(1), c.next(1)});
  c.table[0] = d.table[0];  // C's table entry under kept pages changed: those are read again
  for (int k = 0; k < 4; ++k) rig.step({b.next(1), c.next(1)});
}

TEST(QuestReuse, OutputsAreThoseWithoutReuseAcrossAChangingBatch) {
  for (bool fp8 : {false, true})
    for (bool graph : {false, true}) {
      SCOPED_TRACE(std::string(fp8 ? "fp8" : "f32") + (graph ? ", graph-shaped" : ", eager"));
      ReuseRig rig(/*block_size=*/32, fp8, /*gpu_blocks=*/10, fp8 ? 5 : 6);
      if (graph) rig.set_graph_bucket(4);
      run_script(rig);
      // (More on the resident backend: it selects the decode rows of mixed steps too, which the
      // offload reader leaves to the ring, so its sequences keep pages over them.)
      EXPECT_GT(rig.offload_reused(), 0);
      EXPECT_GT(rig.resident_reused(), rig.offload_reused());
      EXPECT_GT(rig.host_bytes(false), 0);
      EXPECT_LT(rig.host_bytes(true), rig.host_bytes(false));
    }
}

// The same query twice (the second step's new key lands in the same partial last page, the
// window's pages stay): the same pages are selected and every one of them is copied from the kept
// ones but the partial last page, which is resident with offload: no host page is read.
TEST(QuestReuse, AnUnchangedQueryReusesEveryPageButTheLast) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "f32");
    ReuseRig rig(/*block_size=*/32, fp8, /*gpu_blocks=*/6, 11, /*reuse_seqs=*/1);
    Seq a = make_seq(rig, 1, 298, 320);
    while (a.prefilling()) rig.step({a.chunk(64)});
    rig.step({a.next(1)});  // kv_len 299: a full selection kept
    const Tensor q = rig.last_q().contiguous();
    const int64_t reused = rig.resident_reused(), offload_reused = rig.offload_reused();
    const int64_t host = rig.host_bytes(true);
    rig.set_fixed_q(&q);
    rig.step({a.next(1)});  // kv_len 300: the same page 18 is the partial last
    const kernels::QuestCount c = kernels::quest_count(300, kernels::QuestBudget{16, 96, 16, 16});
    ASSERT_FALSE(c.all);
    EXPECT_EQ(rig.resident_reused() - reused, kLayers * kHkv * (c.num_selected - 1));
    EXPECT_EQ(rig.offload_reused() - offload_reused, kLayers * kHkv * (c.num_selected - 1));
    EXPECT_EQ(rig.host_bytes(true), host) << "every host page came from the kept ones";
    EXPECT_GT(rig.host_bytes(false), rig.host_bytes(true));
  }
}

// Only the first quest_reuse_seqs sequences of a step keep pages; a sequence that decodes on past
// that rank loses them, one batched into a prefill step too.
TEST(QuestReuse, OnlyTheFirstSequencesOfAStepKeepPages) {
  ReuseRig rig(/*block_size=*/16, /*fp8=*/false, /*gpu_blocks=*/12, 21, /*reuse_seqs=*/1);
  Seq a = make_seq(rig, 1, 200, 230), b = make_seq(rig, 2, 200, 230);
  while (a.prefilling()) rig.step({a.chunk(64), b.chunk(64)});
  rig.step({b.next(1), a.next(1)});
  rig.step({b.next(1), a.next(1)});
  const int64_t after_b = rig.resident_reused();
  EXPECT_GT(after_b, 0) << "B, first, reused its pages";
  rig.step({a.next(1), b.next(1)});
  EXPECT_EQ(rig.resident_reused(), after_b) << "A kept nothing (second), B is second now";
  rig.step({a.next(1), b.next(1)});
  EXPECT_GT(rig.resident_reused(), after_b) << "A, first for two steps, reused";
  EXPECT_EQ(rig.offload_reused(), rig.resident_reused());
}

}  // namespace
}  // namespace longctx::testing
