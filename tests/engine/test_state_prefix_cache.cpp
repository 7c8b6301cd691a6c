// Prefix caching of a state model through the engine: tiny-qwen3-next (three Gated DeltaNet
// layers, one full-attention layer) with its linear-attention states snapshotted at block
// boundaries (BlockManager, state snapshots). A prompt that shares a cached prefix starts from
// the snapshot and gives the greedy tokens of an engine without prefix caching, with logits
// within the chunked delta rule's rounding (tests/models/test_fixture_models.cpp: 2e-3), for
// chunk sizes that do and do not align with blocks and hits at several boundaries; an evicted
// snapshot's prompt misses and stays correct; preemption and abort leave no block, state slot or
// snapshot held; a batch equals each request alone; a second turn starts from the state a decode
// step saved inside the first turn's answer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine_test_util.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

constexpr int64_t kBlock = 8;
constexpr float kTol = 2e-3f;
constexpr int64_t kMaxTokens = 6;

std::shared_ptr<Model> tiny_next() {
  static auto ck = std::make_shared<const Checkpoint>(
      load_checkpoint(testing::test_data_dir() + "/fixtures/tiny-qwen3-next"));
  return create_model(ck);
}

struct Result {
  std::vector<int32_t> tokens;
  int64_t num_cached = 0;
  FinishReason reason = FinishReason::kNone;
  std::map<int64_t, std::vector<float>> rows;  // position -> logits
};

class Engine {
 public:
  Engine(int64_t budget, bool caching, int64_t num_blocks = 96,
         int64_t snapshots = kDefaultStateSnapshots) {
    CpuExecutorOptions eo;
    eo.block_size = kBlock;
    eo.num_blocks = num_blocks;
    eo.max_state_seqs = 4;
    eo.max_state_snapshots = snapshots;
    auto rec = std::make_unique<testing::RecordingExecutor>(make_cpu_executor(tiny_next(), eo));
    rec_ = rec.get();
    core_ = std::make_unique<EngineCore>(std::move(rec), nullptr,
                                         testing::core_options(budget, 4, caching));
  }
  EngineCore& core() { return *core_; }

  // Runs the prompts, added together, to their end (`on_step(step)` after each step); results in
  // prompt order. Every block-manager invariant holds after each step.
  std::vector<Result> run(const std::vector<std::vector<int32_t>>& prompts,
                          const std::function<void(int64_t)>& on_step = {}) {
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i)
      ids.push_back(core_->add_request(i, prompts[i], testing::greedy(kMaxTokens), 0));
    for (int64_t step = 0; core_->has_unfinished(); ++step) {
      core_->step();
      core_->check_consistency();
      if (on_step) on_step(step);
    }
    std::vector<Result> out(prompts.size());
    for (RequestOutput& o : core_->take_finished()) {
      Result& r = out[o.index];
      r.tokens = o.token_ids;
      r.num_cached = o.metrics.num_cached_tokens;
      r.reason = o.finish_reason;
      for (const auto& [key, row] : rec_->rows)
        if (key.first == ids[o.index]) r.rows[key.second] = row.back();
    }
    const EngineStats st = core_->stats();
    EXPECT_EQ(st.kv_blocks_used, 0);
    for (int64_t used : st.kv_group_blocks_used) EXPECT_EQ(used, 0);  // blocks and state slots
    return out;
  }

 private:
  std::unique_ptr<EngineCore> core_;
  testing::RecordingExecutor* rec_ = nullptr;
};

// Greedy tokens equal and every logits row both recorded within kTol.
void expect_same(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  int64_t compared = 0;
  for (const auto& [pos, row] : a.rows) {
    auto it = b.rows.find(pos);
    if (it == b.rows.end()) continue;
    float diff = 0;
    for (size_t v = 0; v < row.size(); ++v) diff = std::max(diff, std::abs(row[v] - it->second[v]));
    EXPECT_LT(diff, kTol) << what << " position " << pos;
    ++compared;
  }
  EXPECT_EQ(compared, kMaxTokens) << what;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 512);  // the fixture's vocabulary
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class StatePrefixCache : public ::testing::TestWithParam<int64_t> {};

// A 41-token document; R1 = doc + 7 (48 tokens); R2 = R1 + its answer + 5 (a second turn); R3
// and R4 = doc + other questions. Each runs alone, one after the other, with and without prefix
// caching, at a step budget of 13 (chunks cut back to 8, 16, ...), 16 (chunks of whole blocks)
// or 256 (whole prompts: the last boundary first, then the tail).
TEST_P(StatePrefixCache, HitsAtSeveralBoundariesMatchNoCaching) {
  const int64_t budget = GetParam();
  Engine on(budget, true), off(budget, false);
  std::mt19937 rng(5);
  const std::vector<int32_t> doc = random_tokens(rng, 41);
  const std::vector<int32_t> r1 = concat(doc, random_tokens(rng, 7));
  const Result a1 = on.run({r1})[0];
  expect_same(a1, off.run({r1})[0], "R1");
  EXPECT_EQ(a1.num_cached, 0);
  const std::vector<int32_t> r2 = concat(concat(r1, a1.tokens), random_tokens(rng, 5));
  const std::vector<int32_t> r3 = concat(doc, random_tokens(rng, 9));
  const std::vector<int32_t> r4 = concat(doc, random_tokens(rng, 11));
  std::vector<Result> hit, miss;
  for (const auto* p : {&r2, &r3, &r4}) {
    hit.push_back(on.run({*p})[0]);
    miss.push_back(off.run({*p})[0]);
    expect_same(hit.back(), miss.back(), "prompt of " + std::to_string(p->size()) + " tokens");
    EXPECT_EQ(miss.back().num_cached, 0);
  }
  // R2 starts from R1's last boundary (48). R3 from the doc's last cached boundary with a
  // snapshot: 40 where a chunk ended there (budget 13), 32 (budget 16), none (256: R1 saved 48
  // only); its first chunk then ends at 40, where the doc's blocks end, so R4 starts there.
  EXPECT_EQ(hit[0].num_cached, 48);
  EXPECT_EQ(hit[1].num_cached, budget == 13 ? 40 : budget == 16 ? 32 : 0);
  EXPECT_EQ(hit[2].num_cached, 40);
  const EngineStats st = on.core().stats();
  EXPECT_EQ(st.prefix_cache_hits, hit[0].num_cached + hit[1].num_cached + hit[2].num_cached);
  EXPECT_EQ(st.state_snapshot_restores, budget == 256 ? 2 : 3);
  // The executor's copies (/metrics' longctx:state_snapshots_*): one restore for each hit, a
  // save for each snapshot taken, every copy one slot's bytes.
  EXPECT_EQ(st.executor.state_snapshots_restored, st.state_snapshot_restores);
  EXPECT_GE(st.executor.state_snapshots_saved, st.state_snapshots_held);
  EXPECT_GT(st.executor.state_snapshots_saved, 0);
  EXPECT_EQ(st.executor.state_snapshot_bytes %
                (st.executor.state_snapshots_saved + st.executor.state_snapshots_restored),
            0);
  EXPECT_GT(st.executor.state_snapshot_bytes, 0);
  EXPECT_EQ(off.core().stats().executor.state_snapshots_saved, 0);
  EXPECT_GT(st.state_snapshots_held, 0);
  EXPECT_EQ(st.state_snapshots_total, kDefaultStateSnapshots);
  const EngineStats none = off.core().stats();
  EXPECT_EQ(none.prefix_cache_hits, 0);
  EXPECT_EQ(none.state_snapshots_total, 0);
}

INSTANTIATE_TEST_SUITE_P(Budgets, StatePrefixCache, ::testing::Values(13, 16, 256));

// A second turn whose cached prefix ends inside the first turn's answer: R1 = 44 tokens, its
// decode steps compute tokens 44-49 and save a rolling snapshot at 48; R2 = R1 + answer + 5
// starts there and equals no caching.
TEST(StatePrefixCacheEngine, SecondTurnStartsFromTheAnswersLastBoundary) {
  for (const int64_t budget : {int64_t{16}, int64_t{256}}) {
    Engine on(budget, true), off(budget, false);
    std::mt19937 rng(11);
    const std::vector<int32_t> r1 = random_tokens(rng, 44);
    const Result a1 = on.run({r1})[0];
    expect_same(a1, off.run({r1})[0], "R1");
    ASSERT_EQ(a1.tokens.size(), static_cast<size_t>(kMaxTokens));
    const std::vector<int32_t> r2 = concat(concat(r1, a1.tokens), random_tokens(rng, 5));
    const Result hit = on.run({r2})[0];
    expect_same(hit, off.run({r2})[0], "R2, budget " + std::to_string(budget));
    EXPECT_EQ(hit.num_cached, 48) << budget;  // the prompt's own last snapshot is at 40
  }
}

// common/engine_properties.h's body (tests/gpu_models/test_gpu_linear.cpp runs it on the GPU):
// logits within the chunked delta rule's rounding, so tokens part only at such near ties.
TEST(StatePrefixCacheEngine, PrefixHitEqualsNoHit) {
  testing::EngineSpec spec;
  spec.checkpoint = testing::checkpoint_of(testing::test_data_dir() + "/fixtures/tiny-qwen3-next");
  spec.block_size = kBlock;
  spec.num_blocks = 96;
  spec.max_model_len = 512;
  spec.max_num_batched_tokens = 64;
  spec.max_num_seqs = 4;
  testing::check_state_prefix_hit_equals_no_hit(testing::cpu_executor, spec, {kTol, 2 * kTol});
}

// A pool of 14 blocks: an unrelated 100-token prompt evicts the document's blocks and with them
// their snapshots, so the next question on the document misses, and still gives the same output.
TEST(StatePrefixCacheEngine, EvictedSnapshotMissesAndStaysCorrect) {
  Engine on(256, true, 14), off(256, false, 14);
  std::mt19937 rng(6);
  const std::vector<int32_t> doc = random_tokens(rng, 41);
  on.run({concat(doc, random_tokens(rng, 7))});
  EXPECT_GT(on.core().stats().state_snapshots_held, 0);
  const std::vector<int32_t> q = concat(doc, random_tokens(rng, 4));
  const std::vector<int32_t> unrelated = random_tokens(rng, 100);
  const Result u = on.run({unrelated})[0];
  EXPECT_EQ(u.num_cached, 0);
  // Each snapshot held is tied to a cached block (check_consistency): the document's went with
  // its blocks, the unrelated prompt's own remain.
  on.core().check_consistency();
  const Result r = on.run({q})[0];
  EXPECT_EQ(r.num_cached, 0);
  expect_same(r, off.run({q})[0], "after eviction");
  // A snapshot pool of one: an unrelated prompt's snapshot takes the first prompt's, whose
  // K/V stay cached but no longer hit; with a larger pool they do. (The unrelated prompt's 26
  // tokens and 6 answers end no decode step on a boundary: a rolling snapshot would take a slot
  // from the same LRU.)
  const std::vector<int32_t> first = concat(doc, random_tokens(rng, 7));
  const std::vector<int32_t> again = concat(first, random_tokens(rng, 3));
  for (int64_t snapshots : {1, 2}) {
    Engine e(256, true, 96, snapshots);
    e.run({first});
    e.run({random_tokens(rng, 26)});
    EXPECT_EQ(e.core().stats().state_snapshots_held, snapshots);
    EXPECT_EQ(e.run({again})[0].num_cached, snapshots == 1 ? 0 : 48) << snapshots;
  }
}

// Four requests on the document at once in a pool too small for them (preemptions), one aborted
// mid-way: no block, state slot or snapshot reservation is left held, and each finished request
// equals itself run alone without prefix caching (batched equals alone).
TEST(StatePrefixCacheEngine, PreemptionAndAbortFreeEverythingAndBatchEqualsAlone) {
  std::mt19937 rng(7);
  const std::vector<int32_t> doc = random_tokens(rng, 41);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t tail : {7, 12, 3, 20}) prompts.push_back(concat(doc, random_tokens(rng, tail)));
  Engine on(16, true, 11);
  bool aborted = false;
  std::vector<Result> batched = on.run(prompts, [&](int64_t step) {
    if (step == 4) aborted = on.core().abort(2);
  });
  EXPECT_TRUE(aborted);
  const EngineStats st = on.core().stats();
  EXPECT_GT(st.num_preemptions, 0);
  EXPECT_GT(st.state_snapshot_restores, 0);
  EXPECT_LE(st.state_snapshots_held, st.state_snapshots_total);
  EXPECT_EQ(batched[2].reason, FinishReason::kAbort);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i == 2) continue;
    Engine alone(256, false);
    expect_same(batched[i], alone.run({prompts[i]})[0], "request " + std::to_string(i));
  }
}

TEST(StatePrefixCacheEngine, SnapshotCountResolves) {
  EXPECT_EQ(resolve_state_snapshots(true, -1), kDefaultStateSnapshots);
  EXPECT_EQ(resolve_state_snapshots(true, 3), 3);
  EXPECT_EQ(resolve_state_snapshots(false, 3), 0);  // nothing to hit without prefix caching
  EXPECT_THROW(resolve_state_snapshots(true, -2), Error);
}

}  // namespace
}  // namespace longctx
