// KV offload on the CPU: the planner and the ring under the real engine.
//
// OffloadTokenExecutor moves "K/V" that are (position, token) pairs through exactly what each
// OffloadStepPlan says: a host pool, a GPU cache, ring slots, pre-step moves and write-backs that
// land late (several steps after they were issued, unless the plan waits for them). For every
// sequence it reads back its keys from the resident table and the ring items and checks that
// they are exactly positions [0, kv_len) with the sequence's tokens, the new ones in the causal
// (resident) part at its end. 1000 random requests with prefix caching, chunked prefill,
// preemption and aborts run through it. Then the CPU reference model with the simulated offload
// device (offload_device_cpu.cpp) against the resident CPU executor, over random geometries.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>

#include "attention/backends/offload_planner.h"
#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine/engine_test_util.h"
#include "longctx/core/error.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

using testing::core_options;
using testing::greedy;
using testing::next_token_of;
using testing::tiny_model;
constexpr int64_t kVocab = testing::kTokenVocab;

struct Kv {
  int32_t pos = -1, token = -1;
};

class OffloadTokenExecutor final : public Executor {
 public:
  OffloadTokenExecutor(const OffloadGeometry& g, int64_t lag)
      : g_(g),
        lag_(lag),
        planner_(g),
        host_(g.num_host_blocks * g.block_size),
        gpu_(g.num_gpu_blocks * g.block_size),
        ring_(g.num_slots * g.slot_blocks * g.block_size) {}

  int64_t vocab_size() const override { return kVocab; }
  KVBlockLayout kv_layout() const override { return {g_.num_host_blocks, g_.block_size}; }

  Tensor execute(std::span<const StepInput> inputs, std::span<const KVBlockCopy> copies) override {
    const int64_t bs = g_.block_size;
    ForwardBatch batch;
    batch.block_table_indptr.push_back(0);
    for (const StepInput& in : inputs) {
      batch.add_sequence(in.seq_id, in.all_tokens.data() + in.num_computed, in.num_new,
                         in.num_computed, in.want_logits);
      const int64_t end = in.num_computed + in.num_new;
      batch.block_tables.insert(batch.block_tables.end(), in.block_table.begin(),
                                in.block_table.begin() + (end + bs - 1) / bs);
      batch.block_table_indptr.push_back(static_cast<int32_t>(batch.block_tables.size()));
      for (int64_t j = in.num_computed; j < end; ++j)
        batch.slot_mapping.push_back(in.block_table[j / bs] * bs + j % bs);
    }
    ++step_;
    const OffloadStepPlan plan =
        planner_.plan(batch, copies, [&](uint64_t t) { return t <= landed_; });
    planner_.check_consistency();
    // Pre-step moves, in the plan's order.
    while (!pending_.empty() && pending_.front().step + lag_ <= step_) land_next();
    if (!plan.evict_write_backs.empty())
      issue(plan.evict_write_back_ticket, plan.evict_write_backs);
    if (plan.compute_wait_ticket) land_until(plan.compute_wait_ticket);
    for (auto [src, dst] : plan.gpu_copies)
      std::copy_n(gpu_.begin() + src * bs, bs, gpu_.begin() + dst * bs);
    if (plan.load_wait_ticket) land_until(plan.load_wait_ticket);
    for (const BlockMove& m : plan.loads)
      std::copy_n(host_.begin() + m.host * bs, bs, gpu_.begin() + m.gpu * bs);
    // The new tokens into the GPU cache.
    for (int64_t t = 0; t < batch.num_tokens(); ++t)
      gpu_[plan.slots[t]] = {static_cast<int32_t>(batch.positions[t]), batch.input_ids[t]};

    // Reads: the resident part, then the ring (one layer here; every layer reads the same).
    std::vector<std::vector<Kv>> resident(inputs.size()), host(inputs.size());
    for (size_t s = 0; s < inputs.size(); ++s) {
      const int32_t kv_len = plan.kv_lens[s];
      for (int32_t j = 0; j < kv_len; ++j)
        resident[s].push_back(gpu_[plan.kv_indices[plan.kv_indptr[s] + j / bs] * bs + j % bs]);
    }
    for (size_t i = 0; i < plan.items.size(); ++i) {
      const RingItem& it = plan.items[i];
      const int64_t slot = i % g_.num_slots;
      Kv* base = ring_.data() + slot * g_.slot_blocks * bs;
      for (const SlotRun& r : it.runs) {
        if (plan.load_wait_ticket) land_until(plan.load_wait_ticket);
        EXPECT_LE(r.slot_begin + r.count, g_.slot_blocks);
        std::copy_n(host_.begin() + r.host_begin * bs, r.count * bs, base + r.slot_begin * bs);
      }
      for (int32_t k = 0; k < it.seq_end - it.seq_begin; ++k) {
        EXPECT_EQ(it.qo_indptr[k + 1] - it.qo_indptr[k], batch.q_len(it.seq_begin + k));
        for (int32_t j = 0; j < it.kv_lens[k]; ++j)
          host[it.seq_begin + k].push_back(
              base[it.kv_indices[it.kv_indptr[k] + j / bs] * bs + j % bs]);
      }
    }
    if (!plan.write_backs.empty()) issue(plan.write_back_ticket, plan.write_backs);

    int64_t rows = 0;
    for (const StepInput& in : inputs) rows += in.want_logits ? 1 : 0;
    Tensor out = Tensor::zeros({rows, kVocab}, DType::kF32);
    int64_t r = 0;
    for (size_t s = 0; s < inputs.size(); ++s) {
      const StepInput& in = inputs[s];
      const int32_t end = static_cast<int32_t>(in.num_computed + in.num_new);
      // The new tokens are the last rows of the causal part, in order.
      const auto& res = resident[s];
      LONGCTX_CHECK(static_cast<int64_t>(res.size()) >= in.num_new, ErrorCode::kInternal,
                    "sequence {}: {} resident keys for {} new tokens", in.seq_id, res.size(),
                    in.num_new);
      for (int64_t k = 0; k < in.num_new; ++k) {
        const Kv& kv = res[res.size() - in.num_new + k];
        LONGCTX_CHECK(kv.pos == in.num_computed + k, ErrorCode::kInternal,
                      "sequence {}: causal row {} holds position {}, expected {}", in.seq_id, k,
                      kv.pos, in.num_computed + k);
      }
      std::vector<int32_t> read(end, -1);
      const std::vector<Kv>* parts[] = {&res, &host[s]};
      for (const std::vector<Kv>* part : parts) {
        for (const Kv& kv : *part) {
          LONGCTX_CHECK(kv.pos >= 0 && kv.pos < end && read[kv.pos] == -1, ErrorCode::kInternal,
                        "sequence {}: key position {} read twice or outside [0, {})", in.seq_id,
                        kv.pos, end);
          read[kv.pos] = kv.token;
        }
      }
      for (int32_t j = 0; j < end; ++j)
        LONGCTX_CHECK(read[j] == in.all_tokens[j], ErrorCode::kInternal,
                      "sequence {}: position {} reads token {}, expected {}", in.seq_id, j, read[j],
                      in.all_tokens[j]);
      host_keys += static_cast<int64_t>(host[s].size());
      if (in.want_logits) out.data<float>()[r++ * kVocab + next_token_of(read)] = 10.0f;
    }
    return out;
  }

  const OffloadPlanner& planner() const { return planner_; }
  int64_t host_keys = 0;

 private:
  struct Pending {
    uint64_t ticket, step;
    std::vector<BlockMove> moves;
  };
  void land_next() {
    const int64_t bs = g_.block_size;
    for (const BlockMove& m : pending_.front().moves)
      std::copy_n(gpu_.begin() + m.gpu * bs, bs, host_.begin() + m.host * bs);
    landed_ = std::max(landed_, pending_.front().ticket);
    pending_.pop_front();
  }
  void issue(uint64_t ticket, const std::vector<BlockMove>& moves) {
    LONGCTX_CHECK(ticket > issued_, ErrorCode::kInternal, "ticket {} after {}", ticket, issued_);
    issued_ = ticket;
    pending_.push_back({ticket, step_, moves});
  }
  void land_until(uint64_t ticket) {
    LONGCTX_CHECK(ticket <= issued_, ErrorCode::kInternal,
                  "wait for write-back ticket {} before it was issued (last {})", ticket, issued_);
    while (!pending_.empty() && pending_.front().ticket <= ticket) land_next();
  }

  OffloadGeometry g_;
  int64_t lag_;
  OffloadPlanner planner_;
  std::vector<Kv> host_, gpu_, ring_;
  std::deque<Pending> pending_;
  uint64_t landed_ = 0, issued_ = 0, step_ = 0;
};

TEST(OffloadPlanner, ThousandRandomRequestsReadExactlyTheirKeys) {
  std::mt19937 rng(11);
  int64_t total_host_keys = 0, preemptions = 0, hits = 0;
  for (int round = 0; round < 12; ++round) {
    OffloadGeometry g;
    g.num_layers = 1;
    g.block_size = 1 + rng() % 8;
    // A request holds up to 60 + 40 + 20 tokens: the pool fits two or three (preemption).
    g.num_host_blocks = 130 / g.block_size + 4 + rng() % (240 / g.block_size);
    g.num_slots = 1 + rng() % 8;
    g.slot_blocks = 1 + rng() % 6;
    const int64_t batched = 8 + rng() % 64, seqs = 1 + rng() % 8;
    // The step's written blocks must fit: new-token blocks plus a straddled one per sequence.
    // Tight in most rounds, so that partial blocks and blocks about to be read get evicted.
    g.num_gpu_blocks = (batched + g.block_size - 1) / g.block_size + 2 * seqs +
                       (round % 3 == 0 ? rng() % 30 : rng() % 2);
    const int64_t lag = 1 + rng() % 3;
    auto exec = std::make_unique<OffloadTokenExecutor>(g, lag);
    OffloadTokenExecutor* x = exec.get();
    EngineCore core(std::move(exec), nullptr, core_options(batched, seqs, rng() % 4 != 0));
    std::vector<int32_t> shared(20 + rng() % 40);
    for (auto& t : shared) t = static_cast<int32_t>(rng() % kVocab);
    int64_t next_id = 0;
    for (int step = 0; step < 4000 && (next_id < 100 || core.has_unfinished()); ++step) {
      if (next_id < 100 && rng() % 3 == 0) {
        std::vector<int32_t> p;
        if (rng() % 2) p.assign(shared.begin(), shared.begin() + 1 + rng() % shared.size());
        for (int64_t k = 0, n = 1 + rng() % 40; k < n; ++k)
          p.push_back(static_cast<int32_t>(rng() % kVocab));
        core.add_request(next_id++, p, greedy(1 + rng() % 20), 0);
      }
      if (rng() % 29 == 0 && next_id > 0) core.abort(rng() % next_id);
      if (core.has_unfinished()) core.step();
      core.take_finished();
      core.check_consistency();
    }
    EXPECT_FALSE(core.has_unfinished());
    const EngineStats st = core.stats();
    EXPECT_EQ(st.kv_blocks_used, 0) << "host blocks leaked";
    preemptions += st.num_preemptions;
    hits += st.prefix_cache_hits;
    total_host_keys += x->host_keys;
    x->planner().check_consistency();
  }
  std::printf("host keys %lld preemptions %lld hits %lld\n", (long long)total_host_keys,
              (long long)preemptions, (long long)hits);
  EXPECT_GT(total_host_keys, 0) << "no key was ever read through the ring";
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(hits, 0);
}

TEST(OffloadPlanner, EveryGpuBlockIsReusableWhenNothingRuns) {
  // After sequences come and go, a step that writes as many blocks as the GPU cache holds fits:
  // no GPU block stays pinned or leaked.
  OffloadGeometry g{1, 4, 64, 8, 2, 2};
  OffloadPlanner p(g);
  auto step = [&](int32_t first_block, int32_t blocks, int32_t tokens) {
    ForwardBatch b;
    std::vector<int32_t> ids(tokens, 1);
    b.add_sequence(first_block, ids.data(), tokens, 0, true);
    b.block_table_indptr = {0, blocks};
    for (int32_t i = 0; i < blocks; ++i) b.block_tables.push_back(first_block + i);
    for (int32_t t = 0; t < tokens; ++t)
      b.slot_mapping.push_back((first_block + t / 4) * 4 + t % 4);
    return p.plan(b, {}, [](uint64_t) { return true; });
  };
  for (int32_t round = 0; round < 6; ++round) {
    step(round * 8, 8, 30);  // 8 blocks, the last one partial (dirty)
    p.check_consistency();
  }
  const OffloadStepPlan last = step(56, 8, 32);
  EXPECT_EQ(p.num_resident(), 8);
  EXPECT_FALSE(last.evict_write_backs.empty()) << "the partial dirty block was written back";
  ForwardBatch too_big;
  std::vector<int32_t> ids(40, 1);
  too_big.add_sequence(0, ids.data(), 40, 0, true);
  too_big.block_table_indptr = {0, 10};
  for (int32_t i = 0; i < 10; ++i) too_big.block_tables.push_back(i);
  for (int32_t t = 0; t < 40; ++t) too_big.slot_mapping.push_back(t);
  EXPECT_THROW(p.plan(too_big, {}, [](uint64_t) { return true; }), Error);
  p.check_consistency();
}

TEST(OffloadPlanner, EvictedPartialBlockIsWrittenBackAndReloaded) {
  // 4 GPU blocks of 4 tokens; write-backs land 3 steps late unless waited for.
  OffloadTokenExecutor x(OffloadGeometry{1, 4, 32, 4, 2, 2}, 3);
  std::vector<int32_t> a(7), b(16);
  for (int i = 0; i < 7; ++i) a[i] = 100 + i;
  for (int i = 0; i < 16; ++i) b[i] = 200 + i;
  const std::vector<int32_t> table_a = {0, 1}, table_b = {2, 3, 4, 5};
  auto run = [&](const StepInput& in) { x.execute({&in, 1}, {}); };
  run({1, a, 0, 6, table_a, true});   // block 1 partial: 2 rows, dirty
  run({2, b, 0, 16, table_b, true});  // all 4 GPU blocks: both of a's evicted
  EXPECT_LT(x.planner().gpu_block(1), 0);
  EXPECT_FALSE(x.planner().is_dirty(1));
  run({1, a, 6, 1, table_a, true});  // block 1 reloaded (2 rows), block 0 through the ring
  EXPECT_GE(x.planner().gpu_block(1), 0);
  EXPECT_EQ(x.host_keys, 4);
  x.planner().check_consistency();
}

// ---- The CPU reference model through the simulated offload device --------------------------

// The engine's stats carry the executor's offload bytes (what /metrics exports): zero for a
// resident cache, loads and write-backs when blocks go through the (simulated) host pool.
TEST(OffloadCpuModel, EngineStatsCountOffloadBytes) {
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 31) % 1000);
  auto counters = [&](const CpuExecutorOptions& x) {
    EngineCore core(make_cpu_executor(tiny_model(), x), nullptr, core_options(16, 1, false));
    core.add_request(0, prompt, greedy(4), 0);
    while (core.has_unfinished()) core.step();
    return core.stats().executor;
  };
  CpuExecutorOptions resident;
  resident.block_size = 4;
  resident.num_blocks = 64;
  const ExecutorCounters r = counters(resident);
  EXPECT_EQ(r.offload_host_bytes_loaded, 0);
  EXPECT_EQ(r.offload_host_bytes_written, 0);
  CpuExecutorOptions off = resident;
  off.offload_gpu_blocks = 8;  // 18 blocks of prompt: most go through the ring
  const ExecutorCounters o = counters(off);
  EXPECT_GT(o.offload_host_bytes_loaded, 0);
  EXPECT_GT(o.offload_host_bytes_written, 0);
}

// common/engine_properties.h's body (tests/gpu_models runs it on the GPU), over random
// geometries: logprobs within 1e-4 (the offload path merges partial attentions by LSE).
TEST(OffloadCpuModel, RandomGeometriesEqualTheResidentCache) {
  std::mt19937 rng(5);
  const auto prompts = testing::shared_prefix_prompts(5, 37, 10, 7, 15, 1000, 5);
  int64_t loaded = 0, written = 0;
  for (int draw = 0; draw < 8; ++draw) {
    testing::EngineSpec resident;
    resident.checkpoint =
        testing::checkpoint_of(testing::test_data_dir() + "/fixtures/tiny-llama3");
    resident.model_options.rope_inv_freq_dtype = DType::kBF16;
    resident.max_model_len = 512;
    resident.block_size = 1 + rng() % 8;
    resident.num_blocks = 400;
    resident.max_num_batched_tokens = 8 + rng() % 40;
    resident.max_num_seqs = 1 + rng() % 4;
    resident.enable_prefix_caching = rng() % 2;
    testing::EngineSpec off = resident;
    off.offload_gpu_blocks = (off.max_num_batched_tokens + off.block_size - 1) / off.block_size +
                             2 * off.max_num_seqs + rng() % 6;
    off.offload_slots = 1 + rng() % 8;
    off.offload_slot_blocks = 1 + rng() % 5;
    off.offload_write_back_lag = 1 + rng() % 3;
    SCOPED_TRACE(::testing::Message()
                 << "block " << off.block_size << " gpu blocks " << off.offload_gpu_blocks
                 << " slots " << off.offload_slots << "x" << off.offload_slot_blocks << " lag "
                 << off.offload_write_back_lag << " batched " << off.max_num_batched_tokens
                 << " seqs " << off.max_num_seqs << " caching " << off.enable_prefix_caching);
    const EngineStats st = testing::check_offloaded_engine_equals_resident(
        testing::cpu_executor, resident, off, prompts, 10, {1e-4, 1e-4}, {.host_traffic = false});
    loaded += st.executor.offload_host_bytes_loaded;
    written += st.executor.offload_host_bytes_written;
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(written, 0);
}

}  // namespace
}  // namespace longctx
