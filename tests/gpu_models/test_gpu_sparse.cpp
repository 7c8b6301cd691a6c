// Quest's GPU decode (attention_backends/quest_cuda.h) through the two paged backends, on random
// K / V / q written by the backends' own store_kv over prefill chunks:
//   - the resident pool's output equals a CPU reference: the metadata and selection by the CPU
//     kernels (kernels/cpu/quest_cpu.h) from the pool's keys, then attention over the selected
//     keys in fp32 (keys and queries are small integers, so every score is exact and the
//     selections cannot part on rounding);
//   - the offload device (a GPU cache much smaller than the context, host pages read in place)
//     gives the resident output bit for bit: the same pages gathered into the same buffer;
//   - a budget that covers the context gives the dense backend's output;
//   - the engine generates with quest, resident and offloaded, and releases every block.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "attention/backends/offload_backend.h"
#include "attention/backends/paged_backend.h"
#include "common/test_data.h"
#include "engine/step_batch.h"
#include "kernels/cpu/quest_cpu.h"
#include "kv/paged_kv_pool.h"
#include "longctx/core/error.h"
#include "longctx/engine/sampling_params.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

struct Geometry {
  int64_t block_size = 64, hq = 8, hkv = 2, d = 128;
  SparseOptions quest;
  std::vector<int64_t> lens = {1500, 777};
  int64_t chunk = 256;
  Geometry() {
    quest.policy = SparsePolicyKind::kQuest;
    quest.page_tokens = 16;
    quest.budget_tokens = 256;
    quest.sink_tokens = 16;
    quest.window_tokens = 32;
  }
};

Tensor random_tensor(int64_t t, int64_t h, int64_t d, std::mt19937& rng, bool integer) {
  Tensor x = Tensor::empty({t, h, d}, DType::kF32);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = integer ? float(int(rng() % 5) - 2) : n01(rng);
  return x.to_dtype(DType::kBF16).to(Device::cuda(0));
}

// Runs the same steps through every backend: prefill chunks of both sequences, then `decodes`
// decode steps; returns each backend's decode outputs (host f32 [T, hq * d] per step).
struct Runs {
  std::vector<std::vector<Tensor>> outputs;  // [backend][decode step]
  std::vector<ForwardBatch> decode_batches;
  std::vector<Tensor> decode_q;
};

Runs run_steps(const Geometry& g, std::vector<AttentionBackend*> backends, int decodes,
               uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t bs = g.block_size, n = static_cast<int64_t>(g.lens.size());
  std::vector<std::vector<int32_t>> tables(n), tokens(n);
  int32_t next = 0;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t blocks = (g.lens[s] + decodes + bs - 1) / bs;
    for (int64_t b = 0; b < blocks; ++b) tables[s].push_back(next++);
    tokens[s].assign(g.lens[s] + decodes, 1);
  }
  Runs r;
  r.outputs.resize(backends.size());
  auto step = [&](const std::vector<StepInput>& in, bool keep) {
    ForwardBatch batch = make_forward_batch(in, bs);
    const int64_t t = batch.num_tokens();
    Tensor k = random_tensor(t, g.hkv, g.d, rng, true),
           v = random_tensor(t, g.hkv, g.d, rng, false);
    Tensor q = random_tensor(t, g.hq, g.d, rng, true);
    for (size_t i = 0; i < backends.size(); ++i) {
      backends[i]->plan(batch);
      backends[i]->store_kv(0, k, v);
      Tensor o = backends[i]->attend(0, q);
      if (keep) r.outputs[i].push_back(o.to(Device::cpu()).to_dtype(DType::kF32));
    }
    if (keep) {
      r.decode_batches.push_back(batch);
      r.decode_q.push_back(q.to(Device::cpu()).to_dtype(DType::kF32));
    }
  };
  std::vector<int64_t> done(n, 0);
  for (bool more = true; more;) {
    more = false;
    for (int64_t s = 0; s < n; ++s) {
      if (done[s] >= g.lens[s]) continue;
      const int64_t m = std::min(g.chunk, g.lens[s] - done[s]);
      step({StepInput{uint64_t(s), tokens[s], done[s], m, tables[s], true}}, false);
      done[s] += m;
      more = true;
    }
  }
  for (int k = 0; k < decodes; ++k) {
    std::vector<StepInput> in;
    for (int64_t s = 0; s < n; ++s)
      in.push_back({uint64_t(s), tokens[s], done[s]++, 1, tables[s], true});
    step(in, true);
  }
  return r;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// The CPU reference of one decode step over the resident pool's keys (layer 0).
Tensor reference_decode(const Geometry& g, const PagedKVPool& pool, const ForwardBatch& batch,
                        const Tensor& q) {
  const int64_t bs = g.block_size, page = g.quest.page_tokens, ppb = bs / page, d = g.d;
  const int64_t row = g.hkv * d, group = g.hq / g.hkv;
  const Tensor k = pool.k(0).to(Device::cpu()).to_dtype(DType::kF32);
  const Tensor v = pool.v(0).to(Device::cpu()).to_dtype(DType::kF32);
  const int64_t nblocks = pool.num_blocks();
  std::vector<float> meta(nblocks * ppb * row * 2);
  std::vector<int32_t> pages;
  for (int64_t s = 0; s < batch.num_seqs(); ++s)
    for (int64_t j = 0; j * page < batch.kv_lens[s]; ++j) {
      const int32_t blk = batch.block_tables[batch.block_table_indptr[s] + j / ppb];
      pages.insert(pages.end(), {blk, blk, int32_t(j % ppb),
                                 int32_t(std::min<int64_t>(page, batch.kv_lens[s] - j * page))});
    }
  kernels::QuestMetaParams m;
  m.k_cache = k.data<float>();
  m.block_stride = bs * row;
  m.meta = meta.data();
  m.pages = pages.data();
  m.num_pages = int(pages.size() / 4);
  m.num_kv_heads = int(g.hkv);
  m.head_dim = int(d);
  m.page_tokens = int(page);
  m.pages_per_block = int(ppb);
  m.dtype = DType::kF32;
  kernels::cpu::quest_meta_update(m);
  kernels::QuestBudget b{int(page), int(g.quest.budget_tokens), int(g.quest.sink_tokens),
                         int(g.quest.window_tokens)};
  const int max_sel = kernels::quest_max_selected(b);
  int max_pages = 0;
  for (int32_t kv : batch.kv_lens)
    max_pages = std::max<int>(max_pages, int((kv + page - 1) / page));
  std::vector<int32_t> sel(batch.num_seqs() * g.hkv * max_sel);
  kernels::QuestSelectParams p;
  p.q = q.data<float>();
  p.meta = meta.data();
  p.block_indptr = batch.block_table_indptr.data();
  p.block_tables = batch.block_tables.data();
  p.kv_lens = batch.kv_lens.data();
  p.selected = sel.data();
  p.batch = int(batch.num_seqs());
  p.num_qo_heads = int(g.hq);
  p.num_kv_heads = int(g.hkv);
  p.head_dim = int(d);
  p.pages_per_block = int(ppb);
  p.max_pages = max_pages;
  p.max_selected = max_sel;
  p.budget = b;
  p.per_head = g.quest.per_head;
  p.dtype = DType::kF32;
  kernels::cpu::quest_select(p);
  Tensor out = Tensor::zeros({batch.num_seqs(), g.hq * d}, DType::kF32);
  const float scale = 1.f / std::sqrt(float(d));
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    const kernels::QuestCount c = kernels::quest_count(batch.kv_lens[s], b);
    for (int64_t qh = 0; qh < g.hq; ++qh) {
      const int64_t h = qh / group;
      std::vector<int64_t> keys;
      for (int i = 0; i < c.num_selected; ++i) {
        const int64_t pg = sel[(s * g.hkv + h) * max_sel + i];
        for (int64_t t = pg * page; t < std::min<int64_t>((pg + 1) * page, batch.kv_lens[s]); ++t)
          keys.push_back(int64_t(batch.block_tables[batch.block_table_indptr[s] + t / bs]) * bs +
                         t % bs);
      }
      std::vector<double> logit(keys.size());
      double mx = -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i)
          dot += double(q.data<float>()[(s * g.hq + qh) * d + i]) *
                 k.data<float>()[keys[j] * row + h * d + i];
        logit[j] = dot * scale;
        mx = std::max(mx, logit[j]);
      }
      double sum = 0;
      for (double& l : logit) sum += (l = std::exp(l - mx));
      for (int64_t i = 0; i < d; ++i) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j)
          o += logit[j] * v.data<float>()[keys[j] * row + h * d + i];
        out.data<float>()[s * g.hq * d + qh * d + i] = float(o / sum);
      }
    }
  }
  return out;
}

void check_geometry(const Geometry& g, int decodes) {
  SCOPED_TRACE(::testing::Message() << "block " << g.block_size << " hq " << g.hq << " hkv "
                                    << g.hkv << " d " << g.d << " budget " << g.quest.budget_tokens
                                    << (g.quest.per_head ? " per-head" : " averaged"));
  int64_t blocks = 0;
  for (int64_t len : g.lens) blocks += (len + decodes + g.block_size - 1) / g.block_size;
  PagedKVPoolConfig kv{1, g.hkv, g.d, g.block_size, blocks + 2, DType::kBF16, Device::cuda(0)};
  PagedKVPool pool(kv), dense_pool(kv);
  PagedBackendLimits limits{g.chunk * 4, 8, 4 * blocks, 8192};
  const float scale = 1.f / std::sqrt(float(g.d));
  auto resident = make_paged_attention_backend(pool, g.hq, scale, limits, g.quest);
  auto dense = make_paged_attention_backend(dense_pool, g.hq, scale, limits);
  OffloadDeviceConfig d;
  d.geometry = {1, g.block_size, blocks + 2, 4 * g.chunk / g.block_size + 4, 2, 3};
  d.num_qo_heads = g.hq;
  d.num_kv_heads = g.hkv;
  d.head_dim = g.d;
  d.sm_scale = scale;
  d.device = Device::cuda(0);
  d.max_tokens = g.chunk * 4;
  d.max_seqs = 8;
  d.sparse = g.quest;
  d.max_model_len = 8192;
  OffloadAttentionBackend offload(d.geometry, make_cuda_offload_device(d));
  Runs r = run_steps(g, {resident.get(), &offload, dense.get()}, decodes, 17);
  for (int k = 0; k < decodes; ++k) {
    const Tensor ref = reference_decode(g, pool, r.decode_batches[k], r.decode_q[k]);
    // The pool holds the keys of every step so far; the reference reads only those the step's
    // kv_lens cover, so it is exact for the last step and for earlier ones alike.
    EXPECT_LT(max_abs_diff(r.outputs[0][k], ref), 2e-2) << "decode step " << k << " vs reference";
    EXPECT_EQ(max_abs_diff(r.outputs[1][k], r.outputs[0][k]), 0.0)
        << "decode step " << k << ": offload vs resident";
  }
  // Most of the context is on the host: the gathers read host pages in place.
  EXPECT_GT(offload.sparse_host_bytes_read(), 0);
  // Quest read fewer keys than the dense backend: their outputs differ.
  EXPECT_GT(max_abs_diff(r.outputs[0][0], r.outputs[2][0]), 1e-3);
}

TEST(GpuSparse, QuestDecodeMatchesTheReferenceAndOffloadMatchesResident) {
  Geometry g;  // Llama-like heads (the split-KV decode kernel)
  check_geometry(g, 3);
  g.quest.per_head = false;
  check_geometry(g, 2);
  Geometry n;  // the needle model's heads, pages of 8 in blocks of 32
  n.block_size = 32, n.hq = 4, n.hkv = 2, n.d = 64;
  n.quest.page_tokens = 8;
  n.quest.budget_tokens = 200;
  n.lens = {2000, 333, 901};
  check_geometry(n, 2);
  Geometry odd;  // head_dim 32: the generic kernel over the compact buffer
  odd.d = 32, odd.hq = 4, odd.hkv = 1, odd.block_size = 16;
  odd.quest.page_tokens = 16;
  odd.lens = {1234};
  check_geometry(odd, 2);
}

TEST(GpuSparse, CoveringBudgetIsTheDenseOutput) {
  Geometry g;
  g.quest.budget_tokens = 4096;  // more than any context here
  int64_t blocks = 0;
  for (int64_t len : g.lens) blocks += (len + 2 + g.block_size - 1) / g.block_size;
  PagedKVPoolConfig kv{1, g.hkv, g.d, g.block_size, blocks + 2, DType::kBF16, Device::cuda(0)};
  PagedKVPool pool(kv), dense_pool(kv);
  PagedBackendLimits limits{g.chunk * 4, 8, 4 * blocks, 8192};
  const float scale = 1.f / std::sqrt(float(g.d));
  auto quest = make_paged_attention_backend(pool, g.hq, scale, limits, g.quest);
  auto dense = make_paged_attention_backend(dense_pool, g.hq, scale, limits);
  Runs r = run_steps(g, {quest.get(), dense.get()}, 2, 5);
  for (int k = 0; k < 2; ++k) {
    const double diff = max_abs_diff(r.outputs[0][k], r.outputs[1][k]);
    std::printf("  covering budget, decode step %d: max |quest - dense| = %g\n", k, diff);
    EXPECT_LT(diff, 1e-2);
  }
}

// The engine tests' quest over the needle model: pages of 8, a 384-token budget, 6 sequences of
// chunks of 512; offloaded, a GPU cache of a step's blocks and `host_blocks` host blocks of 48 KiB
// (the needle model's block of 32 tokens, every layer).
EngineConfig quest_engine_config(bool offload, int64_t host_blocks) {
  EngineConfig c;
  c.model = longctx::testing::needle_v1_dir();
  c.device = "cuda";
  c.max_model_len = 4096;
  c.block_size = 32;
  c.max_num_batched_tokens = 512;
  c.max_num_seqs = 6;
  c.sparse.policy = SparsePolicyKind::kQuest;
  c.sparse.page_tokens = 8;
  c.sparse.budget_tokens = 384;
  c.sparse.sink_tokens = 16;
  c.sparse.window_tokens = 64;
  c.kv_offload = offload;
  if (offload) {
    c.num_gpu_blocks = 512 / 32 + 2 * 6 + 4;
    c.host_kv_budget = host_blocks * 49152;
    c.offload_slots = 3;
    c.offload_slot_tokens = 128;
  } else {
    c.num_gpu_blocks = 1024;
  }
  return c;
}

// The engine with quest (prefix caching, chunked prefill, preemption under a tight cache),
// resident and offloaded: every request finishes; the offloaded tokens follow the resident ones
// until a near tie (offload's prefill merges partial attentions in another order, so its keys
// differ in the last bits).
TEST(GpuSparse, EngineGeneratesWithQuestResidentAndOffloaded) {
  auto config = [](bool offload) { return quest_engine_config(offload, 300); };
  std::mt19937 rng(3);
  std::vector<Prompt> ps;
  std::vector<int32_t> shared(900);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 2000);
  for (int i = 0; i < 8; ++i) {
    auto p = shared;
    p.resize(200 + 150 * i);
    for (int k = 0, n = 50 + rng() % 400; k < n; ++k)
      p.push_back(static_cast<int32_t>(rng() % 2000));
    ps.emplace_back(p);
  }
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 32;
  sp.ignore_eos = true;
  LLM resident(config(false));
  const auto ref = resident.generate(ps, sp, false);
  LLM off(config(true));
  const auto got = off.generate(ps, sp, false);
  size_t same = 0, total = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(ref[i].token_ids.size(), 32u);
    ASSERT_EQ(got[i].token_ids.size(), 32u);
    size_t k = 0;
    while (k < 32 && ref[i].token_ids[k] == got[i].token_ids[k]) ++k;
    same += k;
    total += 32;
  }
  std::printf("quest engine: offloaded %zu of %zu tokens equal the resident run's\n", same, total);
  EXPECT_GE(same * 10, total * 8);
}

// Quest's decode steps from CUDA graphs (the runner captures them under quest, resident and
// offloaded) generate the eager run's greedy tokens, bf16 and FP8 KV: 8 prompts over 6 sequences
// a step, so the batches run padded (5, 3) and unpadded (6, 4, 2, 1) graphs and cross pages and
// blocks as they decode; offloaded, most pages are read from the host and filled blocks are
// written back after each replay.
TEST(GpuSparse, QuestDecodeGraphsGenerateTheEagerTokens) {
  for (bool offload : {false, true}) {
    for (bool fp8 : {false, true}) {
      auto config = [&](bool eager) {
        // 600 host blocks: no preemption, so both runs batch alike
        EngineConfig c = quest_engine_config(offload, 600);
        c.enforce_eager = eager;
        c.kv_cache_dtype = fp8 ? KvCacheDtype::kFP8 : KvCacheDtype::kBF16;
        return c;
      };
      std::mt19937 rng(5);
      std::vector<Prompt> ps;
      for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> p(300 + 170 * i);
        for (auto& t : p) t = static_cast<int32_t>(rng() % 2000);
        ps.emplace_back(p);
      }
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = 40;
      sp.ignore_eos = true;
      std::vector<RequestOutput> ref, got;
      {
        LLM eager(config(true));
        ref = eager.generate(ps, sp, false);
      }
      {
        LLM graphs(config(false));
        got = graphs.generate(ps, sp, false);
      }
      size_t same = 0, total = 0;
      for (size_t i = 0; i < ps.size(); ++i) {
        ASSERT_EQ(ref[i].token_ids.size(), 40u);
        ASSERT_EQ(got[i].token_ids.size(), 40u);
        size_t k = 0;
        while (k < 40 && ref[i].token_ids[k] == got[i].token_ids[k]) ++k;
        same += k;
        total += 40;
      }
      std::printf("quest decode graphs (%s, fp8 %d): %zu of %zu tokens equal the eager run's\n",
                  offload ? "offloaded" : "resident", int(fp8), same, total);
      EXPECT_EQ(same, total) << (offload ? "offloaded" : "resident") << " fp8 " << fp8;
    }
  }
}

// Quest's page reuse across decode steps in the engine (prefix caching, chunked prefill, decode
// graphs; offloaded under a tight host pool: preemption and recompute): the tokens of the run
// without reuse, every one of them (the outputs are bit for bit those without reuse).
TEST(GpuSparse, QuestReuseGeneratesTheTokensWithoutReuse) {
  for (bool offload : {false, true}) {
    for (bool fp8 : {false, true}) {
      auto config = [&](bool reuse) {
        EngineConfig c = quest_engine_config(offload, 300);
        c.kv_cache_dtype = fp8 ? KvCacheDtype::kFP8 : KvCacheDtype::kBF16;
        c.sparse.quest_reuse = reuse;
        c.sparse.quest_reuse_seqs = 3;
        return c;
      };
      std::mt19937 rng(7);
      std::vector<Prompt> ps;
      std::vector<int32_t> shared(600);
      for (auto& t : shared) t = static_cast<int32_t>(rng() % 2000);
      for (int i = 0; i < 8; ++i) {
        auto p = shared;
        p.resize(200 + 100 * i);
        for (int k = 0, n = 50 + rng() % 400; k < n; ++k)
          p.push_back(static_cast<int32_t>(rng() % 2000));
        ps.emplace_back(p);
      }
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = 40;
      sp.ignore_eos = true;
      std::vector<RequestOutput> ref, got;
      {
        LLM plain(config(false));
        ref = plain.generate(ps, sp, false);
      }
      {
        LLM reuse(config(true));
        got = reuse.generate(ps, sp, false);
      }
      for (size_t i = 0; i < ps.size(); ++i)
        EXPECT_EQ(got[i].token_ids, ref[i].token_ids)
            << (offload ? "offloaded" : "resident") << " fp8 " << fp8 << " prompt " << i;
    }
  }
}

}  // namespace
}  // namespace longctx::testing
