// Quest's page reuse across decode steps (SparseOptions::quest_reuse, docs/sparse.md) with CUDA
// graphs, resident and with KV offload: the eager steps with reuse equal those without bit for
// bit, the replays equal the eager forward of the padded batch with reuse, and the replays reuse
// what the eager steps do (graph_rigs.h: the rigs of test_cuda_graphs.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "engine/cuda_graphs.h"
#include "gpu_graphs/graph_rigs.h"

namespace longctx::testing {
namespace {

// Quest's page reuse across decode steps (--quest-reuse, docs/sparse.md) in graphs, resident:
// E eager without reuse, R eager with reuse (2 sequences keep pages), G graphs with reuse, P
// eager with reuse on the padded batch, over 40 decode steps whose batch changes mid-way
// (sequences 0, 1, 2, then 2 and 0: one leaves, the order changes). R == E bit for bit at every
// step (reuse is exact), G == P bit for bit, G == R when the batch is a bucket.
class QuestReuseGraphVsEager : public ::testing::TestWithParam<bool> {};

TEST_P(QuestReuseGraphVsEager, ReuseIsExactEagerAndInGraphs) {
  const bool fp8 = GetParam();
  std::shared_ptr<Model> model = load_model("qwen3-dummy");
  const ModelConfig& c = model->config();
  const int64_t bs = 128;
  const int steps = 40;
  const SparseOptions quest = graph_test_quest();
  SparseOptions reuse = quest;
  reuse.quest_reuse = true;
  reuse.quest_reuse_seqs = 2;
  const std::vector<int64_t> prompts = {630, 1000, 250};
  int64_t num_blocks = 2;
  for (int64_t len : prompts) num_blocks += (len + steps + bs - 1) / bs;
  Rig e(*model, num_blocks, bs, quest, fp8), r(*model, num_blocks, bs, reuse, fp8),
      g(*model, num_blocks, bs, reuse, fp8), p(*model, num_blocks, bs, reuse, fp8);
  DecodeGraphOptions opt;
  opt.max_num_seqs = kMaxSeqs;
  opt.scratch_block = g.scratch;
  opt.max_blocks = num_blocks + kMaxSeqs;
  DecodeGraphs graphs(*model, *g.attention, *g.pool, opt);
  graphs.capture();

  std::mt19937 rng(29);
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  std::vector<Seq> es = random_seqs(prompts, vocab, rng);
  std::vector<Seq> rs = es, gs = es, ps = es;
  const std::vector<size_t> all = {0, 1, 2};
  const std::pair<Rig*, std::vector<Seq>*> rigs[] = {{&e, &es}, {&r, &rs}, {&g, &gs}, {&p, &ps}};
  for (auto [rig, seqs] : rigs) {
    model->forward(make_batch(*seqs, all, *rig->pool), *rig->attention);
    advance(*seqs, all);
  }
  std::vector<int32_t> next(prompts.size());
  for (auto& t : next) t = int32_t(rng() % vocab);
  for (int step = 0; step < steps; ++step) {
    const std::vector<size_t> run = step < steps / 2 ? all : std::vector<size_t>{2, 0};
    const int64_t num = static_cast<int64_t>(run.size());
    for (auto [rig, seqs] : rigs)
      for (size_t i : run) (*seqs)[i].tokens.push_back(next[i]);
    Tensor eager = to_host(model->forward(make_batch(es, run, *e.pool), *e.attention));
    Tensor reused = to_host(model->forward(make_batch(rs, run, *r.pool), *r.attention));
    ForwardBatch gb = make_batch(gs, run, *g.pool);
    ASSERT_TRUE(graphs.can_run(gb));
    Tensor graph = to_host(graphs.run(gb));
    const int64_t bucket = pick_decode_bucket(graphs.buckets(), num);
    ForwardBatch pb = make_batch(ps, run, *p.pool);
    Tensor padded =
        to_host(model->forward(pad_decode_batch(pb, bucket, {p.scratch, bs}), *p.attention));
    for (auto [rig, seqs] : rigs) advance(*seqs, run);
    ASSERT_TRUE(rows_bit_equal(reused, eager, num))
        << "fp8 " << fp8 << " step " << step << ": reuse != no reuse (eager)";
    ASSERT_TRUE(rows_bit_equal(graph, padded, num))
        << "fp8 " << fp8 << " step " << step << ": replay != eager of the padded batch";
    if (bucket == num)
      ASSERT_TRUE(rows_bit_equal(graph, reused, num)) << "fp8 " << fp8 << " step " << step;
    for (int64_t i = 0; i < num; ++i) next[run[i]] = static_cast<int32_t>(argmax_row(eager, i));
  }
  std::printf("quest reuse graphs (fp8 %d): %d steps bitwise equal to no reuse\n", int(fp8), steps);
}

INSTANTIATE_TEST_SUITE_P(Kv, QuestReuseGraphVsEager, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "fp8" : "bf16"; });

// The same with KV offload (most pages on the host): E (no reuse), R (reuse), G (graphs, reuse),
// P (padded, reuse). R == E and G == P bit for bit at every step; pages are reused and R reads
// fewer host bytes than E.
class QuestReuseOffloadGraphVsEager : public ::testing::TestWithParam<bool> {};

TEST_P(QuestReuseOffloadGraphVsEager, ReuseIsExactAndReadsLessFromTheHost) {
  const bool fp8 = GetParam();
  std::shared_ptr<Model> model = load_model("qwen3-dummy");
  const ModelConfig& c = model->config();
  const int64_t bs = 128;
  const int steps = 40;
  const SparseOptions quest = graph_test_quest();
  SparseOptions reuse = quest;
  reuse.quest_reuse = true;
  reuse.quest_reuse_seqs = 2;
  const std::vector<int64_t> prompts = {630, 1000, 250};
  std::mt19937 rng(31);
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  std::vector<Seq> es = random_seqs(prompts, vocab, rng, bs, steps);
  const int64_t host_blocks = blocks_held(es) + 1;  // the last: the graphs' scratch block
  auto e = quest_offload(*model, quest, host_blocks, fp8);
  auto r = quest_offload(*model, reuse, host_blocks, fp8);
  auto g = quest_offload(*model, reuse, host_blocks, fp8);
  auto p = quest_offload(*model, reuse, host_blocks, fp8);
  DecodeGraphOptions opt;
  opt.max_num_seqs = 4;
  opt.scratch_block = static_cast<int32_t>(host_blocks - 1);
  DecodeGraphs graphs(*model, *g, DecodeGraphKv{bs, host_blocks}, opt);
  graphs.capture();

  std::vector<Seq> rs = es, gs = es, ps = es;
  const std::pair<OffloadAttentionBackend*, std::vector<Seq>*> rigs[] = {
      {e.get(), &es}, {r.get(), &rs}, {g.get(), &gs}, {p.get(), &ps}};
  for (auto [be, seqs] : rigs) prefill_host_chunks(*model, *be, *seqs, bs);
  const int64_t e_host = e->sparse_host_bytes_read(), r_host = r->sparse_host_bytes_read();
  std::vector<int32_t> next(prompts.size());
  for (auto& t : next) t = int32_t(rng() % vocab);
  for (int step = 0; step < steps; ++step) {
    // 3 sequences (bucket 4: padded) for the first half, then 2, 0 (a bucket; 1 left).
    const std::vector<size_t> run =
        step < steps / 2 ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{2, 0};
    for (auto [be, seqs] : rigs)
      for (size_t i : run) (*seqs)[i].tokens.push_back(next[i]);
    const int64_t num = static_cast<int64_t>(run.size());
    const int64_t bucket = pick_decode_bucket(graphs.buckets(), num);
    Tensor eager = to_host(model->forward(host_batch(es, run, bs), *e));
    Tensor reused = to_host(model->forward(host_batch(rs, run, bs), *r));
    ForwardBatch gb = host_batch(gs, run, bs);
    ASSERT_TRUE(graphs.can_run(gb));
    Tensor graph = to_host(graphs.run(gb));
    Tensor padded = to_host(model->forward(
        pad_decode_batch(host_batch(ps, run, bs), bucket, {opt.scratch_block, bs}), *p));
    p->end_graph_step();
    for (auto [be, seqs] : rigs)
      for (size_t i : run) (*seqs)[i].cached = static_cast<int64_t>((*seqs)[i].tokens.size());
    ASSERT_TRUE(rows_bit_equal(reused, eager, num))
        << "fp8 " << fp8 << " step " << step << ": reuse != no reuse (eager)";
    ASSERT_TRUE(rows_bit_equal(graph, padded, num))
        << "fp8 " << fp8 << " step " << step << ": replay != eager of the padded batch";
    if (bucket == num) ASSERT_TRUE(rows_bit_equal(graph, reused, num)) << "step " << step;
    for (int64_t i = 0; i < num; ++i) next[run[i]] = static_cast<int32_t>(argmax_row(eager, i));
  }
  EXPECT_GT(r->sparse_pages_reused(), 0);
  EXPECT_EQ(g->sparse_pages_reused(), p->sparse_pages_reused()) << "the replays reuse as eager";
  EXPECT_LT(r->sparse_host_bytes_read() - r_host, e->sparse_host_bytes_read() - e_host);
  std::printf(
      "quest reuse offload graphs (fp8 %d): %lld (page, KV head) pairs reused; host pages read "
      "%.2f MB with reuse, %.2f MB without\n",
      int(fp8), (long long)r->sparse_pages_reused(), (r->sparse_host_bytes_read() - r_host) / 1e6,
      (e->sparse_host_bytes_read() - e_host) / 1e6);
}

INSTANTIATE_TEST_SUITE_P(Kv, QuestReuseOffloadGraphVsEager, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "fp8" : "bf16"; });

}  // namespace
}  // namespace longctx::testing
