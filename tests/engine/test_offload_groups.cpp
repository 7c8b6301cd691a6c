// KV offload of models with several KV groups (issue 44) on the CPU simulation: the full group
// goes through the offload path (host pool, a small GPU cache, the ring, LSE merges), the sliding
// groups stay resident in a window pool of their own (BlockManager's second pool).
//   - the tiny-gemma3 fixture (five sliding layers, window 48, then one global) and a model of
//     sliding, full, sliding, full layers (the last sliding layer after the offload step's last
//     layer) through the engine: chunked prefill, batching, prefix hits in both pools,
//     copy-on-write, prompts past the window and the ring; greedy tokens and logprobs equal to
//     the resident engine's;
//   - Quest and XAttention through the offload backend on such a model select over the full
//     group's layer only: that layer's outputs are those of the same policy over a one-group cache
//     of the full layer's K/V, the sliding layer's those of the resident backend (Quest's decode
//     steps differ from dense); Quest with a whole budget through the engine equals dense;
//   - the GPU memory plan of an offloaded Gemma-3-12B shape counts the windows apart;
//   - the models offload refuses say why (state models offload: test_offload_state.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "common/test_data.h"
#include "engine/engine_core.h"
#include "engine/engine_test_util.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

using LA = LayerAttention;
using testing::core_options;
using testing::greedy;

std::shared_ptr<Model> fixture_model(const std::string& name) {
  return create_model(testing::checkpoint_of(testing::test_data_dir() + "/fixtures/" + name));
}

// tiny-llama3's shapes, 4 layers: sliding, full, sliding, full (window 20), random weights: a
// full group of 2 layers (offload layers 0 and 1) and a sliding group of 2.
std::shared_ptr<const Checkpoint> two_group_checkpoint() {
  ModelConfig c = load_model_config(testing::test_data_dir() + "/fixtures/tiny-llama3/config.json");
  c.architecture = "MistralForCausalLM";
  c.num_hidden_layers = 4;
  c.dtype = DType::kF32;
  c.layer_types = {LA::kSliding, LA::kFull, LA::kSliding, LA::kFull};
  c.sliding_window = 20;
  return std::make_shared<const Checkpoint>(make_dummy_checkpoint(c, 11));
}

// Prompts sharing a 40-token prefix (prefix hits), one repeated whole (copy-on-write of the last
// block in both pools), and lengths past the window (48 / 20) and far past the GPU cache.
std::vector<std::vector<int32_t>> prompts_for(int64_t vocab) {
  std::mt19937 rng(3);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  };
  const std::vector<int32_t> prefix = random_tokens(40);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t tail : {9, 63, 0, 141}) {
    auto p = prefix;
    auto t = random_tokens(tail);
    p.insert(p.end(), t.begin(), t.end());
    prompts.push_back(p);
  }
  prompts.push_back(prompts[1]);
  prompts.push_back(random_tokens(97));
  prompts.push_back(random_tokens(5));
  return prompts;
}

// Greedy tokens equal, logprobs within 1e-4 (the offload path merges partial attention by LSE,
// the resident one attends in one pass); past a token where the two part (only where the top two
// are within rounding) the sequences are not compared.
constexpr testing::GreedyTolerance kLseMerge{1e-4, 1e-4};

testing::EngineSpec resident_spec(std::shared_ptr<const Checkpoint> ck) {
  testing::EngineSpec s;
  s.checkpoint = std::move(ck);
  s.block_size = 8;
  s.num_blocks = 400;
  s.max_model_len = 512;
  return s;
}

// The full group goes through the host pool and the ring, the sliding groups hold blocks of the
// window pool; random geometries (common/engine_properties.h's body, which tests/gpu_models runs
// on the GPU's sliding-window models).
void check_offload_equals_resident(std::shared_ptr<const Checkpoint> ck) {
  const auto prompts = prompts_for(ck->config.vocab_size);
  std::mt19937 rng(7);
  for (int draw = 0; draw < 3; ++draw) {
    testing::EngineSpec resident = resident_spec(ck);
    resident.max_num_batched_tokens = 16 + rng() % 24;
    resident.max_num_seqs = 1 + rng() % 3;
    resident.enable_prefix_caching = draw != 1;
    testing::EngineSpec off = resident;
    off.num_blocks = 200;
    // A GPU cache of the step's blocks and a few more: most of a long prompt streams through the
    // ring of 1..3 slots of 1..3 blocks.
    off.offload_gpu_blocks =
        (resident.max_num_batched_tokens + 7) / 8 + 2 * resident.max_num_seqs + rng() % 4;
    off.offload_slots = 1 + rng() % 3;
    off.offload_slot_blocks = 1 + rng() % 3;
    off.offload_write_back_lag = 1 + rng() % 3;
    off.offload_window_blocks = draw == 2 ? 0 : 300;
    SCOPED_TRACE(::testing::Message()
                 << "gpu blocks " << off.offload_gpu_blocks << " slots " << off.offload_slots << "x"
                 << off.offload_slot_blocks << " lag " << off.offload_write_back_lag << " batched "
                 << off.max_num_batched_tokens << " seqs " << off.max_num_seqs << " caching "
                 << off.enable_prefix_caching);
    testing::check_offloaded_engine_equals_resident(testing::cpu_executor, resident, off, prompts,
                                                    12, kLseMerge,
                                                    {.prefix_hits = off.enable_prefix_caching});
  }
}

TEST(OffloadGroups, GemmaFixtureOffloadedEqualsResident) {
  check_offload_equals_resident(
      testing::checkpoint_of(testing::test_data_dir() + "/fixtures/tiny-gemma3"));
}

TEST(OffloadGroups, SlidingAfterTheLastFullLayerEqualsResident) {
  check_offload_equals_resident(two_group_checkpoint());
}

// The sliding groups' blocks are window-pool ids (from the host pool's size on) and a window
// pool too small for one sequence's windows is refused when the request is added.
TEST(OffloadGroups, SlidingBlocksComeFromTheWindowPool) {
  auto model = fixture_model("tiny-gemma3");
  CpuExecutorOptions off;
  off.block_size = 8;
  off.num_blocks = 50;
  off.offload_gpu_blocks = 8;
  off.offload_window_blocks = 70;
  auto exec = make_cpu_executor(model, off);
  const KVBlockLayout l = exec->kv_layout();
  EXPECT_EQ(l.num_blocks, 50);
  EXPECT_EQ(l.num_window_blocks, 70);
  ASSERT_EQ(l.groups.size(), 6u);
  EngineCore core(std::move(exec), nullptr, core_options(16, 2));
  std::vector<int32_t> prompt(120, 7);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 13 % 500);
  core.add_request(0, prompt, greedy(3), 0);
  core.step();
  const EngineStats st = core.stats();
  ASSERT_EQ(st.kv_group_blocks_used.size(), 6u);
  EXPECT_EQ(st.kv_group_blocks_used[0], 2);  // 16 tokens of the full group
  for (size_t g = 1; g < 6; ++g) EXPECT_EQ(st.kv_group_blocks_used[g], 2);
  while (core.has_unfinished()) core.step();

  // Five sliding groups x (48 - 1 + 16 tokens: 8 blocks + a straddled one) = 45 window blocks a
  // sequence may hold; a pool of 40 cannot run one.
  off.offload_window_blocks = 40;
  EngineCore small(make_cpu_executor(model, off), nullptr, core_options(16, 2));
  try {
    small.add_request(0, prompt, greedy(3), 0);
    ADD_FAILURE() << "a window pool smaller than one sequence's windows was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("window pool"), std::string::npos) << e.what();
  }
}

// A sparse policy through the offload backend over a model of a sliding layer (0, window 24) and a
// full layer (1): random K / V / q over prefill chunks of two sequences, then decode steps. Layer
// 1's outputs equal those of an offload backend of one group holding only that layer (the
// policy's one-group semantics), layer 0's those of the resident paged backend over both groups;
// returns the decode steps whose full-layer outputs differ from dense. The policy read host pages
// in place.
int sparse_on_the_full_group_only(const SparseOptions& policy) {
  constexpr int64_t kBlock = 16, kHq = 4, kHkv = 2, kD = 8, kWindow = 24;
  ModelConfig c;
  c.num_hidden_layers = 2;
  c.layer_types = {LA::kSliding, LA::kFull};
  c.sliding_window = kWindow;
  c.num_attention_heads = kHq;
  c.num_key_value_heads = kHkv;
  c.head_dim = kD;
  const KvGroups groups = KvGroups::from_config(c, DType::kF32);
  EXPECT_EQ(groups.size(), 2);
  if (groups.size() != 2) return -1;
  EXPECT_EQ(groups[0].layers, std::vector<int64_t>{1});
  const KvGroups window_groups = groups.without_first();
  EXPECT_EQ(window_groups.group_of(0), 0);
  EXPECT_EQ(window_groups.group_of(1), -1);

  const std::vector<int64_t> lens = {400, 290};
  constexpr int kDecodes = 4;
  constexpr int64_t kChunk = 48;
  int64_t host_blocks = 0;
  for (int64_t len : lens) host_blocks += (len + kDecodes + kBlock - 1) / kBlock;
  const int64_t window_blocks = host_blocks;  // every block kept (no window drops needed)
  const float scale = 1.f / std::sqrt(float(kD));
  auto make_offload = [&](const SparseOptions& sparse) {
    OffloadDeviceConfig d;
    d.geometry = {1, kBlock, host_blocks, /*gpu blocks=*/12, /*slots=*/2, /*slot blocks=*/3};
    d.num_qo_heads = kHq;
    d.num_kv_heads = kHkv;
    d.head_dim = kD;
    d.dtype = DType::kF32;
    d.sm_scale = scale;
    d.cpu_write_back_lag = 2;
    d.sparse = sparse;
    return std::make_unique<OffloadAttentionBackend>(d.geometry, make_cpu_offload_device(d));
  };
  // Under test: the full layer offloaded with quest, the sliding one resident.
  PagedKVPool window_pool({1, kHkv, kD, kBlock, window_blocks, DType::kF32, Device::cpu()});
  CpuPagedBackend window_backend(window_pool, scale, nullptr, &window_groups);
  auto grouped = make_offload(policy);
  grouped->set_window_groups(groups, window_backend, host_blocks,
                             [](std::span<const KVBlockCopy>) { FAIL() << "no copies here"; });
  // References: quest over a one-group cache of the full layer; dense over it; the resident
  // backend over both groups (engine ids: window ids after the host ones).
  auto one_group = make_offload(policy);
  auto dense_one_group = make_offload({});
  PagedKVPool both_pool(
      {1, kHkv, kD, kBlock, host_blocks + window_blocks, DType::kF32, Device::cpu()});
  CpuPagedBackend resident(both_pool, scale, nullptr, &groups);

  std::vector<std::vector<int32_t>> full_tables, window_tables, tokens;
  int32_t next = 0;
  for (int64_t len : lens) {
    full_tables.emplace_back();
    window_tables.emplace_back();
    for (int64_t b = 0; b < (len + kDecodes + kBlock - 1) / kBlock; ++b) {
      full_tables.back().push_back(next);
      window_tables.back().push_back(static_cast<int32_t>(host_blocks + next));
      ++next;
    }
    tokens.emplace_back(len + kDecodes, 1);
  }
  std::mt19937 rng(9);
  auto random_rows = [&](int64_t t, int64_t h) {
    Tensor x = Tensor::empty({t, h, kD}, DType::kF32);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n01(rng);
    return x;
  };
  auto max_diff = [](const Tensor& a, const Tensor& b) {
    double m = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
      m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
    return m;
  };
  std::vector<int64_t> done(lens.size(), 0);
  int decode_steps_differing = 0;
  const std::vector<KvGroupAlloc> allocs = groups.allocs();
  for (int step = 0;; ++step) {
    std::vector<StepInput> in;
    std::vector<std::span<const int32_t>> extra[2];
    bool prefill = false;
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t total = lens[s] + kDecodes;
      if (done[s] >= total) continue;
      const int64_t m = done[s] < lens[s] ? std::min(kChunk, lens[s] - done[s]) : 1;
      prefill = prefill || m > 1;
      extra[s].push_back(window_tables[s]);
      StepInput x{uint64_t(s), tokens[s], done[s], m, full_tables[s], true};
      x.group_tables = extra[s];
      in.push_back(x);
      done[s] += m;
    }
    if (in.empty()) break;
    // The decode steps run once every prompt is done (the policy selects on decode-only steps).
    ForwardBatch batch = make_forward_batch(in, kBlock, allocs);
    ForwardBatch full_only = make_forward_batch(in, kBlock);
    const int64_t t = batch.num_tokens();
    const Tensor k0 = random_rows(t, kHkv), v0 = random_rows(t, kHkv), q0 = random_rows(t, kHq);
    const Tensor k1 = random_rows(t, kHkv), v1 = random_rows(t, kHkv), q1 = random_rows(t, kHq);
    grouped->plan(batch);
    grouped->store_kv(0, k0, v0);
    const Tensor g0 = grouped->attend(0, q0);
    grouped->store_kv(1, k1, v1);
    const Tensor g1 = grouped->attend(1, q1);
    resident.plan(batch);
    resident.store_kv(0, k0, v0);
    const Tensor r0 = resident.attend(0, q0);
    Tensor o1[2];
    OffloadAttentionBackend* refs[2] = {one_group.get(), dense_one_group.get()};
    for (int i = 0; i < 2; ++i) {
      refs[i]->plan(full_only);
      refs[i]->store_kv(0, k1, v1);
      o1[i] = refs[i]->attend(0, q1);
    }
    EXPECT_EQ(max_diff(g0, r0), 0.0) << "step " << step << ": the sliding layer";
    EXPECT_EQ(max_diff(g1, o1[0]), 0.0) << "step " << step << ": the full layer (the policy)";
    if (!prefill && max_diff(g1, o1[1]) > 1e-3) ++decode_steps_differing;
  }
  EXPECT_GT(grouped->sparse_host_bytes_read(), 0);  // host pages read in place
  return decode_steps_differing;
}

// Quest's budget (64 tokens) is far below the context: every decode-only step (4) differs from
// dense.
TEST(OffloadGroups, QuestSelectsOverTheFullGroupOnly) {
  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.budget_tokens = 64;
  quest.sink_tokens = 16;
  quest.window_tokens = 16;
  EXPECT_EQ(sparse_on_the_full_group_only(quest), 4);
}

// XAttention masks the prefill chunks of the full layer (host keys read in place, values of kept
// blocks only), as over a one-group cache.
TEST(OffloadGroups, XAttentionSelectsOverTheFullGroupOnly) {
  SparseOptions x;
  x.policy = SparsePolicyKind::kXAttention;
  x.xattn_dense_tail = 0;
  x.xattn_min_len = 0;
  sparse_on_the_full_group_only(x);
}

// Quest through the engine's simulated offload on tiny-gemma3: with a budget above every
// sequence's length it selects everything, so the tokens are the dense resident engine's.
TEST(OffloadGroups, QuestWithAWholeBudgetEqualsDense) {
  const auto ck = testing::checkpoint_of(testing::test_data_dir() + "/fixtures/tiny-gemma3");
  testing::EngineSpec resident = resident_spec(ck);
  resident.max_num_batched_tokens = 24;
  resident.max_num_seqs = 3;
  testing::EngineSpec off = resident;
  off.num_blocks = 200;
  off.offload_gpu_blocks = 10;
  off.offload_slots = 2;
  off.offload_slot_blocks = 2;
  off.sparse.policy = SparsePolicyKind::kQuest;
  off.sparse.budget_tokens = 4096;
  off.sparse.page_tokens = 8;
  testing::check_offloaded_engine_equals_resident(testing::cpu_executor, resident, off,
                                                  prompts_for(ck->config.vocab_size), 12, kLseMerge,
                                                  {.prefix_hits = true});
}

TEST(OffloadGroups, RefusedModelsSayWhy) {
  CpuExecutorOptions off;
  off.block_size = 8;
  off.num_blocks = 64;
  off.offload_gpu_blocks = 8;
  // Every layer sliding: nothing to offload (its KV is bounded by the window).
  try {
    make_cpu_executor(fixture_model("tiny-mistral-sw"), off);
    ADD_FAILURE() << "an all-sliding model was offloaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("sliding"), std::string::npos) << e.what();
  }
  // Sliding and linear-attention layers together: the resident side is one kind or the other.
  ModelConfig c =
      load_model_config(testing::test_data_dir() + "/fixtures/tiny-qwen3-next/config.json");
  c.layer_types[1] = LA::kSliding;
  c.sliding_window = 16;
  EXPECT_FALSE(KvGroups::from_config(c, DType::kF32).offloadable());
  c.layer_types[1] = LA::kLinear;
  EXPECT_TRUE(KvGroups::from_config(c, DType::kF32).offloadable());
}

// The GPU memory plan of an offloaded Gemma-3-12B-shaped model (48 layers, 5 local : 1 global,
// window 1024): the host pool and the GPU cache hold the 8 global layers' blocks, the window pool
// (max_num_seqs windows and a step's tokens, for each of the five sliding groups) is resident and
// comes off the budget before the GPU cache; the plan's string says so.
TEST(OffloadGroups, MemoryPlanCountsTheWindowsApart) {
  ModelConfig c = dummy_preset_config("llama-3.1-8b");
  c.num_hidden_layers = 48;
  c.layer_types.assign(48, LA::kSliding);
  for (int64_t l = 5; l < 48; l += 6) c.layer_types[l] = LA::kFull;
  c.sliding_window = 1024;
  GpuRunnerOptions o;
  o.kv_offload = true;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 4096;
  o.host_kv_bytes = 64ll << 30;
  o.max_model_len = 131072;
  const int64_t budget = 40ll << 30;
  const GpuMemoryPlan p = plan_gpu_memory(c, o, budget);
  const int64_t layer_block = 2 * c.num_key_value_heads * c.head_dim * 2 * p.block_size;
  EXPECT_EQ(p.kv_block_bytes, 8 * layer_block);  // the full group's 8 layers
  EXPECT_EQ(p.window_block_bytes, 8 * layer_block);
  const int64_t per_group =
      4 * ((1023 + p.block_size - 1) / p.block_size + 2) + (4096 + p.block_size - 1) / p.block_size;
  EXPECT_EQ(p.num_window_blocks, 5 * per_group);
  EXPECT_EQ(p.num_host_blocks, (64ll << 30) / p.kv_block_bytes);
  EXPECT_LE(p.weights + p.activations + p.workspaces + p.ring_bytes + p.offload_buffers + p.sparse +
                p.window_bytes() + p.kv_bytes(),
            budget);
  EXPECT_NE(p.str().find("sliding windows resident"), std::string::npos) << p.str();
  // Without offload the one pool's blocks hold 8 layers of any group.
  o.kv_offload = false;
  const GpuMemoryPlan r = plan_gpu_memory(c, o, budget);
  EXPECT_EQ(r.num_window_blocks, 0);
  EXPECT_EQ(r.kv_block_bytes, 8 * layer_block);
}

}  // namespace
}  // namespace longctx
