// The phase profile (attention/backends/phase_profile.h, `bench offload --profile-phases`) on
// the CPU: the wrapper changes no output, and each phase is closed as often as the step's calls
// say (per step: one plan, per layer: the layer's rest, store_kv, attend; the offload backend's
// planner and sparse reader once per step). The CPU has no GPU clock: GPU times stay 0.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "attention/backends/cpu_paged_backend.h"
#include "attention/backends/offload_backend.h"
#include "attention/backends/phase_profile.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"

namespace longctx::testing {
namespace {

constexpr int64_t kBlock = 16, kHq = 4, kHkv = 2, kD = 8, kLayers = 3;

Tensor random_rows(int64_t t, int64_t h, std::mt19937& rng) {
  Tensor x = Tensor::empty({t, h, kD}, DType::kF32);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n01(rng);
  return x;
}

int64_t marks(const PhaseTotals& t, AttentionPhase p) { return t.marks[static_cast<int>(p)]; }

// Steps of one sequence (a prefill of `prompt` tokens in chunks, then `decodes` decode steps)
// through every backend given, the same K / V / q for each; returns each backend's outputs.
std::vector<std::vector<Tensor>> run_steps(std::vector<AttentionBackend*> backends, int64_t prompt,
                                           int64_t chunk, int64_t decodes) {
  std::mt19937 rng(5);
  const int64_t len = prompt + decodes;
  std::vector<int32_t> table, tokens(len, 1);
  for (int64_t b = 0; b < (len + kBlock - 1) / kBlock; ++b) table.push_back(int32_t(b));
  std::vector<std::vector<Tensor>> outs(backends.size());
  for (int64_t done = 0; done < len;) {
    const int64_t n = done < prompt ? std::min(chunk, prompt - done) : 1;
    const std::vector<StepInput> in = {{0, tokens, done, n, table, true}};
    done += n;
    const ForwardBatch batch = make_forward_batch(in, kBlock);
    std::vector<Tensor> k, v, q;
    for (int64_t l = 0; l < kLayers; ++l) {
      k.push_back(random_rows(n, kHkv, rng));
      v.push_back(random_rows(n, kHkv, rng));
      q.push_back(random_rows(n, kHq, rng));
    }
    for (size_t i = 0; i < backends.size(); ++i) {
      backends[i]->plan(batch);
      for (int64_t l = 0; l < kLayers; ++l) {
        backends[i]->store_kv(l, k[l], v[l]);
        outs[i].push_back(backends[i]->attend(l, q[l]));
      }
    }
  }
  return outs;
}

TEST(PhaseProfile, TheWrapperChangesNoOutputAndClosesEachPhasePerCall) {
  const float scale = 1.f / std::sqrt(float(kD));
  const PagedKVPoolConfig kv{kLayers, kHkv, kD, kBlock, 8, DType::kF32, Device::cpu()};
  PagedKVPool pool_a(kv), pool_b(kv);
  CpuPagedBackend plain(pool_a, scale);
  auto recorder = std::make_shared<PhaseRecorder>(Device::cpu());
  PhaseProfilingBackend profiled(std::make_unique<CpuPagedBackend>(pool_b, scale), recorder);
  // 3 prefill chunks (40 tokens by 16), then 5 decode steps: 8 steps.
  const auto outs = run_steps({&plain, &profiled}, 40, 16, 5);
  ASSERT_EQ(outs[0].size(), outs[1].size());
  for (size_t i = 0; i < outs[0].size(); ++i) {
    ASSERT_EQ(outs[0][i].numel(), outs[1][i].numel());
    for (int64_t e = 0; e < outs[0][i].numel(); ++e)
      ASSERT_EQ(outs[0][i].data<float>()[e], outs[1][i].data<float>()[e]) << "call " << i;
  }
  const PhaseTotals t = recorder->totals();
  EXPECT_EQ(t.steps, 8);
  EXPECT_EQ(marks(t, AttentionPhase::kPlan), 8);
  EXPECT_EQ(marks(t, AttentionPhase::kBetweenSteps), 7);  // the first step has no previous one
  EXPECT_EQ(marks(t, AttentionPhase::kLayerRest), 8 * kLayers);
  EXPECT_EQ(marks(t, AttentionPhase::kStore), 8 * kLayers);
  EXPECT_EQ(marks(t, AttentionPhase::kAttendOther), 8 * kLayers);
  EXPECT_EQ(marks(t, AttentionPhase::kSelect), 0);  // the CPU backend does not split attend
  for (int p = 0; p < kNumAttentionPhases; ++p) {
    EXPECT_GE(t.host_ms[p], 0.0);
    EXPECT_EQ(t.gpu_ms[p], 0.0);
    EXPECT_EQ(t.starved[p], 0);
  }
  EXPECT_NE(t.table().find("store_kv"), std::string::npos);
  // reset() starts the sums again; the next step's first mark has the last one as its base.
  recorder->reset();
  EXPECT_EQ(recorder->totals().steps, 0);
  EXPECT_EQ(marks(recorder->totals(), AttentionPhase::kPlan), 0);
}

TEST(PhaseProfile, TheOffloadBackendMarksItsPlannerAndSparseReaderPerStep) {
  const float scale = 1.f / std::sqrt(float(kD));
  SparseOptions quest;
  quest.policy = SparsePolicyKind::kQuest;
  quest.budget_tokens = 32;
  quest.sink_tokens = 8;
  quest.window_tokens = 8;
  quest.page_tokens = 8;
  OffloadDeviceConfig d;
  const int64_t blocks = 8;
  d.geometry = {kLayers, kBlock, blocks, /*gpu blocks=*/3, /*slots=*/2, /*slot blocks=*/2};
  d.num_qo_heads = kHq;
  d.num_kv_heads = kHkv;
  d.head_dim = kD;
  d.dtype = DType::kF32;
  d.sm_scale = scale;
  d.max_tokens = 16;
  d.max_seqs = 1;
  d.sparse = quest;
  auto offload = std::make_unique<OffloadAttentionBackend>(d.geometry, make_cpu_offload_device(d));
  OffloadAttentionBackend& inner = *offload;
  auto recorder = std::make_shared<PhaseRecorder>(Device::cpu());
  PhaseProfilingBackend profiled(std::move(offload), recorder);
  inner.set_phase_recorder(recorder.get());
  run_steps({&profiled}, 96, 16, 4);  // 6 prefill chunks, 4 decode steps
  const PhaseTotals t = recorder->totals();
  EXPECT_EQ(t.steps, 10);
  EXPECT_EQ(marks(t, AttentionPhase::kPlanOffload), 10);
  EXPECT_EQ(marks(t, AttentionPhase::kPlanSparse), 10);
  EXPECT_EQ(marks(t, AttentionPhase::kPlan), 10);
  EXPECT_EQ(marks(t, AttentionPhase::kStore), 10 * kLayers);
}

}  // namespace
}  // namespace longctx::testing
