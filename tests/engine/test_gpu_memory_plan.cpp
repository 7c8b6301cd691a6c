// The GPU memory plan is arithmetic on the config: testable without a GPU.
#include <gtest/gtest.h>

#include "engine/cuda_graphs.h"
#include "engine/gpu_memory_plan.h"
#include "loader/quantize_checkpoint.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/error.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/checkpoint.h"

namespace longctx {
namespace {

constexpr int64_t kGiB = 1ll << 30;

TEST(GpuMemoryPlan, Llama8BOnAnH200SizedBudget) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  const GpuMemoryPlan p = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_EQ(p.weights, 8030261248ll * 2);  // 8.03 B parameters in bf16
  EXPECT_EQ(p.block_size, kDefaultBlockSize);
  EXPECT_EQ(p.kv_block_bytes, 2ll * 32 * kDefaultBlockSize * 8 * 128 * 2);
  EXPECT_EQ(p.max_model_len, 131072);
  EXPECT_LE(p.weights + p.activations + p.workspaces + p.kv_bytes(), p.budget);
  EXPECT_GT(p.budget - (p.weights + p.activations + p.workspaces + p.kv_bytes()), -1);
  EXPECT_GE(p.kv_tokens(), 4 * 131072);  // ~90 GiB of KV: over 700K tokens
}

// Qwen3-30B-A3B: 30.53 B parameters, of which the routed experts are 48 layers x 128 experts x
// 3 x 2048 x 768; the MoE activations (per routed slot, fp32) cost more per token than the
// unused dense MLP of intermediate_size would.
TEST(GpuMemoryPlan, Qwen3MoeCountsTheExperts) {
  const ModelConfig c = dummy_preset_config("qwen3-30b-a3b");
  GpuRunnerOptions o;
  o.max_model_len = 32768;
  const GpuMemoryPlan p = plan_gpu_memory(c, o, 140 * kGiB);
  EXPECT_EQ(p.weights, 30532122624ll * 2);
  EXPECT_EQ(p.expert_weights, 48ll * 128 * 3 * 2048 * 768 * 2);
  EXPECT_NE(p.str().find("routed experts 54.0 GiB"), std::string::npos) << p.str();
  ModelConfig dense = c;
  dense.moe = {};
  EXPECT_GT(activation_bytes_per_token(c), activation_bytes_per_token(dense));
  EXPECT_GT(p.workspaces, plan_gpu_memory(dense, o, 140 * kGiB).workspaces);
  EXPECT_LE(p.weights + p.activations + p.workspaces + p.graphs + p.kv_bytes(), p.budget);
  EXPECT_GE(p.kv_tokens(), 20 * 32768);  // ~78 GiB of KV at 96 KiB per token
}

// FP8 block experts stay packed on the GPU (ops::moe_runs_fp8_experts): the plan counts each
// routed expert weight as a byte plus one f32 scale per 128 x 128 block, so Qwen3-Next-80B-A3B in
// FP8 (72 GiB of experts, 144 in bf16) fits an H200-sized budget; the MoE buffers take the
// cuBLASLt path's one-expert scratch (2 x 512 x 2048 bf16) on top of the bf16 model's.
TEST(GpuMemoryPlan, Fp8ExpertsAreCountedPacked) {
  ModelConfig c = dummy_preset_config("qwen3-next-80b-a3b");
  GpuRunnerOptions o;
  o.max_model_len = 32768;
  const GpuMemoryPlan bf16 = plan_gpu_memory(c, o, 200 * kGiB);
  c.quantization = quant_config_for(QuantFormatOptions{});  // fp8, 128 x 128 blocks
  const GpuMemoryPlan fp8 = plan_gpu_memory(c, o, 130 * kGiB);
  const int64_t experts = 48ll * 512 * 3 * 2048 * 512;
  EXPECT_EQ(bf16.expert_weights, experts * 2);
  EXPECT_EQ(fp8.expert_weights, experts + 48ll * 512 * 3 * (2048 / 128) * (512 / 128) * 4);
  EXPECT_LT(fp8.weights, 80 * kGiB) << fp8.str();
  EXPECT_EQ(fp8.workspaces - bf16.workspaces, 2ll * 512 * 2048 * 2);
  EXPECT_LE(fp8.weights + fp8.activations + fp8.workspaces + fp8.graphs + fp8.kv_bytes(),
            fp8.budget);
}

TEST(GpuMemoryPlan, A24GiBCardCannotHoldA128KSequenceButHolds32K) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  try {
    plan_gpu_memory(c, o, 24 * kGiB);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("max_model_len 131072"), std::string::npos) << e.what();
  }
  o.max_model_len = 32768;
  const GpuMemoryPlan p = plan_gpu_memory(c, o, 24 * kGiB);
  EXPECT_GE(p.kv_tokens(), 32768);
  EXPECT_LE(p.weights + p.activations + p.workspaces + p.kv_bytes(), 24 * kGiB);
}

TEST(GpuMemoryPlan, ExplicitBlockCountIsKept) {
  const ModelConfig c = dummy_preset_config("qwen3-0.6b");
  GpuRunnerOptions o;
  o.num_gpu_blocks = 1000;
  o.block_size = 16;
  o.max_model_len = 8192;  // 512 blocks per sequence
  const GpuMemoryPlan p = plan_gpu_memory(c, o, 40 * kGiB);
  EXPECT_EQ(p.num_kv_blocks, 1000);
  EXPECT_EQ(p.kv_tokens(), 16000);
}

// A sparse policy's buffers come out of the KV cache's share: xattention's estimate and masks are
// sized by the step limits and the context, quest's metadata by the blocks.
TEST(GpuMemoryPlan, SparseBuffersAreReservedBeforeTheKvCache) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  o.max_num_batched_tokens = 8192;
  o.max_num_seqs = 16;
  const GpuMemoryPlan full = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_EQ(full.sparse, 0);
  o.sparse.policy = SparsePolicyKind::kXAttention;
  const GpuMemoryPlan x = plan_gpu_memory(c, o, 120 * kGiB);
  // 32 q heads x (8192 / 8 + 16) query groups x 1024 key blocks x 4 bytes, and the masks.
  EXPECT_EQ(x.sparse, 32ll * 1024 * ((8192 / 8 + 16) * 4 + (8192 / 128 + 16)));
  EXPECT_LE(x.num_kv_blocks * x.kv_block_bytes + x.sparse,
            full.num_kv_blocks * full.kv_block_bytes + x.kv_block_bytes);
  EXPECT_LT(x.num_kv_blocks, full.num_kv_blocks);
  o.sparse.policy = SparsePolicyKind::kQuest;
  const GpuMemoryPlan q = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_GT(q.sparse, 0);
  EXPECT_LT(q.num_kv_blocks, full.num_kv_blocks);
  // Page reuse keeps, per sequence that keeps pages and layer, the lists (pages and block ids)
  // and the K / V rows of the budget's 256 pages of 16 tokens (8 KV heads x 128, bf16); the
  // metadata of the blocks it costs (32 layers x 8 pages of 16 x 8 KV heads x min / max x 128 x
  // 2 bytes a block of 128) is saved.
  const int64_t per_seq = 32ll * (2 * 8 * 256 * 4 + 2 * 256 * 16 * 8 * 128 * 2);
  const int64_t meta_block = 32ll * (kDefaultBlockSize / 16) * 8 * 2 * 128 * 2;
  o.sparse.quest_reuse = true;
  o.sparse.quest_reuse_seqs = 2;
  const GpuMemoryPlan r = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_LT(r.num_kv_blocks, q.num_kv_blocks);
  EXPECT_EQ(r.sparse - q.sparse, 2 * per_seq - (q.num_kv_blocks - r.num_kv_blocks) * meta_block);
  o.sparse.quest_reuse_seqs = 100;  // at most every sequence of a step (16)
  const GpuMemoryPlan all = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_EQ(all.sparse - q.sparse,
            16 * per_seq - (q.num_kv_blocks - all.num_kv_blocks) * meta_block);
}

// The staged FP8 prefill's pool at the default cap for Llama-3.1-8B's layer (8 KV heads x 128):
// 128K keys of bf16 K and V, and a 4-byte index per page of 128 tokens.
constexpr int64_t kStagePool = (int64_t(512) << 20) + 4096;

// --kv-cache-dtype fp8: a block costs its codes (one byte an element) plus one fp32 scale per
// (layer, KV head) for K and for V, so the same budget holds about twice the tokens; the resident
// plan sizes the GPU pool from those bytes, after the staged prefill's pool (a workspace; none
// with --prefill-fp8-stage 0).
TEST(GpuMemoryPlan, Fp8KvCacheCountsCodesAndScales) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  const GpuMemoryPlan bf16 = plan_gpu_memory(c, o, 120 * kGiB);
  o.kv_dtype = DType::kFP8E4M3;
  const GpuMemoryPlan fp8 = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_EQ(fp8.kv_block_bytes, 2ll * 32 * (kDefaultBlockSize * 8 * 128 + 8 * 4));
  EXPECT_EQ(fp8.weights, bf16.weights);
  EXPECT_EQ(fp8.workspaces, bf16.workspaces + kStagePool);
  EXPECT_LE(fp8.weights + fp8.activations + fp8.workspaces + fp8.kv_bytes(), fp8.budget);
  // The same bytes for KV less the pool (within a block of each), so 1.9995x the blocks of those
  // bytes (the scales cost 0.05 %).
  EXPECT_GE(fp8.kv_bytes() + kStagePool + fp8.kv_block_bytes, bf16.kv_bytes());
  EXPECT_LE(fp8.kv_bytes() + kStagePool, bf16.kv_bytes() + bf16.kv_block_bytes);
  EXPECT_GE(double(fp8.num_kv_blocks) * fp8.kv_block_bytes / double(bf16.kv_bytes() - kStagePool),
            0.999);
  EXPECT_GE(double(fp8.num_kv_blocks) / double(bf16.num_kv_blocks), 1.98);
  o.tuning.prefill.fp8_stage_mib = 0;  // in-kernel conversion only: no pool
  const GpuMemoryPlan unstaged = plan_gpu_memory(c, o, 120 * kGiB);
  EXPECT_EQ(unstaged.workspaces, bf16.workspaces);
  EXPECT_GE(double(unstaged.num_kv_blocks) / double(bf16.num_kv_blocks), 1.99);
  // A short max_model_len needs a smaller pool: every running sequence's pages.
  o.tuning.prefill.fp8_stage_mib = 512;
  o.max_model_len = 4096;
  o.max_num_seqs = 4;
  const GpuMemoryPlan small = plan_gpu_memory(c, o, 120 * kGiB);
  o.kv_dtype = DType::kBF16;
  const GpuMemoryPlan small_bf16 = plan_gpu_memory(c, o, 120 * kGiB);
  // 128 pages of 128 tokens: K and V in bf16, and 128 indices.
  EXPECT_EQ(small.workspaces - small_bf16.workspaces, int64_t(4) * 4096 * 8 * 128 * 2 * 2 + 512);
}

// --kv-cache-dtype fp8 with --kv-offload (issue 47's 24 GiB card at 128K): the host pool, the GPU
// cache and the ring are counted in FP8 blocks (OffloadDeviceConfig::layer_block_bytes() per
// layer, as the CUDA device allocates them), so the same budgets hold about twice the blocks and
// a ring slot of the same tokens costs half.
TEST(GpuMemoryPlan, Fp8KvOffloadCountsFp8Blocks) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  o.kv_offload = true;
  o.max_model_len = 131072;
  o.max_num_seqs = 2;
  o.max_num_batched_tokens = 8192;
  o.host_kv_bytes = 40 * kGiB;
  const GpuMemoryPlan bf16 = plan_gpu_memory(c, o, 24 * kGiB);
  o.kv_dtype = DType::kFP8E4M3;
  const GpuMemoryPlan fp8 = plan_gpu_memory(c, o, 24 * kGiB);
  ASSERT_TRUE(bf16.offload() && fp8.offload());
  const int64_t layer_block = 2 * (kDefaultBlockSize * 8 * 128 + 8 * 4);
  EXPECT_EQ(fp8.kv_block_bytes, 32 * layer_block);
  EXPECT_EQ(fp8.slot_blocks, bf16.slot_blocks);  // slots of the same tokens
  EXPECT_EQ(fp8.ring_bytes, o.offload_slots * fp8.slot_blocks * layer_block);
  EXPECT_LT(double(fp8.ring_bytes) / double(bf16.ring_bytes), 0.501);
  EXPECT_LE(fp8.host_kv_bytes(), 40 * kGiB);
  EXPECT_GE(double(fp8.num_host_blocks) / double(bf16.num_host_blocks), 1.99);
  // The GPU cache: twice the blocks of what the staged prefill's pool leaves.
  EXPECT_EQ(fp8.workspaces, bf16.workspaces + kStagePool);
  EXPECT_GE(double(fp8.num_kv_blocks) * fp8.kv_block_bytes / double(bf16.kv_bytes() - kStagePool),
            0.99);
  EXPECT_LE(fp8.weights + fp8.activations + fp8.workspaces + fp8.kv_bytes() + fp8.ring_bytes +
                fp8.offload_buffers,
            fp8.budget);
}

// Which runs capture decode graphs, and so hold their memory: quest's decode steps do, resident
// and offloaded (they skip the ring); streaming's do not; offloaded dense steps do not (the
// ring's copies follow each step), nor do offloaded models of several KV groups.
TEST(GpuMemoryPlan, GraphsUnderQuestResidentAndOffloaded) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  const KvGroups groups = KvGroups::from_config(c, DType::kBF16);
  GpuRunnerOptions o;
  o.max_model_len = 32768;
  o.max_num_seqs = 4;
  o.sparse.policy = SparsePolicyKind::kQuest;
  EXPECT_TRUE(decode_graphs(o, groups));
  EXPECT_GT(plan_gpu_memory(c, o, 40 * kGiB).graphs, 0);
  GpuRunnerOptions eager = o;
  eager.enforce_eager = true;
  EXPECT_FALSE(decode_graphs(eager, groups));
  EXPECT_EQ(plan_gpu_memory(c, eager, 40 * kGiB).graphs, 0);
  GpuRunnerOptions streaming = o;
  streaming.sparse.policy = SparsePolicyKind::kStreaming;
  EXPECT_FALSE(decode_graphs(streaming, groups));
  GpuRunnerOptions offload = o;
  offload.kv_offload = true;
  offload.host_kv_bytes = 8 * kGiB;
  EXPECT_TRUE(decode_graphs(offload, groups));
  const GpuMemoryPlan p = plan_gpu_memory(c, offload, 24 * kGiB);
  ASSERT_TRUE(p.offload());
  EXPECT_EQ(p.graphs, decode_graph_memory_bytes(c, o.max_num_seqs));
  GpuRunnerOptions dense = offload;
  dense.sparse.policy = SparsePolicyKind::kFull;
  EXPECT_FALSE(decode_graphs(dense, groups));
  EXPECT_EQ(plan_gpu_memory(c, dense, 24 * kGiB).graphs, 0);
  // The offloaded GPU cache pays for the graphs.
  GpuRunnerOptions offload_eager = offload;
  offload_eager.enforce_eager = true;
  EXPECT_LT(p.kv_bytes(), plan_gpu_memory(c, offload_eager, 24 * kGiB).kv_bytes());
  const KvGroups several = KvGroups::from_config(dummy_preset_config("gemma-3-12b"), DType::kBF16);
  ASSERT_FALSE(several.single_full());
  EXPECT_FALSE(decode_graphs(offload, several));
  EXPECT_TRUE(decode_graphs(o, several));
}

// The graphs' buckets stop at the step's token budget (the runner captures none larger), and so
// does the memory the plan keeps for them.
TEST(GpuMemoryPlan, GraphMemoryStopsAtTheTokenBudget) {
  const ModelConfig c = dummy_preset_config("llama-3.1-8b");
  GpuRunnerOptions o;
  o.max_model_len = 8192;
  o.max_num_seqs = 256;
  o.max_num_batched_tokens = 8192;
  EXPECT_EQ(decode_graph_max_seqs(o), 256);
  EXPECT_EQ(plan_gpu_memory(c, o, 40 * kGiB).graphs, decode_graph_memory_bytes(c, 256));
  o.max_num_batched_tokens = 16;
  EXPECT_EQ(decode_graph_max_seqs(o), 16);
  EXPECT_EQ(plan_gpu_memory(c, o, 40 * kGiB).graphs, decode_graph_memory_bytes(c, 16));
}

}  // namespace
}  // namespace longctx
