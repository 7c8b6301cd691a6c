// KV offload of a state model (issue 46) on the CPU simulation: tiny-qwen3-next (three Gated
// DeltaNet layers, one full-attention layer) with its full group offloaded (host pool, a small
// device cache, the ring, LSE merges) and its linear-attention states resident in the executor's
// StatePool (offload_backend.h):
//   - through the engine, greedy tokens equal the resident engine's over random ring geometries,
//     with preemption and prefix hits that restore a state snapshot (common/engine_properties.h's
//     body, which tests/gpu_models/test_gpu_linear.cpp runs on the GPU);
//   - Quest over the offloaded full group with a budget above every sequence selects every page:
//     the resident dense engine's tokens, and so does XAttention with a threshold of 1; over a
//     resident cache of several groups a policy is refused by name, pointing at KV offload;
//   - the executor's layout names the state slots beside the host blocks (no window pool);
//   - the GPU memory plan of an offloaded Qwen3-Next-80B-A3B shape: the host pool and the GPU
//     cache hold the 12 full layers' blocks, the states and their snapshots are resident and come
//     off the budget before the GPU cache; the plan's string says so.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>

#include "attention/backends/offload_backend.h"
#include "common/engine_properties.h"
#include "common/test_data.h"
#include "engine/engine_test_util.h"
#include "engine/gpu_memory_plan.h"
#include "kv/state_pool.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx {
namespace {

// Greedy tokens equal, logprobs within 1e-4 (the offload path merges partial attention by LSE,
// the resident one attends in one pass; the states are computed the same way in both).
constexpr testing::GreedyTolerance kLseMerge{1e-4, 1e-4};

std::shared_ptr<const Checkpoint> tiny_next() {
  return testing::checkpoint_of(testing::test_data_dir() + "/fixtures/tiny-qwen3-next");
}

testing::EngineSpec resident_spec() {
  testing::EngineSpec s;
  s.checkpoint = tiny_next();
  s.block_size = 8;
  s.num_blocks = 400;
  s.max_model_len = 256;
  s.max_num_batched_tokens = 32;  // chunks end on block boundaries: snapshots there
  s.max_num_seqs = 4;
  return s;
}

// A host pool of 40 blocks (320 tokens) for round one's ~400 tokens at once: preemption.
testing::EngineSpec offloaded_spec(const testing::EngineSpec& resident) {
  testing::EngineSpec s = resident;
  s.num_blocks = 40;
  s.offload_gpu_blocks = 32 / 8 + 2 * 4 + 2;  // a step's blocks and a few: the rest streams
  s.offload_slots = 2;
  s.offload_slot_blocks = 2;
  return s;
}

TEST(OffloadState, QwenNextOffloadedEqualsResident) {
  std::mt19937 rng(5);
  for (int draw = 0; draw < 3; ++draw) {
    const testing::EngineSpec resident = resident_spec();
    testing::EngineSpec off = offloaded_spec(resident);
    off.offload_gpu_blocks += rng() % 4;
    off.offload_slots = 1 + rng() % 3;
    off.offload_slot_blocks = 1 + rng() % 3;
    off.offload_write_back_lag = 1 + rng() % 3;
    SCOPED_TRACE(::testing::Message()
                 << "gpu blocks " << off.offload_gpu_blocks << " slots " << off.offload_slots << "x"
                 << off.offload_slot_blocks << " lag " << off.offload_write_back_lag);
    testing::check_state_model_offloaded_equals_resident(testing::cpu_executor, resident, off,
                                                         kLseMerge);
  }
}

TEST(OffloadState, QuestWithAWholeBudgetEqualsDense) {
  const testing::EngineSpec resident = resident_spec();
  testing::EngineSpec quest = offloaded_spec(resident);
  quest.sparse.policy = SparsePolicyKind::kQuest;
  quest.sparse.budget_tokens = 4096;
  quest.sparse.page_tokens = 8;
  testing::check_state_model_offloaded_equals_resident(testing::cpu_executor, resident, quest,
                                                       kLseMerge);
}

// XAttention's prefill masks over the offloaded full group, with a threshold of 1 (every block
// kept) from the first query block on: the dense engine's tokens. (On the GPU its block-sparse
// prefill takes head_dim 64 and 128, and the fixture's is 32: refused there by name.)
TEST(OffloadState, XAttentionWithThresholdOneEqualsDense) {
  const testing::EngineSpec resident = resident_spec();
  testing::EngineSpec x = offloaded_spec(resident);
  x.sparse.policy = SparsePolicyKind::kXAttention;
  x.sparse.threshold = 1.0;
  x.sparse.xattn_dense_tail = 0;
  x.sparse.xattn_min_len = 0;
  testing::check_state_model_offloaded_equals_resident(testing::cpu_executor, resident, x,
                                                       kLseMerge);
}

// Resident, the policy would select over one table of several groups: refused by name, with the
// way that runs it.
TEST(OffloadState, ResidentSparsePolicyIsRefusedByName) {
  CpuExecutorOptions o;
  o.block_size = 8;
  o.num_blocks = 64;
  o.max_state_seqs = 2;
  o.sparse.policy = SparsePolicyKind::kQuest;
  o.sparse.page_tokens = 8;
  try {
    make_cpu_executor(create_model(tiny_next()), o);
    ADD_FAILURE() << "quest over a resident state model was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("quest"), std::string::npos) << what;
    EXPECT_NE(what.find("KV offload"), std::string::npos) << what;
  }
}

// The backend's own checks: state groups need one full group of the geometry's layers first, are
// set once, and are not window groups; a linear layer's slots exist only after plan(), and a
// linear layer has no K/V to store.
TEST(OffloadState, BackendChecksItsStateGroups) {
  const KvGroups groups = KvGroups::from_config(tiny_next()->config, DType::kF32);
  ASSERT_EQ(groups.size(), 2);
  ASSERT_EQ(groups[0].layers, std::vector<int64_t>{3});
  StatePool states(4, 3, {4, 16, 16}, {3, 128});
  auto backend = [](int64_t layers) {
    OffloadDeviceConfig d;
    d.geometry = {layers, 8, 32, 8, 2, 2};
    d.num_qo_heads = 4;
    d.num_kv_heads = 2;
    d.head_dim = 32;
    d.dtype = DType::kF32;
    d.sm_scale = 0.25f;
    return std::make_unique<OffloadAttentionBackend>(d.geometry, make_cpu_offload_device(d));
  };
  auto expect_invalid = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
    }
  };
  auto two_layers = backend(2);  // the full group has one
  expect_invalid([&] { two_layers->set_state_groups(groups, states); }, "geometry of 2 layers");
  auto b = backend(1);
  expect_invalid([&] { b->linear_states(0); }, "linear_states before plan");
  expect_invalid([&] { b->set_window_groups(groups, *b, 32, [](std::span<const KVBlockCopy>) {}); },
                 "state groups as window groups");
  b->set_state_groups(groups, states);
  expect_invalid([&] { b->set_state_groups(groups, states); }, "set twice");
  const Tensor kv = Tensor::zeros({1, 2, 32}, DType::kF32);
  expect_invalid([&] { b->store_kv(0, kv, kv); }, "K/V of a linear layer");
}

// The engine's view: host blocks for the full group, state slots and snapshots for the linear
// layers, no window pool; the slots come back when the requests finish (the body checks blocks).
TEST(OffloadState, LayoutNamesTheResidentStateSlots) {
  CpuExecutorOptions o;
  o.block_size = 8;
  o.num_blocks = 50;
  o.offload_gpu_blocks = 8;
  o.max_state_seqs = 3;
  o.max_state_snapshots = 5;
  const auto exec = make_cpu_executor(create_model(tiny_next()), o);
  const KVBlockLayout l = exec->kv_layout();
  EXPECT_EQ(l.num_blocks, 50);
  EXPECT_EQ(l.num_window_blocks, 0);
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[0].kind, KvGroupKind::kFull);
  EXPECT_EQ(l.groups[1].kind, KvGroupKind::kState);
  EXPECT_EQ(l.num_state_slots, 3);
  EXPECT_EQ(l.num_state_snapshots, 5);
}

// Qwen3-Next-80B-A3B offloaded in 24 GiB (`longctx info --preset qwen3-next-80b-a3b --kv-offload
// --gpu-memory-limit 24GiB` prints this plan): blocks of the 12 full layers, the states of
// max_num_seqs sequences and the snapshots resident.
TEST(OffloadState, MemoryPlanKeepsTheStatesResident) {
  const ModelConfig c = dummy_preset_config("qwen3-next-80b-a3b");
  const KvGroups groups = KvGroups::from_config(c, DType::kBF16);
  ASSERT_EQ(groups.size(), 2);
  ASSERT_TRUE(groups.offloadable());
  GpuRunnerOptions o;
  o.kv_offload = true;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 4096;
  o.host_kv_bytes = 64ll << 30;
  o.max_model_len = 131072;
  o.max_state_snapshots = 16;
  // The weights do not fit 24 GiB (they are counted, not checked, by the plan): a budget of the
  // weights and 24 GiB.
  const int64_t budget = weight_bytes(c) + (24ll << 30);
  const GpuMemoryPlan p = plan_gpu_memory(c, o, budget);
  ASSERT_TRUE(p.offload());
  const int64_t layer_block = 2 * c.num_key_value_heads * c.head_dim * 2 * p.block_size;
  EXPECT_EQ(p.kv_block_bytes, 12 * layer_block);  // the full group's 12 layers
  EXPECT_EQ(p.num_window_blocks, 0);
  EXPECT_EQ(p.kv_state_bytes, 4 * groups.state_bytes_per_seq());  // no graph scratch slot
  EXPECT_EQ(p.num_state_snapshots, 16);
  EXPECT_EQ(p.kv_snapshot_bytes, 16 * groups.state_bytes_per_seq());
  EXPECT_EQ(p.num_host_blocks, (64ll << 30) / p.kv_block_bytes);
  EXPECT_GT(p.num_kv_blocks, 0);
  EXPECT_LE(p.weights + p.activations + p.workspaces + p.ring_bytes + p.offload_buffers + p.sparse +
                p.kv_state_bytes + p.kv_snapshot_bytes + p.kv_bytes(),
            budget);
  EXPECT_NE(p.str().find("resident linear-attention states"), std::string::npos) << p.str();
  // Without snapshots the GPU cache takes their bytes, block by block.
  o.max_state_snapshots = 0;
  const GpuMemoryPlan q = plan_gpu_memory(c, o, budget);
  EXPECT_EQ(q.kv_snapshot_bytes, 0);
  EXPECT_NEAR(double(q.num_kv_blocks - p.num_kv_blocks),
              double(p.kv_snapshot_bytes) / double(p.kv_block_bytes), 1.0);
  // A 24 GiB card cannot hold the bf16 weights (148 GiB): the error says by how much, and which
  // knobs the states add.
  try {
    plan_gpu_memory(c, o, 24ll << 30);
    ADD_FAILURE() << "148 GiB of weights planned into 24 GiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    const std::string what = e.what();
    EXPECT_NE(what.find("short of"), std::string::npos) << what;
    EXPECT_NE(what.find("--max-num-seqs"), std::string::npos) << what;
    EXPECT_NE(what.find("resident linear-attention states"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace longctx
