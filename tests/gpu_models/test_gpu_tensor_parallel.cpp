// Tensor parallelism's GPU pieces with the one GPU this machine has: an NCCL communicator of one
// rank (its all-reduce and column gather), and a model holding it (every collective of a sharded
// forward runs through NCCL: the vocab-parallel embedding, the row-parallel all-reduces, the
// gathered logits) equal to the whole model bit for bit, eagerly, with the engine's CUDA graphs
// capturing the collectives, and with the KV offloaded. Two ranks need two GPUs
// (docs/tensor_parallel.md).
#include <gtest/gtest.h>

#include <cstring>

#include "longctx/core/communicator.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/llm.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

Tensor random_on_gpu(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor h = Tensor::empty(shape, DType::kF32);
  uint32_t x = seed;
  for (int64_t i = 0; i < h.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    h.data<float>()[i] = float(x >> 8) / float(1 << 24) - 0.5f;
  }
  return h.to_dtype(dtype).to(Device::cuda(0));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * dtype_size(x.dtype())) == 0;
}

TEST(GpuTensorParallel, OneRankNcclCollectives) {
  auto comms = make_nccl_communicators({0});
  ASSERT_EQ(comms.size(), 1u);
  Communicator& c = *comms[0];
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor x = random_on_gpu({37, 129}, dt, 3);
    const Tensor before = x.to(Device::cpu());
    c.all_reduce_sum(x);
    EXPECT_TRUE(same_bits(before, x)) << dtype_name(dt);
  }
  Tensor local = random_on_gpu({5, 1000}, DType::kF32, 4);
  Tensor out = Tensor::empty({5, 1000}, DType::kF32, Device::cuda(0));
  c.all_gather_columns(local, out);
  EXPECT_TRUE(same_bits(local, out));
  Tensor wrong = Tensor::empty({5, 999}, DType::kF32, Device::cuda(0));
  EXPECT_THROW(c.all_gather_columns(local, wrong), Error);
}

TEST(GpuTensorParallel, OneNcclRankModelEqualsTheWholeModel) {
  for (const std::string name : {"tiny-llama3", "tiny-qwen3"}) {
    auto ck = std::make_shared<const Checkpoint>(load_checkpoint(fixture_dir(name)));
    ModelBuildOptions o;
    o.device = Device::cuda(0);
    o.rope_inv_freq_dtype = DType::kBF16;
    o.activation_dtype = DType::kF16;
    GpuRunnerOptions r;
    r.block_size = 16;
    r.max_model_len = 1024;
    r.max_num_batched_tokens = 256;
    r.max_num_seqs = 4;
    r.num_gpu_blocks = 256;
    r.enforce_eager = true;
    const ReferenceCase ref = reference_case(name, 515);
    const Tensor want = make_gpu_session(std::make_shared<GpuRunner>(create_model(ck, o), r))
                            .prompt_logits(ref.input_ids);
    ModelBuildOptions t = o;
    t.communicator = make_nccl_communicators({0})[0];
    ExecutorSession one_rank =
        make_gpu_session(std::make_shared<GpuRunner>(create_model(ck, t), r));
    EXPECT_TRUE(same_bits(want, one_rank.prompt_logits(ref.input_ids))) << name;

    // Through the engine with CUDA graphs: the decode graphs capture the NCCL collectives.
    auto generate = [&](const ModelBuildOptions& mo) {
      EngineConfig cfg;
      cfg.model = fixture_dir(name);
      cfg.device = "cuda";
      cfg.model_options = mo;
      cfg.block_size = 16;
      cfg.max_num_batched_tokens = 256;
      cfg.max_num_seqs = 4;
      cfg.max_model_len = 1024;
      cfg.num_gpu_blocks = 256;
      LLM llm(cfg);
      SamplingParams sp;
      sp.temperature = 0;
      sp.ignore_eos = true;
      sp.max_tokens = 24;
      sp.logprobs = 1;
      return llm.generate(
          {ref.input_ids, std::vector<int32_t>(ref.input_ids.begin(), ref.input_ids.begin() + 100)},
          sp, false);
    };
    const auto a = generate(o);
    ModelBuildOptions t2 = o;
    t2.communicator = make_nccl_communicators({0})[0];
    const auto b = generate(t2);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token_ids, b[i].token_ids) << name;
      for (size_t k = 0; k < a[i].logprobs.size(); ++k)
        EXPECT_EQ(a[i].logprobs[k].logprob, b[i].logprobs[k].logprob) << name << " " << k;
    }
  }
}

// Offload per rank: a rank's runner keeps its KV heads in its own host pool; with one NCCL rank
// and a GPU cache of a few blocks (most of the prompt through the ring) the logits are the whole
// model's offloaded logits, bit for bit.
TEST(GpuTensorParallel, OffloadWithOneNcclRank) {
  auto ck = std::make_shared<const Checkpoint>(load_checkpoint(fixture_dir("tiny-qwen3")));
  ModelBuildOptions o;
  o.device = Device::cuda(0);
  o.rope_inv_freq_dtype = DType::kBF16;
  o.activation_dtype = DType::kF16;
  GpuRunnerOptions r;
  r.block_size = 16;
  r.max_model_len = 1024;
  r.max_num_batched_tokens = 128;
  r.max_num_seqs = 4;
  r.enforce_eager = true;
  r.kv_offload = true;
  r.host_kv_bytes = 64ll << 20;
  r.offload_slots = 2;
  r.offload_slot_tokens = 48;
  r.num_gpu_blocks = 128 / 16 + 2 * 4 + 2;
  const ReferenceCase ref = reference_case("tiny-qwen3", 515);
  const Tensor want = make_gpu_session(std::make_shared<GpuRunner>(create_model(ck, o), r))
                          .prompt_logits(ref.input_ids);
  ModelBuildOptions t = o;
  t.communicator = make_nccl_communicators({0})[0];
  auto one_rank = std::make_shared<GpuRunner>(create_model(ck, t), r);
  EXPECT_TRUE(same_bits(want, make_gpu_session(one_rank).prompt_logits(ref.input_ids)));
  EXPECT_GT(one_rank->offload_counters().ring_blocks_loaded, 0);
}

}  // namespace
}  // namespace longctx::testing
