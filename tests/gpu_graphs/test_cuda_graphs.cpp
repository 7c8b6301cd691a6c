// CUDA graphs for decode (src/engine/cuda_graphs.h) against the eager forward, on the tiny
// transformers fixtures (head_dim 16 / 32: the generic paged kernel; 64: split-KV decode),
// models/needle v1 (tests/data/needle_v1) and a 4-layer dummy Qwen3-0.6B (head_dim 128, long
// contexts that split). Three copies of the same KV pool run the same steps: E eager on the batch,
// G graph replay, P eager on the padded batch G replays. Checked, at every step of 24+ decode steps
// with 1, 3, 8 and 17 sequences of lengths across block boundaries (the set of sequences changes
// mid-way):
//   - G == P bit for bit (the replay is the eager forward of the padded batch);
//   - G == E bit for bit when the batch size is a bucket (no padding); otherwise within bf16
//     tolerance (the real rows' GEMMs run with the bucket's row count; whether cuBLASLt's other
//     algorithm changed any bit is printed);
//   - afterwards: every real block of G equals P's and every KV byte that no real token owns
//     (free blocks, the unwritten tail of each last block) still holds the fill pattern: padding
//     writes only the scratch block;
//   - an eager tensor kept alive across replays is untouched (the graphs' private memory).
// Quest's decode steps in graphs (QuestGraphVsEager, resident; QuestOffloadGraphVsEager, KV
// offload): the replay equals the eager forward of the padded batch bit for bit, and the eager
// forward of the batch when it is a bucket (with page reuse: test_quest_reuse_graphs.cpp).
// Plus the decode kernel's graph mode directly, bad batches, and the memory estimate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cuda_graphs.h"
#include "gpu_graphs/graph_rigs.h"
#include "kernels/cuda/decode.h"
#include "kv/paged_kv_pool.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::testing {
namespace {

struct GraphCase {
  std::string name;
  int64_t block_size;
  int64_t max_prompt;  // prompt lengths go up to about this
};

class GraphVsEager : public ::testing::TestWithParam<GraphCase> {};

TEST_P(GraphVsEager, ReplayEqualsEagerOverManySteps) {
  const GraphCase gc = GetParam();
  std::shared_ptr<Model> model = load_model(gc.name);
  const ModelConfig& c = model->config();
  const int64_t bs = gc.block_size;
  const int steps = 24;
  // Prompt lengths around block boundaries (1, bs - 1, bs, bs + 1, ...) and some long ones.
  auto prompt_len = [&](int64_t i) {
    const int64_t pick[] = {1,          bs - 1,        bs,         bs + 1,
                            2 * bs - 2, gc.max_prompt, 3 * bs + 5, gc.max_prompt / 2 + 7};
    return std::max<int64_t>(1, pick[i % 8] + i / 8);
  };
  int64_t num_blocks = 2;  // the scratch block and one spare
  for (int64_t i = 0; i < 17; ++i) num_blocks += (prompt_len(i) + steps + bs - 1) / bs;
  Rig e(*model, num_blocks, bs), g(*model, num_blocks, bs), p(*model, num_blocks, bs);
  DecodeGraphOptions opt;
  opt.max_num_seqs = kMaxSeqs;
  opt.scratch_block = g.scratch;
  opt.max_blocks = num_blocks + kMaxSeqs;
  DecodeGraphs graphs(*model, *g.attention, *g.pool, opt);
  graphs.capture();
  EXPECT_EQ(graphs.buckets(), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_LE(graphs.memory_bytes(), decode_graph_memory_bytes(c, kMaxSeqs));
  std::printf("%s: captured %zu graphs in %.2f s, %.1f MiB\n", gc.name.c_str(),
              graphs.buckets().size(), graphs.capture_seconds(), graphs.memory_bytes() / 1048576.0);

  std::mt19937 rng(11);
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  int64_t not_bitwise_steps = 0, padded_steps = 0;
  std::vector<char> owned(num_blocks * bs, 0);  // slots a real token's K/V went to (any case)
  double worst = 0;
  for (int64_t num : {1, 3, 8, 17}) {
    std::vector<Seq> es(num), gs, ps;
    for (int64_t i = 0; i < num; ++i)
      for (int64_t j = 0; j < prompt_len(i); ++j) es[i].tokens.push_back(int32_t(rng() % vocab));
    gs = es;
    ps = es;
    std::vector<size_t> all(num);
    std::iota(all.begin(), all.end(), 0);
    // Prefill: the same eager batch in all three.
    for (auto [rig, seqs] : {std::pair{&e, &es}, {&g, &gs}, {&p, &ps}}) {
      model->forward(make_batch(*seqs, all, *rig->pool), *rig->attention);
      advance(*seqs, all);
    }
    for (int step = 0; step < steps; ++step) {
      // Mid-way the first sequence finishes (17 -> 16: a bucket; 3 -> 2; 8 -> 7).
      std::vector<size_t> run = all;
      if (num > 1 && step >= steps / 2) run.erase(run.begin());
      for (size_t i : run) {
        const int32_t t = int32_t(rng() % vocab);
        es[i].tokens.push_back(t);
        gs[i].tokens.push_back(t);
        ps[i].tokens.push_back(t);
      }
      ForwardBatch eb = make_batch(es, run, *e.pool);
      ForwardBatch gb = make_batch(gs, run, *g.pool);
      ForwardBatch pb = make_batch(ps, run, *p.pool);
      ASSERT_EQ(eb.block_tables, gb.block_tables);
      ASSERT_TRUE(graphs.can_run(gb));
      Tensor eager_dev = model->forward(eb, *e.attention);
      Tensor eager = to_host(eager_dev);
      Tensor graph = to_host(graphs.run(gb));
      const int64_t s = static_cast<int64_t>(run.size());
      const int64_t bucket = pick_decode_bucket(graphs.buckets(), s);
      Tensor padded =
          to_host(model->forward(pad_decode_batch(pb, bucket, {p.scratch, bs}), *p.attention));
      advance(es, run);
      advance(gs, run);
      advance(ps, run);
      ASSERT_EQ(graph.shape(), (Shape{s, c.vocab_size}));
      // The eager output kept alive across the replay: untouched by the graph's intermediates.
      EXPECT_TRUE(rows_bit_equal(to_host(eager_dev), eager, s)) << "step " << step;
      ASSERT_TRUE(rows_bit_equal(graph, padded, s))
          << gc.name << " S=" << s << " step " << step << ": replay != eager of the padded batch";
      if (bucket == s) {
        ASSERT_TRUE(rows_bit_equal(graph, eager, s))
            << gc.name << " S=" << s << " step " << step << ": replay != eager (no padding)";
      } else {
        ++padded_steps;
        double max_abs = 0;
        const double d = rows_max_diff(graph, eager, s, &max_abs);
        worst = std::max(worst, d);
        not_bitwise_steps += d > 0;
        // bf16 activations: another GEMM algorithm rounds a few values one bf16 ulp apart.
        EXPECT_LE(d, 0.02 * std::max(1.0, max_abs)) << "S=" << s << " step " << step;
      }
    }
    // KV: every real block equals the padded eager run's, and no byte outside the real tokens'
    // slots (and the scratch block) was written.
    for (const Seq& sq : gs)
      for (int64_t j = 0; j < sq.cached; ++j) owned[sq.blocks[j / bs] * bs + j % bs] = 1;
    const int64_t row_elems = c.num_key_value_heads * c.head_dim;
    const std::vector<uint16_t> fill_row(row_elems, kFill);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      for (bool is_k : {true, false}) {
        Tensor gk = to_host(is_k ? g.pool->k(l) : g.pool->v(l));
        Tensor pk = to_host(is_k ? p.pool->k(l) : p.pool->v(l));
        const auto* gd = static_cast<const uint16_t*>(gk.data_ptr());
        const auto* pd = static_cast<const uint16_t*>(pk.data_ptr());
        for (int64_t slot = 0; slot < num_blocks * bs; ++slot) {
          if (slot / bs == g.scratch) continue;
          const uint16_t* a = gd + slot * row_elems;
          const uint16_t* b = pd + slot * row_elems;
          if (owned[slot])
            ASSERT_EQ(std::memcmp(a, b, row_elems * 2), 0) << "layer " << l << " slot " << slot;
          else
            ASSERT_EQ(std::memcmp(a, fill_row.data(), row_elems * 2), 0)
                << "layer " << l << " slot " << slot << " (no real token's) was written";
        }
      }
    }
    for (auto [rig, seqs] : {std::pair{&e, &es}, {&g, &gs}, {&p, &ps}})
      for (Seq& sq : *seqs) rig->pool->free(sq.blocks);
  }
  std::printf(
      "%s: %lld padded steps, %lld not bit-identical to the unpadded eager (max |d| %.3g); "
      "%lld decode-grid updates\n",
      gc.name.c_str(), (long long)padded_steps, (long long)not_bitwise_steps, worst,
      (long long)graphs.grid_updates());
}

INSTANTIATE_TEST_SUITE_P(Models, GraphVsEager,
                         ::testing::Values(GraphCase{"tiny-llama3", 16, 300},
                                           GraphCase{"tiny-qwen2", 16, 300},
                                           GraphCase{"tiny-qwen3", 16, 300},
                                           GraphCase{"needle", 128, 3000},
                                           GraphCase{"qwen3-dummy", 128, 5000}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Quest's decode steps replayed from graphs (attention/backends/quest_cuda.h) on the dummy
// Qwen3 (head_dim 128: the compact split-KV decode, or the generic kernel), bf16 and FP8 pools:
// rigs E (eager, the batch), G (graph), P (eager, the padded batch G replays) and D (dense eager,
// to see that the replays select). 40 decode steps of 1 and 3 sequences whose lengths cross a page
// every 16 steps, a block (640, 1024) and the budget (250 -> 290 keys: every page, then a
// selection).
//   - G == P bit for bit at every step; G == E bit for bit when the batch is a bucket (else
//     within bf16 tolerance) and the greedy tokens of G and E agree;
//   - G differs from D at some step (the replays read the selected pages, not every page).
class QuestGraphVsEager : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(QuestGraphVsEager, ReplayEqualsEagerAndSelects) {
  const auto [fp8, generic] = GetParam();
  kernels::KernelTuning tuning;
  if (generic) tuning.attention = kernels::AttentionKernel::kGeneric;
  std::shared_ptr<Model> model = load_model("qwen3-dummy");
  const ModelConfig& c = model->config();
  const int64_t bs = 128;
  const int steps = 40;
  const SparseOptions quest = graph_test_quest();
  const std::vector<int64_t> prompts = {630, 1000, 250};
  int64_t num_blocks = 2;
  for (int64_t len : prompts) num_blocks += (len + steps + bs - 1) / bs;
  Rig e(*model, num_blocks, bs, quest, fp8, tuning), g(*model, num_blocks, bs, quest, fp8, tuning),
      p(*model, num_blocks, bs, quest, fp8, tuning), d(*model, num_blocks, bs, {}, fp8, tuning);
  DecodeGraphOptions opt;
  opt.max_num_seqs = kMaxSeqs;
  opt.scratch_block = g.scratch;
  opt.max_blocks = num_blocks + kMaxSeqs;
  DecodeGraphs graphs(*model, *g.attention, *g.pool, opt);
  graphs.capture();

  std::mt19937 rng(17);
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  int64_t differs_from_dense = 0, padded_steps = 0, not_bitwise = 0;
  for (int64_t num : {1, 3}) {
    std::vector<Seq> es(num);
    for (int64_t i = 0; i < num; ++i)
      for (int64_t j = 0; j < prompts[i]; ++j) es[i].tokens.push_back(int32_t(rng() % vocab));
    std::vector<Seq> gs = es, ps = es, ds = es;
    std::vector<size_t> all(num);
    std::iota(all.begin(), all.end(), 0);
    const std::pair<Rig*, std::vector<Seq>*> rigs[] = {{&e, &es}, {&g, &gs}, {&p, &ps}, {&d, &ds}};
    for (auto [rig, seqs] : rigs) {
      model->forward(make_batch(*seqs, all, *rig->pool), *rig->attention);
      advance(*seqs, all);
    }
    std::vector<int32_t> next(num);
    for (int64_t i = 0; i < num; ++i) next[i] = int32_t(rng() % vocab);
    for (int step = 0; step < steps; ++step) {
      for (auto [rig, seqs] : rigs)
        for (size_t i : all) (*seqs)[i].tokens.push_back(next[i]);
      ForwardBatch eb = make_batch(es, all, *e.pool);
      ForwardBatch gb = make_batch(gs, all, *g.pool);
      ForwardBatch pb = make_batch(ps, all, *p.pool);
      ForwardBatch db = make_batch(ds, all, *d.pool);
      ASSERT_TRUE(graphs.can_run(gb));
      Tensor eager = to_host(model->forward(eb, *e.attention));
      Tensor graph = to_host(graphs.run(gb));
      const int64_t bucket = pick_decode_bucket(graphs.buckets(), num);
      Tensor padded =
          to_host(model->forward(pad_decode_batch(pb, bucket, {p.scratch, bs}), *p.attention));
      Tensor dense = to_host(model->forward(db, *d.attention));
      for (auto [rig, seqs] : rigs) advance(*seqs, all);
      ASSERT_TRUE(rows_bit_equal(graph, padded, num))
          << "fp8 " << fp8 << " S=" << num << " step " << step
          << ": replay != eager of the padded batch";
      if (bucket == num) {
        ASSERT_TRUE(rows_bit_equal(graph, eager, num))
            << "fp8 " << fp8 << " S=" << num << " step " << step << ": replay != eager";
      } else {
        ++padded_steps;
        double max_abs = 0;
        const double diff = rows_max_diff(graph, eager, num, &max_abs);
        not_bitwise += diff > 0;
        EXPECT_LE(diff, 0.02 * std::max(1.0, max_abs)) << "S=" << num << " step " << step;
      }
      differs_from_dense += !rows_bit_equal(graph, dense, num);
      for (int64_t i = 0; i < num; ++i) {
        EXPECT_EQ(argmax_row(graph, i), argmax_row(eager, i))
            << "fp8 " << fp8 << " S=" << num << " step " << step << " sequence " << i;
        next[i] = static_cast<int32_t>(argmax_row(graph, i));
      }
    }
    for (auto [rig, seqs] : rigs)
      for (Seq& sq : *seqs) rig->pool->free(sq.blocks);
  }
  EXPECT_GT(differs_from_dense, 0) << "the replays read every page: quest did not select";
  std::printf(
      "quest graphs (fp8 %d, generic %d): %lld of %d steps differ from dense; %lld padded "
      "steps, %lld not bit-identical to the unpadded eager; %lld decode-grid updates\n",
      int(fp8), int(generic), (long long)differs_from_dense, 2 * steps, (long long)padded_steps,
      (long long)not_bitwise, (long long)graphs.grid_updates());
}

INSTANTIATE_TEST_SUITE_P(KvAndKernel, QuestGraphVsEager,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "fp8" : "bf16") +
                                  (std::get<1>(info.param) ? "_generic" : "_split_kv");
                         });

// The same with KV offload (offload_backend.h, "CUDA graphs"): three offload backends E (eager,
// the batch), G (graphs over DecodeGraphKv, the host pool's last block as scratch) and P (eager,
// the padded batch, ended by end_graph_step as G's replays are) over a GPU cache of 8 blocks, so
// most pages are read from the host in place and filled blocks are written back between replays.
// G == P bit for bit at every step, G == E when the batch is a bucket, greedy tokens equal.
class QuestOffloadGraphVsEager : public ::testing::TestWithParam<bool> {};

TEST_P(QuestOffloadGraphVsEager, ReplayEqualsEager) {
  const bool fp8 = GetParam();
  std::shared_ptr<Model> model = load_model("qwen3-dummy");
  const ModelConfig& c = model->config();
  const int64_t bs = 128;
  const int steps = 40;
  const SparseOptions quest = graph_test_quest();
  const std::vector<int64_t> prompts = {630, 1000, 250};
  std::mt19937 rng(23);
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  std::vector<Seq> es = random_seqs(prompts, vocab, rng, bs, steps);
  const int64_t host_blocks = blocks_held(es) + 1;  // the last: the graphs' scratch block
  auto e = quest_offload(*model, quest, host_blocks, fp8);
  auto g = quest_offload(*model, quest, host_blocks, fp8);
  auto p = quest_offload(*model, quest, host_blocks, fp8);
  DecodeGraphOptions opt;
  opt.max_num_seqs = 4;
  opt.scratch_block = static_cast<int32_t>(host_blocks - 1);
  DecodeGraphs graphs(*model, *g, DecodeGraphKv{bs, host_blocks}, opt);
  graphs.capture();
  EXPECT_EQ(graphs.buckets(), (std::vector<int64_t>{1, 2, 4}));

  // Prefill one sequence at a time in chunks of 512 (the GPU cache holds a step's blocks).
  std::vector<Seq> gs = es, ps = es;
  const std::pair<AttentionBackend*, std::vector<Seq>*> rigs[] = {
      {e.get(), &es}, {g.get(), &gs}, {p.get(), &ps}};
  for (auto [be, seqs] : rigs) prefill_host_chunks(*model, *be, *seqs, bs);
  int64_t padded_steps = 0, not_bitwise = 0;
  std::vector<int32_t> next(prompts.size());
  for (auto& t : next) t = int32_t(rng() % vocab);
  for (int step = 0; step < steps; ++step) {
    // 3 sequences (bucket 4: padded) for the first half, then 2 (a bucket).
    std::vector<size_t> run = {0, 1, 2};
    if (step >= steps / 2) run = {1, 2};
    for (auto [be, seqs] : rigs)
      for (size_t i : run) (*seqs)[i].tokens.push_back(next[i]);
    const int64_t num = static_cast<int64_t>(run.size());
    const int64_t bucket = pick_decode_bucket(graphs.buckets(), num);
    Tensor eager = to_host(model->forward(host_batch(es, run, bs), *e));
    ForwardBatch gb = host_batch(gs, run, bs);
    ASSERT_TRUE(graphs.can_run(gb));
    Tensor graph = to_host(graphs.run(gb));
    Tensor padded = to_host(model->forward(
        pad_decode_batch(host_batch(ps, run, bs), bucket, {opt.scratch_block, bs}), *p));
    p->end_graph_step();
    for (auto [be, seqs] : rigs)
      for (size_t i : run) (*seqs)[i].cached = static_cast<int64_t>((*seqs)[i].tokens.size());
    ASSERT_TRUE(rows_bit_equal(graph, padded, num))
        << "fp8 " << fp8 << " step " << step << ": replay != eager of the padded batch";
    if (bucket == num) {
      ASSERT_TRUE(rows_bit_equal(graph, eager, num)) << "fp8 " << fp8 << " step " << step;
    } else {
      ++padded_steps;
      double max_abs = 0;
      const double diff = rows_max_diff(graph, eager, num, &max_abs);
      not_bitwise += diff > 0;
      EXPECT_LE(diff, 0.02 * std::max(1.0, max_abs)) << "step " << step;
    }
    for (int64_t r = 0; r < num; ++r) {
      EXPECT_EQ(argmax_row(graph, r), argmax_row(eager, r)) << "step " << step << " row " << r;
      next[run[r]] = static_cast<int32_t>(argmax_row(graph, r));
    }
  }
  EXPECT_GT(g->sparse_host_bytes_read(), 0) << "no page was read from the host";
  EXPECT_GT(g->stats().blocks_written_back, 0);
  std::printf(
      "quest offload graphs (fp8 %d): %lld padded steps, %lld not bit-identical to the unpadded "
      "eager; %lld decode-grid updates; %.2f MB of host pages read\n",
      int(fp8), (long long)padded_steps, (long long)not_bitwise, (long long)graphs.grid_updates(),
      g->sparse_host_bytes_read() / 1e6);
}

INSTANTIATE_TEST_SUITE_P(Kv, QuestOffloadGraphVsEager, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "fp8" : "bf16"; });

// decode_plan's graph mode on the kernel alone: padding requests do not change the real ones'
// split (bit-identical outputs), each adds one work item, and padding rows are finite.
TEST(DecodeGraphMode, PaddingKeepsTheRealSplit) {
  const int hq = 32, hkv = 8, d = 128, page = 16;
  const std::vector<int32_t> real = {5000, 37, 1, 2049};
  const int pad = 3, batch = int(real.size()) + pad;
  std::vector<int32_t> kv_indptr = {0}, last, indices;
  int32_t next = 0;
  for (int i = 0; i < batch; ++i) {
    const int32_t len = i < int(real.size()) ? real[i] : 1;
    const int32_t pages = (len + page - 1) / page;
    for (int32_t j = 0; j < pages; ++j) indices.push_back(next++);
    kv_indptr.push_back(int32_t(indices.size()));
    last.push_back((len - 1) % page + 1);
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  auto random_bf16 = [&](int64_t n) {
    std::vector<uint16_t> b(n);
    for (uint16_t& x : b) {
      const float f = nd(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = uint16_t(u >> 16);  // bf16 by truncation: fine for test data
    }
    return Tensor::from_blob(b.data(), {n}, DType::kBF16).to(Device::cuda(0));
  };
  Tensor q = random_bf16(int64_t(batch) * hq * d);
  Tensor k = random_bf16(int64_t(next) * page * hkv * d);
  Tensor v = random_bf16(int64_t(next) * page * hkv * d);
  auto dev_i32 = [](std::vector<int32_t> x) {
    return Tensor::from_blob(x.data(), {int64_t(x.size())}, DType::kI32).to(Device::cuda(0));
  };
  Tensor d_indptr = dev_i32(kv_indptr), d_indices = dev_i32(indices), d_last = dev_i32(last);
  auto run = [&](int n, kernels::cuda::DecodeGraphMode mode, kernels::cuda::DecodePlan* plan_out) {
    const size_t ws = kernels::cuda::decode_workspace_bytes(n, hq, hkv, d);
    Tensor w = Tensor::empty({int64_t(ws)}, DType::kU8, Device::cuda(0));
    Tensor o = Tensor::empty({int64_t(n) * hq * d}, DType::kBF16, Device::cuda(0));
    cudaStream_t s = static_cast<cudaStream_t>(current_stream(0));
    kernels::cuda::DecodePlan plan = kernels::cuda::decode_plan(
        kv_indptr.data(), last.data(), n, page, hq, hkv, d, w.data_ptr(), ws, s, 0, 256, mode);
    kernels::DecodeParams p;
    p.q = q.data_ptr();
    p.k_cache = k.data_ptr();
    p.v_cache = v.data_ptr();
    p.o = o.data_ptr();
    p.kv_indptr = d_indptr.data<int32_t>();
    p.kv_indices = d_indices.data<int32_t>();
    p.kv_last_page_len = d_last.data<int32_t>();
    p.batch_size = n;
    p.num_qo_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.page_size = page;
    p.dtype = DType::kBF16;
    p.sm_scale = 1.f / std::sqrt(float(d));
    kernels::cuda::decode_run(p, plan, s);
    *plan_out = plan;
    return to_host(o);
  };
  kernels::cuda::DecodePlan alone, padded;
  Tensor a = run(int(real.size()), {}, &alone);
  Tensor b = run(batch, {pad}, &padded);
  EXPECT_EQ(alone.chunk_tokens, padded.chunk_tokens);
  EXPECT_GT(alone.num_partials, 0) << "the long request should split";
  EXPECT_EQ(alone.num_partials, padded.num_partials);
  EXPECT_EQ(padded.num_work_items, alone.num_work_items + pad);
  EXPECT_EQ(kernels::cuda::decode_grid_ctas(padded), int64_t(padded.num_work_items) * hkv);
  EXPECT_FALSE(kernels::cuda::is_decode_kernel(nullptr));
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
  const auto* pb = static_cast<const uint16_t*>(b.data_ptr());
  for (int64_t i = int64_t(real.size()) * hq * d; i < b.numel(); ++i)
    ASSERT_NE(pb[i] & 0x7f80, 0x7f80) << "padding row element " << i << " not finite";
}

TEST(DecodeGraphsErrors, BadBatchesAreRefusedClearly) {
  std::shared_ptr<Model> model = load_model("tiny-qwen3");
  Rig g(*model, 64, 16);
  DecodeGraphOptions opt;
  opt.buckets = {1, 2, 4};
  opt.max_num_seqs = kMaxSeqs;
  opt.scratch_block = g.scratch;
  DecodeGraphs graphs(*model, *g.attention, *g.pool, opt);
  std::vector<Seq> seqs(5);
  for (Seq& s : seqs) s.tokens = {1, 2, 3};
  std::vector<size_t> two = {0, 1};
  ForwardBatch prefill = make_batch(seqs, two, *g.pool);
  EXPECT_FALSE(graphs.can_run(prefill));  // not captured yet
  EXPECT_THROW(graphs.run(prefill), Error);
  graphs.capture();
  auto expect_refused = [&](const ForwardBatch& b, const char* what) {
    EXPECT_FALSE(graphs.can_run(b)) << what;
    try {
      graphs.run(b);
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
      std::printf("%s: %s\n", what, e.what());
    }
  };
  expect_refused(prefill, "prefill batch");
  model->forward(prefill, *g.attention);
  advance(seqs, two);
  std::vector<size_t> five = {0, 1, 2, 3, 4};
  for (size_t i : {2, 3, 4}) seqs[i].cached = 0;
  model->forward(make_batch(seqs, {2, 3, 4}, *g.pool), *g.attention);
  advance(seqs, five);
  for (Seq& s : seqs) s.tokens.push_back(7);
  ForwardBatch too_many = make_batch(seqs, five, *g.pool);
  expect_refused(too_many, "5 sequences, buckets up to 4");
  ForwardBatch ok = make_batch(seqs, two, *g.pool);
  EXPECT_TRUE(graphs.can_run(ok));
  ForwardBatch bad = ok;
  bad.block_tables[0] = g.scratch;
  expect_refused(bad, "scratch block in a table");
  bad = ok;
  bad.logits_indices = {1};
  expect_refused(bad, "one logits row of two");
  bad = ok;
  bad.input_ids[1] = static_cast<int32_t>(model->config().vocab_size);
  EXPECT_THROW(graphs.run(bad), Error);  // the model's validation, before any replay
  // Still fine afterwards.
  Tensor l = to_host(graphs.run(ok));
  for (int64_t i = 0; i < l.numel(); ++i) ASSERT_TRUE(std::isfinite(l.data<float>()[i]));
}

}  // namespace
}  // namespace longctx::testing
