// StreamingLLM (attention/sparse/streaming.cpp) on the GPU, through the registry's CUDA twin, on
// random K / V / q written by the backends' own store_kv over prefill chunks and decode steps:
//   - the resident paged backend equals the CPU engine's backend with the CPU policy on the same
//     values (keys and queries small integers, so every score is exact): prefill chunks under the
//     policy's block masks (the block-sparse prefill) and decode steps over its pages (the page
//     list, gather and split-KV decode of quest's path), within bf16 output rounding;
//   - the offload device (a GPU cache much smaller than the context; decode pages read from the
//     host in place, prefill keys staged as xattention's) gives the resident output bit for bit;
//   - streaming differs from dense attention (it drops keys);
//   - the engine generates with streaming, resident and offloaded, and the two agree.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "attention/backends/paged_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "common/test_data.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "longctx/engine/sampling_params.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

struct Geometry {
  int64_t block_size = 64, hq = 8, hkv = 2, d = 128, chunk = 256;
  std::vector<int64_t> lens = {1500, 777};
  SparseOptions streaming;
  Geometry() {
    streaming.policy = parse_sparse_policy("streaming");
    streaming.page_tokens = 16;
    streaming.sink_tokens = 20;
    streaming.window_tokens = 200;
  }
};

// bf16 values on the GPU and the same values in f32 on the host.
struct Rows {
  Tensor gpu, cpu;
};
Rows random_rows(int64_t t, int64_t h, int64_t d, std::mt19937& rng, bool integer) {
  Tensor x = Tensor::empty({t, h, d}, DType::kF32);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = integer ? float(int(rng() % 5) - 2) : n01(rng);
  Tensor b = x.to_dtype(DType::kBF16);
  return {b.to(Device::cuda(0)), b.to_dtype(DType::kF32)};
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

void check_geometry(const Geometry& g, int decodes) {
  SCOPED_TRACE(::testing::Message()
               << "block " << g.block_size << " page " << g.streaming.page_tokens << " sink "
               << g.streaming.sink_tokens << " window " << g.streaming.window_tokens << " d "
               << g.d);
  const int64_t bs = g.block_size, n = static_cast<int64_t>(g.lens.size());
  int64_t blocks = 0;
  for (int64_t len : g.lens) blocks += (len + decodes + bs - 1) / bs;
  PagedKVPoolConfig kv{1, g.hkv, g.d, bs, blocks + 2, DType::kBF16, Device::cuda(0)};
  PagedKVPool pool(kv), dense_pool(kv);
  PagedKVPoolConfig cpu_kv = kv;
  cpu_kv.dtype = DType::kF32;
  cpu_kv.device = Device::cpu();
  PagedKVPool cpu_pool(cpu_kv);
  PagedBackendLimits limits{g.chunk * 4, 8, 4 * blocks, 8192};
  const float scale = 1.f / std::sqrt(float(g.d));
  auto resident = make_paged_attention_backend(pool, g.hq, scale, limits, g.streaming);
  auto dense = make_paged_attention_backend(dense_pool, g.hq, scale, limits);
  OffloadDeviceConfig d;
  d.geometry = {1, bs, blocks + 2, 4 * g.chunk / bs + 4, 2, 3};
  d.num_qo_heads = g.hq;
  d.num_kv_heads = g.hkv;
  d.head_dim = g.d;
  d.sm_scale = scale;
  d.device = Device::cuda(0);
  d.max_tokens = g.chunk * 4;
  d.max_seqs = 8;
  d.sparse = g.streaming;
  d.max_model_len = 8192;
  OffloadAttentionBackend offload(d.geometry, make_cuda_offload_device(d));
  auto policy =
      sparse::make_sparse_policy(g.streaming, {1, blocks + 2, bs, g.hq, g.hkv, g.d, scale});
  CpuPagedBackend cpu(cpu_pool, scale, policy.get());

  std::mt19937 rng(23);
  std::vector<std::vector<int32_t>> tables(n), tokens(n);
  int32_t next = 0;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t b = 0; b < (g.lens[s] + decodes + bs - 1) / bs; ++b) tables[s].push_back(next++);
    tokens[s].assign(g.lens[s] + decodes, 1);
  }
  int sparse_prefills = 0, steps = 0;
  auto step = [&](const std::vector<StepInput>& in, const char* what) {
    SCOPED_TRACE(::testing::Message() << what << " step " << steps++);
    ForwardBatch batch = make_forward_batch(in, bs);
    const int64_t t = batch.num_tokens();
    const Rows k = random_rows(t, g.hkv, g.d, rng, true),
               v = random_rows(t, g.hkv, g.d, rng, false), q = random_rows(t, g.hq, g.d, rng, true);
    std::vector<Tensor> outs;
    for (AttentionBackend* be :
         {resident.get(), static_cast<AttentionBackend*>(&offload), dense.get()}) {
      be->plan(batch);
      be->store_kv(0, k.gpu, v.gpu);
      outs.push_back(be->attend(0, q.gpu).to(Device::cpu()).to_dtype(DType::kF32));
    }
    cpu.plan(batch);
    cpu.store_kv(0, k.cpu, v.cpu);
    const Tensor want = cpu.attend(0, q.cpu);
    EXPECT_LT(max_abs_diff(outs[0], want), 2e-2) << "resident vs the CPU policy";
    EXPECT_EQ(max_abs_diff(outs[1], outs[0]), 0.0) << "offload vs resident";
    return max_abs_diff(outs[0], outs[2]);
  };
  std::vector<int64_t> done(n, 0);
  for (bool more = true; more;) {
    more = false;
    for (int64_t s = 0; s < n; ++s) {
      if (done[s] >= g.lens[s]) continue;
      const int64_t m = std::min(g.chunk, g.lens[s] - done[s]);
      sparse_prefills +=
          step({StepInput{uint64_t(s), tokens[s], done[s], m, tables[s], true}}, "prefill") > 1e-3;
      done[s] += m;
      more = true;
    }
  }
  for (int k = 0; k < decodes; ++k) {
    std::vector<StepInput> in;
    for (int64_t s = 0; s < n; ++s)
      in.push_back({uint64_t(s), tokens[s], done[s]++, 1, tables[s], true});
    EXPECT_GT(step(in, "decode"), 1e-3) << "streaming drops keys: not the dense output";
  }
  EXPECT_GE(sparse_prefills, 2) << "prefill chunks past the window are block-sparse";
  EXPECT_GT(offload.sparse_host_bytes_read(), 0) << "host pages read in place";
}

TEST(GpuStreaming, BackendsEqualTheCpuPolicyAndOffloadEqualsResident) {
  Geometry g;  // Llama-like heads (split-KV decode, sm_90 prefill at head_dim 128)
  check_geometry(g, 3);
  Geometry n;  // the needle model's heads; pages of one key: the paper's sinks and window
  n.block_size = 32, n.hq = 4, n.hkv = 2, n.d = 64;
  n.streaming.page_tokens = 1;
  n.streaming.sink_tokens = 4;
  n.streaming.window_tokens = 300;
  n.lens = {2000, 333, 901};
  check_geometry(n, 2);
}

// The engine with streaming (prefix caching, chunked prefill, preemption under a tight cache),
// resident and offloaded: every request finishes with its tokens; the offloaded tokens follow the
// resident ones (decode pages and prefill masks are the same; only the dense steps' merge order
// differs).
TEST(GpuStreaming, EngineGeneratesResidentAndOffloaded) {
  auto config = [](bool offload) {
    EngineConfig c;
    c.model = longctx::testing::needle_v1_dir();
    c.device = "cuda";
    c.max_model_len = 4096;
    c.block_size = 32;
    c.max_num_batched_tokens = 512;
    c.max_num_seqs = 6;
    c.sparse.policy = parse_sparse_policy("streaming");
    c.sparse.page_tokens = 8;
    c.sparse.sink_tokens = 16;
    c.sparse.window_tokens = 256;
    c.kv_offload = offload;
    if (offload) {
      c.num_gpu_blocks = 512 / 32 + 2 * 6 + 4;
      c.host_kv_budget = 300 * 49152;
      c.offload_slots = 3;
      c.offload_slot_tokens = 128;
    } else {
      c.num_gpu_blocks = 1024;
    }
    return c;
  };
  std::mt19937 rng(3);
  std::vector<Prompt> ps;
  std::vector<int32_t> shared(900);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 2000);
  for (int i = 0; i < 8; ++i) {
    auto p = shared;
    p.resize(200 + 150 * i);
    for (int k = 0, m = 50 + rng() % 400; k < m; ++k)
      p.push_back(static_cast<int32_t>(rng() % 2000));
    ps.emplace_back(p);
  }
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 32;
  sp.ignore_eos = true;
  LLM resident(config(false));
  const auto ref = resident.generate(ps, sp, false);
  LLM off(config(true));
  const auto got = off.generate(ps, sp, false);
  size_t same = 0, total = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(ref[i].token_ids.size(), 32u);
    ASSERT_EQ(got[i].token_ids.size(), 32u);
    size_t k = 0;
    while (k < 32 && ref[i].token_ids[k] == got[i].token_ids[k]) ++k;
    same += k;
    total += 32;
  }
  std::printf("streaming engine: offloaded %zu of %zu tokens equal the resident run's\n", same,
              total);
  EXPECT_GE(same * 10, total * 8);
}

}  // namespace
}  // namespace longctx::testing
