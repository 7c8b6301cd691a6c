// Engine properties, one body each for every device: tests/engine runs them on the CPU executor
// (make_cpu_executor, in CI), tests/gpu_models on the GPU runner (make_gpu_executor). A body
// says what it varies in an EngineSpec; each device's ExecutorFactory turns that into its own
// executor (engine_test_util.h's cpu_executor, gpu_models/gpu_executor.h's GpuExecutorFactory).
//   - KV offload generates the resident engine's tokens (batched, prefix hits, preemption);
//   - preemption and prefix caching keep the outputs of a roomy engine without the cache;
//   - a state model's prefix hit (its states restored from a snapshot) equals no hit;
//   - a state model through KV offload (the full group offloaded, the states resident) generates
//     the resident engine's tokens, with prefix hits and preemption, and so does Quest over the
//     offloaded full group with a budget above every sequence's length;
//   - speculative decoding generates the plain engine's tokens, with drafts accepted: the
//     needle model's answer alone; batched beside draftless sequences, prefix-cached and
//     preempted, against each request alone; and through KV offload.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/greedy_compare.h"
#include "common/test_data.h"
#include "engine/engine_core.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::testing {

// A checkpoint directory loaded once per process.
inline std::shared_ptr<const Checkpoint> checkpoint_of(const std::string& dir) {
  static std::map<std::string, std::shared_ptr<const Checkpoint>> cache;
  auto& ck = cache[dir];
  if (!ck) ck = std::make_shared<const Checkpoint>(load_checkpoint(dir));
  return ck;
}

// An engine as a property varies it. Block counts are the block manager's (offloaded: the host
// pool's); the factories map the rest onto their executor's options.
struct EngineSpec {
  std::shared_ptr<const Checkpoint> checkpoint;
  ModelBuildOptions model_options;  // the factory sets the device (and its activation dtype)
  int64_t block_size = 16;
  int64_t num_blocks = 512;
  int64_t max_model_len = 2048;
  int64_t max_num_batched_tokens = 256;
  int64_t max_num_seqs = 8;
  bool enable_prefix_caching = true;
  int64_t num_speculative_tokens = 0;  // n-gram (prompt lookup) drafts; 0: off
  SparseOptions sparse;                // the sparse attention policy (resident or offloaded)
  // KV offload: > 0, a device cache of this many blocks over the host pool of num_blocks, and a
  // ring of offload_slots slots of offload_slot_blocks blocks.
  int64_t offload_gpu_blocks = 0;
  int64_t offload_slots = 4;
  int64_t offload_slot_blocks = 4;
  // The CPU simulation's own knobs (the GPU's copies land when the copy engine is done, its
  // window pool is sized by the memory plan): steps until a write-back lands, and the resident
  // window pool's blocks (0: as many as the host pool's).
  int64_t offload_write_back_lag = 1;
  int64_t offload_window_blocks = 0;
};

using ExecutorFactory = std::function<std::unique_ptr<Executor>(const EngineSpec&)>;

struct EngineRun {
  std::vector<RequestOutput> outs;  // by prompt
  EngineStats stats;
};

// An EngineCore over make(spec) that keeps its prefix cache from one run to the next.
class EngineUnderTest {
 public:
  EngineUnderTest(const ExecutorFactory& make, const EngineSpec& spec)
      : core_(make(spec), nullptr, core_options(spec)) {}

  // The prompts, added at once, to their end; checks the core's consistency after every step and
  // that every KV block comes back.
  EngineRun run(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& sp) {
    for (size_t i = 0; i < prompts.size(); ++i) core_.add_request(i, prompts[i], sp, 0);
    EngineRun r;
    r.outs.resize(prompts.size());
    while (core_.has_unfinished()) {
      core_.step();
      core_.check_consistency();
      for (RequestOutput& out : core_.take_finished()) r.outs[out.index] = std::move(out);
    }
    r.stats = core_.stats();
    EXPECT_EQ(r.stats.kv_blocks_used, 0) << "KV blocks leaked";
    return r;
  }

 private:
  static EngineCoreOptions core_options(const EngineSpec& spec) {
    EngineCoreOptions o;
    o.max_model_len = spec.max_model_len;
    o.scheduler.max_num_batched_tokens = spec.max_num_batched_tokens;
    o.scheduler.max_num_seqs = spec.max_num_seqs;
    o.enable_prefix_caching = spec.enable_prefix_caching;
    if (spec.offload_gpu_blocks > 0) o.kv_medium = KvMedium::kCpu;
    if (spec.num_speculative_tokens > 0)
      o.speculative = {SpeculativeMethod::kNgram, spec.num_speculative_tokens, 1, 3};
    return o;
  }

  EngineCore core_;
};

// The prompts through a fresh engine.
inline EngineRun run_engine(const ExecutorFactory& make, const EngineSpec& spec,
                            const std::vector<std::vector<int32_t>>& prompts,
                            const SamplingParams& sp) {
  return EngineUnderTest(make, spec).run(prompts, sp);
}

inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// `n` prompts sharing a prefix: prompt i is the prefix's first head + i * head_step tokens (all
// of it at most) and 1..tail random tokens.
inline std::vector<std::vector<int32_t>> shared_prefix_prompts(int n, int64_t prefix, int64_t head,
                                                               int64_t head_step, int64_t tail,
                                                               int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(prefix);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % vocab);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p(shared.begin(),
                           shared.begin() + std::min<int64_t>(prefix, head + head_step * i));
    for (int64_t k = 0, len = 1 + rng() % tail; k < len; ++k)
      p.push_back(static_cast<int32_t>(rng() % vocab));
    out.push_back(std::move(p));
  }
  return out;
}

struct EngineExpectations {
  bool preemption = false;   // the run under test must preempt
  bool prefix_hits = false;  // and hit the prefix cache
  // Offloaded: the host pool was read and written (a cache that holds a whole sequence may not
  // need to: such callers sum the counters over their runs).
  bool host_traffic = true;
};

// KV offload (host pool, device cache, ring, write-backs) generates the resident engine's
// greedy tokens; the host pool was read and written. Returns the offloaded run's stats.
inline EngineStats check_offloaded_engine_equals_resident(
    const ExecutorFactory& make, const EngineSpec& resident, const EngineSpec& offloaded,
    const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
    const GreedyTolerance& tol, EngineExpectations expect = {}) {
  EXPECT_EQ(resident.offload_gpu_blocks, 0);
  EXPECT_GT(offloaded.offload_gpu_blocks, 0);
  const SamplingParams sp = greedy_with_logprobs(max_tokens);
  const EngineRun ref = run_engine(make, resident, prompts, sp);
  const EngineRun got = run_engine(make, offloaded, prompts, sp);
  expect_same_tokens_up_to_ties(ref.outs, got.outs, tol, "offloaded vs resident");
  if (expect.host_traffic) {
    EXPECT_GT(got.stats.executor.offload_host_bytes_loaded, 0);
    EXPECT_GT(got.stats.executor.offload_host_bytes_written, 0);
  }
  EXPECT_EQ(ref.stats.executor.offload_host_bytes_loaded, 0);
  if (expect.preemption) EXPECT_GT(got.stats.num_preemptions, 0);
  if (expect.prefix_hits) EXPECT_GT(got.stats.prefix_cache_hits, 0);
  std::printf("offloaded: %lld preemptions, %lld prefix-cache hits\n",
              (long long)got.stats.num_preemptions, (long long)got.stats.prefix_cache_hits);
  return got.stats;
}

// A pool too small for the batch (sequences preempted and recomputed) with prefix caching gives
// the outputs of a roomy pool without it.
inline void check_preemption_and_prefix_cache_keep_outputs(
    const ExecutorFactory& make, const EngineSpec& tight, const EngineSpec& roomy,
    const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
    const GreedyTolerance& tol) {
  ASSERT_TRUE(tight.enable_prefix_caching);
  ASSERT_FALSE(roomy.enable_prefix_caching);
  const SamplingParams sp = greedy_with_logprobs(max_tokens);
  const EngineRun ref = run_engine(make, roomy, prompts, sp);
  const EngineRun got = run_engine(make, tight, prompts, sp);
  expect_same_tokens_up_to_ties(ref.outs, got.outs, tol, "preempted + prefix cache vs neither");
  int64_t cached = 0;
  for (const RequestOutput& o : got.outs) cached += o.metrics.num_cached_tokens;
  EXPECT_GT(cached, 0) << "the shared prefix never hit the cache";
  EXPECT_GT(got.stats.num_preemptions, 0);
  EXPECT_EQ(ref.stats.num_preemptions, 0);
  std::printf("tight pool: %lld preemptions, %lld prompt tokens from the cache\n",
              (long long)got.stats.num_preemptions, (long long)cached);
}

// A state model (linear-attention layers): prompt b shares a's first 64 tokens, where a's chunks
// of 64 end on a block boundary and leave a snapshot of the states; b restores it and gives the
// tokens of an engine without prefix caching; a again hits its last boundary and repeats its
// first run. `spec`: chunks of 64 tokens, blocks dividing 64.
inline void check_state_prefix_hit_equals_no_hit(const ExecutorFactory& make, EngineSpec spec,
                                                 const GreedyTolerance& tol) {
  EXPECT_EQ(spec.max_num_batched_tokens, 64);
  EXPECT_EQ(64 % spec.block_size, 0);
  const int64_t vocab = spec.checkpoint->config.vocab_size;
  const std::vector<int32_t> a = random_ids(150, vocab, 11);
  std::vector<int32_t> b(a.begin(), a.begin() + 64);
  const std::vector<int32_t> tail = random_ids(40, vocab, 12);
  b.insert(b.end(), tail.begin(), tail.end());
  const SamplingParams sp = greedy_with_logprobs(24);
  spec.enable_prefix_caching = true;
  EngineUnderTest cached(make, spec);
  const EngineRun first = cached.run({a}, sp);
  const EngineRun hit = cached.run({b}, sp);
  EXPECT_GE(hit.outs[0].metrics.num_cached_tokens, spec.block_size) << "no prefix hit";
  EXPECT_GT(hit.stats.state_snapshot_restores, 0);
  spec.enable_prefix_caching = false;
  const EngineRun plain = run_engine(make, spec, {b}, sp);
  expect_same_tokens_up_to_ties(plain.outs, hit.outs, tol, "prefix hit vs none");
  const EngineRun again = cached.run({a}, sp);
  EXPECT_GE(again.outs[0].metrics.num_cached_tokens, 64) << "no prefix hit";
  expect_same_tokens_up_to_ties(first.outs, again.outs, tol, "repeat vs first");
}

// A state model (linear-attention layers beside full attention: tiny-qwen3-next) through KV
// offload: the full group's blocks through the host pool, the device cache and the ring, the
// linear-attention states resident (offload_backend.h). Two rounds through one engine each: four
// prompts at once (a host pool too small for them: preemption, recompute from the states'
// restart), then prompts that share round one's prefixes (hits that restore a state snapshot at a
// block boundary; one repeats a prompt whole). Greedy tokens equal the resident engine's in both
// rounds, and the host pool was read and written. `offloaded` may set a sparse policy that selects
// everything (Quest with a budget above max_model_len): the resident dense engine's tokens still.
// Prompt lengths fit a max_model_len of 256.
inline void check_state_model_offloaded_equals_resident(const ExecutorFactory& make,
                                                        const EngineSpec& resident,
                                                        const EngineSpec& offloaded,
                                                        const GreedyTolerance& tol) {
  EXPECT_EQ(resident.offload_gpu_blocks, 0);
  EXPECT_GT(offloaded.offload_gpu_blocks, 0);
  EXPECT_TRUE(offloaded.enable_prefix_caching);
  const int64_t vocab = resident.checkpoint->config.vocab_size;
  const std::vector<std::vector<int32_t>> first = {
      random_ids(150, vocab, 21), random_ids(37, vocab, 22), random_ids(120, vocab, 23),
      random_ids(61, vocab, 24)};
  // Round two: (round-one prompt, tokens kept, new tail tokens).
  const int64_t cuts[4][3] = {{0, 128, 9}, {0, 64, 30}, {2, 120, 3}, {3, 61, 0}};
  std::vector<std::vector<int32_t>> second;
  for (const auto& [src, keep, tail] : cuts) {
    std::vector<int32_t> p(first[src].begin(), first[src].begin() + keep);
    const std::vector<int32_t> t = random_ids(tail, vocab, static_cast<uint32_t>(31 + keep + tail));
    p.insert(p.end(), t.begin(), t.end());
    second.push_back(std::move(p));
  }
  const SamplingParams sp = greedy_with_logprobs(12);
  EngineUnderTest ref(make, resident), off(make, offloaded);
  EngineRun got;
  const std::vector<std::vector<int32_t>>* rounds[] = {&first, &second};
  for (const auto* prompts : rounds) {
    const EngineRun want = ref.run(*prompts, sp);
    got = off.run(*prompts, sp);
    expect_same_tokens_up_to_ties(want.outs, got.outs, tol,
                                  prompts == &first ? "offloaded vs resident, round one"
                                                    : "offloaded vs resident, round two (hits)");
    EXPECT_EQ(want.stats.executor.offload_host_bytes_loaded, 0);
  }
  // (The engine's stats count both rounds.)
  EXPECT_GT(got.stats.executor.offload_host_bytes_loaded, 0);
  EXPECT_GT(got.stats.executor.offload_host_bytes_written, 0);
  EXPECT_GT(got.stats.num_preemptions, 0);
  EXPECT_GT(got.stats.prefix_cache_hits, 0);
  EXPECT_GT(got.stats.state_snapshot_restores, 0);
  std::printf(
      "state model offloaded: %lld preemptions, %lld prefix-cache hits, %lld snapshot "
      "restores\n",
      (long long)got.stats.num_preemptions, (long long)got.stats.prefix_cache_hits,
      (long long)got.stats.state_snapshot_restores);
}

// ---- Speculative decoding on models/needle ------------------------------------------------

// tests/data/needle's prompt (988 tokens; the answer " 2739187." is copied from the haystack)
// and transformers' greedy tokens: a model whose answers quote its context, so prompt-lookup
// drafts get accepted.
struct NeedleCase {
  std::vector<int32_t> input_ids, greedy_new_tokens;
};

inline const NeedleCase& needle_case() {
  static const NeedleCase c = [] {
    const std::string path = test_data_dir() + "/needle/reference.json";
    std::ifstream f(path);
    LONGCTX_CHECK(f.good(), ErrorCode::kNotFound, "missing {}", path);
    const nlohmann::json j = nlohmann::json::parse(f);
    return NeedleCase{j.at("input_ids").get<std::vector<int32_t>>(),
                      j.at("greedy_new_tokens").get<std::vector<int32_t>>()};
  }();
  return c;
}

// The needle prompt with its haystack cut to the first `head` tokens (the needle is at 197-206),
// then the question (the last 40 tokens).
inline std::vector<int32_t> short_needle_prompt(size_t head) {
  const std::vector<int32_t>& ids = needle_case().input_ids;
  std::vector<int32_t> p(ids.begin(), ids.begin() + head);
  p.insert(p.end(), ids.end() - 40, ids.end());
  return p;
}

inline std::vector<int32_t> random_needle_prompt(uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<int32_t>(3 + rng() % 250);
  return p;
}

inline EngineSpec needle_spec() {
  EngineSpec s;
  s.checkpoint = checkpoint_of(needle_model_dir());
  s.block_size = 16;
  s.num_blocks = 256;
  s.max_model_len = 2048;
  s.max_num_batched_tokens = 1024;
  s.enable_prefix_caching = false;
  return s;
}

inline void expect_acceptance_counted(const SpecDecodeStats& s, int64_t k) {
  EXPECT_GT(s.num_drafts, 0);
  EXPECT_GT(s.num_accepted_tokens, 0);
  EXPECT_LE(s.num_accepted_tokens, s.num_draft_tokens);
  ASSERT_EQ(s.num_accepted_tokens_per_pos.size(), static_cast<size_t>(k));
  int64_t per_pos = 0;
  for (int64_t i = 0; i < k; ++i) {
    per_pos += s.num_accepted_tokens_per_pos[i];
    if (i > 0) EXPECT_LE(s.num_accepted_tokens_per_pos[i], s.num_accepted_tokens_per_pos[i - 1]);
  }
  EXPECT_EQ(per_pos, s.num_accepted_tokens);
  EXPECT_GT(s.mean_acceptance_length(), 1.0);
}

// The needle answer alone: the plain engine gives transformers' tokens, the speculative one
// (4 draft tokens) the plain one's, with drafts accepted and counted.
inline void check_speculative_needle_equals_plain(const ExecutorFactory& make,
                                                  const GreedyTolerance& tol) {
  const NeedleCase& c = needle_case();
  const auto n = static_cast<int64_t>(c.greedy_new_tokens.size());
  EngineSpec spec = needle_spec();
  const EngineRun plain = run_engine(make, spec, {c.input_ids}, greedy_with_logprobs(n));
  spec.num_speculative_tokens = 4;
  const EngineRun drafted = run_engine(make, spec, {c.input_ids}, greedy_with_logprobs(n));
  EXPECT_EQ(plain.outs[0].token_ids, c.greedy_new_tokens);
  expect_same_tokens_up_to_ties(plain.outs, drafted.outs, tol, "needle, speculative vs plain");
  expect_acceptance_counted(drafted.stats.spec_decode, 4);
  EXPECT_EQ(drafted.stats.generation_tokens, plain.stats.generation_tokens);
  EXPECT_EQ(plain.stats.spec_decode.num_drafts, 0);
  std::printf("needle: %lld drafts, %lld of %lld draft tokens accepted, mean acceptance %.2f\n",
              (long long)drafted.stats.spec_decode.num_drafts,
              (long long)drafted.stats.spec_decode.num_accepted_tokens,
              (long long)drafted.stats.spec_decode.num_draft_tokens,
              drafted.stats.spec_decode.mean_acceptance_length());
}

// Needle prompts (drafts accepted), three sharing their first 224 tokens, beside random ones
// (few drafts, none accepted), with 3 draft tokens, prefix caching, prefills chunked at 128
// tokens and a pool of 24 blocks of 16 (the five need ~75 at once, the longest 20 alone): each
// request's tokens are those it gets alone without speculation.
inline void check_speculative_batched_cached_preempted_equals_alone(const ExecutorFactory& make,
                                                                    const GreedyTolerance& tol) {
  const std::vector<std::vector<int32_t>> prompts = {
      short_needle_prompt(224), random_needle_prompt(3, 90), short_needle_prompt(256),
      random_needle_prompt(5, 41), short_needle_prompt(240)};
  const SamplingParams sp = greedy_with_logprobs(12);
  std::vector<RequestOutput> alone;
  for (const auto& p : prompts) alone.push_back(run_engine(make, needle_spec(), {p}, sp).outs[0]);
  EngineSpec spec = needle_spec();
  spec.num_speculative_tokens = 3;
  spec.num_blocks = 24;
  spec.max_model_len = 24 * 16;  // the GPU runner's plan holds one max_model_len sequence
  spec.enable_prefix_caching = true;
  spec.max_num_batched_tokens = 128;
  const EngineRun together = run_engine(make, spec, prompts, sp);
  EXPECT_GT(together.stats.num_preemptions, 0);
  EXPECT_GT(together.stats.prefix_cache_hits, 0);
  EXPECT_GT(together.stats.spec_decode.num_accepted_tokens, 0);
  expect_same_tokens_up_to_ties(alone, together.outs, tol, "batched, cached, preempted");
}

// Through KV offload (a device cache of 14 blocks over the host pool, the ring for the rest):
// a verifying step streams the context once for its k + 1 queries, and the rolled-back slots are
// rewritten by later steps.
inline void check_speculative_offloaded_equals_plain(const ExecutorFactory& make,
                                                     const GreedyTolerance& tol) {
  const std::vector<std::vector<int32_t>> prompts = {short_needle_prompt(224)};
  EngineSpec spec = needle_spec();
  spec.max_model_len = 1024;
  spec.num_blocks = 96;  // the GPU's host pool holds a max_model_len sequence
  spec.max_num_batched_tokens = 128;
  spec.max_num_seqs = 2;
  spec.offload_gpu_blocks = 128 / 16 + 2 * 2 + 2;  // a step's blocks and a few: 17 stream
  spec.offload_slots = 2;
  spec.offload_slot_blocks = 3;
  const EngineRun plain = run_engine(make, spec, prompts, greedy_with_logprobs(10));
  spec.num_speculative_tokens = 4;
  const EngineRun drafted = run_engine(make, spec, prompts, greedy_with_logprobs(10));
  expect_same_tokens_up_to_ties(plain.outs, drafted.outs, tol, "offloaded, speculative vs plain");
  EXPECT_GT(drafted.stats.spec_decode.num_accepted_tokens, 0);
  EXPECT_GT(drafted.stats.executor.offload_host_bytes_loaded, 0);
}

}  // namespace longctx::testing
