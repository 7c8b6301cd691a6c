// Quest through the offload backend on the CPU simulation, at the backend's seam (the GPU twin
// is tests/gpu_models/test_gpu_sparse.cpp): random K / V / q written by store_kv over prefill
// chunks of two sequences, then decode steps, through
//   - the resident CPU backend with the CPU engine's QuestPolicy (pages of one block), and
//   - OffloadAttentionBackend over the simulated device with quest (a GPU cache of a few blocks,
//     write-backs landing two steps late), which reads the selected host pages in place;
// the decode outputs must agree to fp32 rounding, the sparse steps must have read host pages,
// and they must differ from dense attention (the budget is much smaller than the context).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "kv/sparse/sparse_policy.h"

namespace longctx::testing {
namespace {

constexpr int64_t kBlock = 16, kHq = 4, kHkv = 2, kD = 8, kChunk = 48;

Tensor random_rows(int64_t t, int64_t h, std::mt19937& rng) {
  Tensor x = Tensor::empty({t, h, kD}, DType::kF32);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n01(rng);
  return x;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

TEST(SparseOffload, QuestThroughTheSimulatedDeviceIsTheResidentPolicy) {
  for (bool per_head : {true, false}) {
    SCOPED_TRACE(per_head ? "per KV head" : "head-averaged");
    SparseOptions quest;
    quest.policy = "quest";
    quest.budget_tokens = 64;
    quest.sink_tokens = 16;
    quest.window_tokens = 16;
    quest.per_head = per_head;
    const std::vector<int64_t> lens = {500, 333};
    const int decodes = 4;
    const int64_t num_blocks = 64;
    const float scale = 1.f / std::sqrt(float(kD));

    PagedKVPoolConfig kv{1, kHkv, kD, kBlock, num_blocks, DType::kF32, Device::cpu()};
    PagedKVPool pool(kv), dense_pool(kv);
    sparse::KvShape shape{1, num_blocks, kBlock, kHq, kHkv, kD, scale};
    auto policy = sparse::make_sparse_policy(quest, shape);
    CpuPagedBackend resident(pool, scale, policy.get());
    CpuPagedBackend dense(dense_pool, scale);
    OffloadDeviceConfig d;
    d.geometry = {1, kBlock, num_blocks, /*gpu blocks=*/12, /*slots=*/2, /*slot blocks=*/3};
    d.num_qo_heads = kHq;
    d.num_kv_heads = kHkv;
    d.head_dim = kD;
    d.dtype = DType::kF32;
    d.sm_scale = scale;
    d.max_tokens = 2 * kChunk;
    d.max_seqs = 4;
    d.cpu_write_back_lag = 2;
    d.sparse = quest;
    OffloadAttentionBackend offload(d.geometry, make_cpu_offload_device(d));
    std::vector<AttentionBackend*> backends = {&resident, &offload, &dense};

    std::mt19937 rng(per_head ? 7 : 8);
    std::vector<std::vector<int32_t>> tables(lens.size()), tokens(lens.size());
    int32_t next = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int64_t b = 0; b < (lens[s] + decodes + kBlock - 1) / kBlock; ++b)
        tables[s].push_back(next++);
      tokens[s].assign(lens[s] + decodes, 1);
    }
    auto step = [&](const std::vector<StepInput>& in) {
      ForwardBatch batch = make_forward_batch(in, kBlock);
      const int64_t t = batch.num_tokens();
      Tensor k = random_rows(t, kHkv, rng), v = random_rows(t, kHkv, rng),
             q = random_rows(t, kHq, rng);
      std::vector<Tensor> outs;
      for (AttentionBackend* be : backends) {
        be->plan(batch);
        be->store_kv(0, k, v);
        outs.push_back(be->attend(0, q));
      }
      return outs;
    };
    std::vector<int64_t> done(lens.size(), 0);
    for (bool more = true; more;) {
      more = false;
      std::vector<StepInput> in;
      for (size_t s = 0; s < lens.size(); ++s) {
        if (done[s] >= lens[s]) continue;
        const int64_t m = std::min(kChunk, lens[s] - done[s]);
        in.push_back({uint64_t(s), tokens[s], done[s], m, tables[s], true});
        done[s] += m;
        more = true;
      }
      if (more) step(in);
    }
    for (int k = 0; k < decodes; ++k) {
      std::vector<StepInput> in;
      for (size_t s = 0; s < lens.size(); ++s)
        in.push_back({uint64_t(s), tokens[s], done[s]++, 1, tables[s], true});
      const std::vector<Tensor> outs = step(in);
      EXPECT_LT(max_diff(outs[1], outs[0]), 1e-5) << "decode step " << k << ": offload vs resident";
      EXPECT_GT(max_diff(outs[0], outs[2]), 1e-3) << "decode step " << k << ": quest vs dense";
    }
    EXPECT_GT(offload.sparse_host_bytes_read(), 0);
  }
}

}  // namespace
}  // namespace longctx::testing
