// KV offload on the GPU (H200) against the resident KV cache: the needle model's logits of every
// position of a long prompt over random geometries (block size, chunk size, ring slots and their
// size, GPU cache), the transformers fixtures (head_dim 16 / 32 / 64: the generic kernel and FA2)
// against the resident cache and transformers' greedy tokens, and the engine (batching, prefix
// caching with copy-on-write, preemption) generating the same greedy tokens. Offload merges more
// partial attentions than the resident path (in fp32), so logits are compared by KL and top-1, as
// test_gpu_models does for GPU vs CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "common/test_data.h"
#include "gpu_models/gpu_executor.h"
#include "longctx/core/error.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/llm.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

std::string needle_dir() { return longctx::testing::needle_v1_dir(); }

std::shared_ptr<const Checkpoint> needle() {
  static auto ck = std::make_shared<const Checkpoint>(load_checkpoint(needle_dir()));
  return ck;
}

std::shared_ptr<Model> gpu_model() {
  ModelBuildOptions o;
  o.device = Device::cuda(0);
  return create_model(needle(), o);
}

struct Diff {
  double max_kl = 0, mean_kl = 0, max_abs = 0;
  int64_t agree = 0, compared = 0;
};

// Per position: KL(ref || got) of the softmaxes, |logit| differences, top-1 where ref's margin
// is over 0.05.
Diff compare(const Tensor& ref, const Tensor& got) {
  Diff d;
  const int64_t n = ref.size(0), v = ref.size(1);
  for (int64_t r = 0; r < n; ++r) {
    const float* a = ref.data<float>() + r * v;
    const float* b = got.data<float>() + r * v;
    double ma = a[0], mb = b[0];
    for (int64_t i = 0; i < v; ++i)
      ma = std::max<double>(ma, a[i]), mb = std::max<double>(mb, b[i]);
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < v; ++i) sa += std::exp(a[i] - ma), sb += std::exp(b[i] - mb);
    double kl = 0;
    int64_t top1 = 0, top2 = -1, got1 = 0;
    for (int64_t i = 0; i < v; ++i) {
      const double la = a[i] - ma - std::log(sa), lb = b[i] - mb - std::log(sb);
      kl += std::exp(la) * (la - lb);
      d.max_abs = std::max<double>(d.max_abs, std::fabs(a[i] - b[i]));
      if (a[i] > a[top1]) top1 = i;
      if (b[i] > b[got1]) got1 = i;
    }
    for (int64_t i = 0; i < v; ++i)
      if (i != top1 && (top2 < 0 || a[i] > a[top2])) top2 = i;
    d.max_kl = std::max(d.max_kl, kl);
    d.mean_kl += kl / n;
    if (a[top1] - a[top2] > 0.05) {
      ++d.compared;
      d.agree += got1 == top1;
    }
  }
  return d;
}

std::vector<int32_t> prompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 2000);
  return ids;
}

TEST(GpuOffload, RandomGeometriesMatchTheResidentCache) {
  std::mt19937 rng(17);
  const auto ids = prompt(3000, 1);
  // LONGCTX_OFFLOAD_DRAWS: fewer draws (compute-sanitizer runs).
  const char* env = std::getenv("LONGCTX_OFFLOAD_DRAWS");
  const int draws = env != nullptr ? std::atoi(env) : 12;
  for (int draw = 0; draw < draws; ++draw) {
    GpuRunnerOptions r;
    const int64_t block_sizes[] = {16, 32, 64, 128};
    const int64_t chunks[] = {128, 256, 512, 1000};
    r.block_size = block_sizes[rng() % 4];
    r.max_num_batched_tokens = chunks[rng() % 4];
    r.max_num_seqs = 4;
    r.max_model_len = 4096;
    r.num_gpu_blocks = 4096 / r.block_size + 4;
    r.enforce_eager = true;
    const Tensor ref =
        make_gpu_session(std::make_shared<GpuRunner>(gpu_model(), r)).prompt_logits(ids);

    GpuRunnerOptions o = r;
    o.kv_offload = true;
    o.host_kv_bytes = 64ll << 20;
    o.offload_slots = 1 + rng() % 8;
    o.offload_slot_tokens = r.block_size * (1 + rng() % 8);
    const int64_t need = (r.max_num_batched_tokens + r.block_size - 1) / r.block_size + 2 * 4;
    o.num_gpu_blocks = need + rng() % 8;  // most of the prompt streams through the ring
    auto off = std::make_shared<GpuRunner>(gpu_model(), o);
    const Tensor got = make_gpu_session(off).prompt_logits(ids);
    const GpuRunner::OffloadCounters c = off->offload_counters();
    const Diff d = compare(ref, got);
    std::printf(
        "block %lld chunk %lld slots %lld x %lld tokens, GPU cache %lld blocks: ring loads %lld "
        "blocks, KL max %.2e mean %.2e, |dlogit| max %.3f, top-1 %lld/%lld\n",
        (long long)r.block_size, (long long)r.max_num_batched_tokens, (long long)o.offload_slots,
        (long long)o.offload_slot_tokens, (long long)o.num_gpu_blocks,
        (long long)c.ring_blocks_loaded, d.max_kl, d.mean_kl, d.max_abs, (long long)d.agree,
        (long long)d.compared);
    EXPECT_GT(c.ring_blocks_loaded, 0);
    EXPECT_LE(d.max_kl, 1e-3);
    ASSERT_GT(d.compared, 0);
    EXPECT_GE(double(d.agree) / d.compared, 0.999);
  }
}

// A GPU cache of a few blocks: nearly all of a 515-token prompt streams through the ring.
void shrink_to_offload(GpuRunnerOptions& o) {
  o.kv_offload = true;
  o.host_kv_bytes = 64ll << 20;
  o.offload_slots = 2;
  o.offload_slot_tokens = 3 * o.block_size;
  o.num_gpu_blocks = (o.max_num_batched_tokens + o.block_size - 1) / o.block_size + 2 * 4 + 2;
}

TEST(GpuOffload, FixturesMatchTheResidentCacheAndTransformers) {
  for (const std::string name : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    const ReferenceCase ref = reference_case(name, 515);
    ASSERT_FALSE(ref.greedy_new_tokens.empty()) << name;
    auto ck = std::make_shared<const Checkpoint>(load_checkpoint(fixture_dir(name)));
    ModelBuildOptions mo;
    mo.device = Device::cuda(0);
    mo.rope_inv_freq_dtype = DType::kBF16;  // as the fixtures' reference
    mo.activation_dtype = DType::kF16;      // test_gpu_models: the fixtures' KL cases
    GpuRunnerOptions r;
    r.block_size = 16;
    r.max_num_batched_tokens = 128;  // 515 tokens: 5 chunks, each over the earlier ones
    r.max_num_seqs = 4;
    r.max_model_len = 1024;
    r.num_gpu_blocks = 1024 / 16 + 4;
    r.enforce_eager = true;
    const Tensor want = make_gpu_session(std::make_shared<GpuRunner>(create_model(ck, mo), r))
                            .prompt_logits(ref.input_ids);
    GpuRunnerOptions o = r;
    shrink_to_offload(o);
    auto off = std::make_shared<GpuRunner>(create_model(ck, mo), o);
    const Tensor got = make_gpu_session(off).prompt_logits(ref.input_ids);
    const Diff d = compare(want, got);
    const GpuRunner::OffloadCounters c = off->offload_counters();
    std::printf(
        "%s: ring loads %lld blocks, KL max %.2e mean %.2e, |dlogit| max %.4f, top-1 "
        "%lld/%lld\n",
        name.c_str(), (long long)c.ring_blocks_loaded, d.max_kl, d.mean_kl, d.max_abs,
        (long long)d.agree, (long long)d.compared);
    EXPECT_GT(c.ring_blocks_loaded, 0) << name;
    EXPECT_LE(d.max_kl, 1e-3) << name;
    ASSERT_GT(d.compared, 0) << name;
    EXPECT_GE(double(d.agree) / d.compared, 0.999) << name;

    // Generation through the engine: transformers' greedy tokens, as the resident path gives them
    // (tests/gpu_models/test_gpu_models.cpp), diverging only where transformers' margin is tiny.
    EngineConfig cfg;
    cfg.model = fixture_dir(name);
    cfg.device = "cuda";
    cfg.model_options.rope_inv_freq_dtype = mo.rope_inv_freq_dtype;
    cfg.model_options.activation_dtype = mo.activation_dtype;
    cfg.block_size = o.block_size;
    cfg.max_num_batched_tokens = o.max_num_batched_tokens;
    cfg.max_num_seqs = o.max_num_seqs;
    cfg.max_model_len = 1024;
    cfg.enforce_eager = true;
    cfg.kv_offload = true;
    cfg.num_gpu_blocks = o.num_gpu_blocks;
    cfg.host_kv_budget = o.host_kv_bytes;
    cfg.offload_slots = o.offload_slots;
    cfg.offload_slot_tokens = o.offload_slot_tokens;
    LLM llm(cfg);
    SamplingParams sp;
    sp.temperature = 0;
    sp.ignore_eos = true;
    sp.max_tokens = static_cast<int64_t>(ref.greedy_new_tokens.size());
    const auto out = llm.generate({ref.input_ids}, sp, false);
    ASSERT_EQ(out.size(), 1u);
    const auto& toks = out[0].token_ids;
    size_t i = 0;
    while (i < toks.size() && i < ref.greedy_new_tokens.size() &&
           toks[i] == ref.greedy_new_tokens[i])
      ++i;
    if (i < ref.greedy_new_tokens.size())
      EXPECT_LT(ref.greedy_margins[i], 0.05)
          << name << ": token " << i << " differs (" << toks[i] << " vs "
          << ref.greedy_new_tokens[i] << ", margin " << ref.greedy_margins[i] << ")";
    std::printf("%s through offload: %zu/%zu of transformers' greedy tokens\n", name.c_str(), i,
                ref.greedy_new_tokens.size());
  }
}

// The engine (batching, prefix caching with copy-on-write, preemption in a host pool of 160
// blocks) over a tight GPU cache: common/engine_properties.h's body, which tests/engine runs on
// the CPU simulation.
TEST(GpuOffload, EngineGeneratesTheResidentTokens) {
  auto ps = shared_prefix_prompts(12, 700, 100, 50, 300, 2000, 9);
  const std::vector<int32_t> whole_blocks(ps[0].begin(), ps[0].begin() + 32);
  ps.push_back(whole_blocks);  // whole blocks of the shared prefix
  EngineSpec resident;
  resident.checkpoint = needle();
  resident.max_model_len = 2048;
  resident.block_size = 16;
  resident.num_blocks = 4096;
  resident.max_num_batched_tokens = 256;
  resident.max_num_seqs = 8;
  EngineSpec off = resident;
  off.offload_gpu_blocks = 256 / 16 + 2 * 8 + 6;  // a tight GPU cache
  // Up to 65 blocks a request, 44 of the shared prefix and ~21 of its own: 8 running need ~210.
  // The pool of 160 did not preempt on an H100 (d355f3d: the scheduler admitted fewer at once),
  // so preemption is printed here, not required.
  off.num_blocks = 160;
  off.offload_slots = 3;
  off.offload_slot_blocks = 4;
  check_offloaded_engine_equals_resident(GpuExecutorFactory{.enforce_eager = true}, resident, off,
                                         ps, 40, {0.02, 0},
                                         {.preemption = false, .prefix_hits = true});
}

TEST(GpuOffload, UnpinnableHostPoolIsAClearError) {
  GpuRunnerOptions o;
  o.block_size = 16;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 2;
  o.max_model_len = 2048;
  o.kv_offload = true;
  o.num_gpu_blocks = 64;
  o.host_kv_bytes = 16ll << 40;  // 16 TiB
  try {
    GpuRunner r(gpu_model(), o);
    FAIL() << "16 TiB of pinned memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("host-kv-budget"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace longctx::testing
