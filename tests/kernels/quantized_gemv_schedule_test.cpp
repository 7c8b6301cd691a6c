// The quantized decode GEMVs' schedule (kernels/quantized_gemv_params.h): which kernel runs
// (a tensor-core kernel for int4 where its conditions hold, the CUDA-core one otherwise, a
// forced kernel refused with the reason), K slices that cover K in the kernel's step and never
// exceed the partials' bound, enough CTAs for the SMs on Llama-3.1-8B's shapes (FP8: unsplit
// there), a target of CTAs per SM that moves the split, and the
// refusals of what no GEMV runs.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/quantized_gemv_params.h"

namespace longctx::kernels {
namespace {

using F = QuantizedGemvFormat;
using K = QuantizedGemvKernel;

QuantizedGemvProblem problem(F f, int64_t out, int64_t in, int64_t n = 1, int64_t group = 128) {
  QuantizedGemvProblem p;
  p.format = f;
  p.out = out;
  p.in = in;
  p.n = n;
  p.group = group;
  p.block_out = p.block_in = 128;
  p.sm_count = 132;
  return p;
}

struct Shape {
  int64_t out, in;
};
const Shape kLlama8B[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};

TEST(QuantizedGemvSchedule, SlicesCoverKInTheKernelsStep) {
  for (F f : {F::kGptq, F::kAwq, F::kFp8Block, F::kFp8Channel})
    for (K k : {K::kAuto, K::kMma, K::kMmaAsync, K::kSimt})
      for (Shape sh : kLlama8B)
        for (int64_t n : {1, 3, 8}) {
          const QuantizedGemvProblem p = problem(f, sh.out, sh.in, n);
          QuantizedGemvProblem pk = p;
          pk.kernel = k;
          const QuantizedGemvSchedule s = quantized_gemv_schedule(pk);
          SCOPED_TRACE(quantized_gemv_name(pk, s));
          const bool int4 = f == F::kGptq || f == F::kAwq;
          if (!int4 && (k == K::kMma || k == K::kMmaAsync)) {
            EXPECT_NE(s.refusal.find("int4 formats only"), std::string::npos) << s.refusal;
            continue;
          }
          ASSERT_EQ(s.refusal, "");
          // kAuto: GPTQ on the CUDA-core kernel at one row, kMma above; AWQ on kMmaAsync.
          const K automatic = f == F::kAwq ? K::kMmaAsync : n == 1 ? K::kSimt : K::kMma;
          EXPECT_EQ(s.kernel, !int4 || k == K::kSimt ? K::kSimt : k == K::kAuto ? automatic : k);
          const bool mma = s.kernel != K::kSimt;
          const int64_t step = mma ? (f == F::kGptq ? 32 : 16) : int4 ? 8 : 16;
          EXPECT_EQ(s.k_per_split % step, 0);
          EXPECT_GE(s.splits * s.k_per_split, sh.in);
          EXPECT_LT((s.splits - 1) * s.k_per_split, sh.in);  // no empty slice
          EXPECT_LE(s.splits, kQuantizedGemvMaxSplits);
          EXPECT_EQ(s.col_tiles, (sh.out + s.tile - 1) / s.tile);
          // Enough CTAs for 132 SMs (the FP8 kernel keeps slices of >= 1024 inputs).
          if (int4) EXPECT_GE(s.col_tiles * s.splits, 256);
          // FP8 splits K only with fewer output tiles than SMs (none of these shapes).
          if (!int4) EXPECT_EQ(s.splits, 1);
          EXPECT_EQ(s.partial_bytes, s.splits > 1 ? s.splits * n * sh.out * 4 : 0);
          if (s.kernel == K::kSimt && int4) EXPECT_LE(s.k_per_split, 1024);  // staged x fits
        }
}

TEST(QuantizedGemvSchedule, CtasPerSmMovesTheSplit) {
  for (F f : {F::kGptq, F::kFp8Channel}) {
    QuantizedGemvProblem p = problem(f, 4096, 14336, 2);  // GPTQ at 2 rows: kMma
    int64_t last = 0;
    for (int target : {1, 2, 4, 8}) {
      p.ctas_per_sm = target;
      const QuantizedGemvSchedule s = quantized_gemv_schedule(p);
      EXPECT_GE(s.splits, last);
      EXPECT_LE(s.col_tiles * (s.splits - 1), int64_t(target) * 132 + s.col_tiles);
      last = s.splits;
    }
    EXPECT_GT(last, 1);
  }
}

TEST(QuantizedGemvSchedule, MmaRunsWhereItsConditionsHold) {
  // Groups and widths that are multiples of 32, AWQ outputs a multiple of 16, aligned x rows;
  // the cp.async kernel also wants 16-bit, aligned scales.
  EXPECT_EQ(quantized_gemv_schedule(problem(F::kGptq, 136, 96, 2, 96)).kernel, K::kMma);
  EXPECT_EQ(quantized_gemv_schedule(problem(F::kAwq, 160, 128, 5, 32)).kernel, K::kMmaAsync);
  QuantizedGemvProblem f32_scales = problem(F::kAwq, 160, 96, 1, 96);
  f32_scales.scale_dtype = DType::kF32;
  EXPECT_EQ(quantized_gemv_schedule(f32_scales).kernel, K::kMma);
  f32_scales.kernel = K::kMmaAsync;
  EXPECT_NE(quantized_gemv_schedule(f32_scales).refusal.find("f32 scales"), std::string::npos);
  QuantizedGemvProblem unaligned_scales = problem(F::kAwq, 160, 128, 5, 32);
  unaligned_scales.params_aligned = false;
  EXPECT_EQ(quantized_gemv_schedule(unaligned_scales).kernel, K::kMma);
  struct Case {
    QuantizedGemvProblem p;
    const char* why;
  };
  std::vector<Case> refused = {
      {problem(F::kAwq, 136, 128, 1, 32), "AWQ out 136 not a multiple of 16"},
      {problem(F::kGptq, 64, 96, 1, 48), "in 96 or group 48 not a multiple of 32"},
      {problem(F::kFp8Block, 64, 128), "the mma GEMV takes int4 formats only"},
  };
  QuantizedGemvProblem unaligned = problem(F::kGptq, 64, 128);
  unaligned.x_aligned16 = false;
  refused.push_back({unaligned, "x rows not 16-byte aligned"});
  for (Case c : refused) {
    SCOPED_TRACE(c.why);
    EXPECT_EQ(quantized_gemv_schedule(c.p).kernel, K::kSimt);  // kAuto falls back
    EXPECT_EQ(quantized_gemv_schedule(c.p).refusal, "");
    for (K k : {K::kMma, K::kMmaAsync}) {
      c.p.kernel = k;
      const QuantizedGemvSchedule s = quantized_gemv_schedule(c.p);
      EXPECT_NE(s.refusal.find(c.why), std::string::npos) << s.refusal;
    }
  }
}

TEST(QuantizedGemvSchedule, RefusesWhatNoGemvRuns) {
  QuantizedGemvProblem p = problem(F::kGptq, 64, 128);
  p.x_dtype = DType::kF32;
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("f32 x"), std::string::npos);
  p = problem(F::kGptq, 64, 128, 9);
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("n = 9"), std::string::npos);
  p = problem(F::kFp8Channel, 64, 40);
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("not a multiple of 16"), std::string::npos);
  p = problem(F::kFp8Block, 64, 160);
  p.block_in = 40;
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("block width 40"), std::string::npos);
  p = problem(F::kGptq, 64, 128);
  p.qweight_aligned16 = false;
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("16-byte aligned"), std::string::npos);
  // The SIMT int4 kernels stage at most 1024 inputs a CTA: K past 64 slices of that is refused.
  p = problem(F::kAwq, 64, 1024 * 65, 1, 128);
  p.kernel = K::kSimt;
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("K slices"), std::string::npos);
}

// Split K is reduced by the last CTA of each tile unless the second kernel is asked for or the
// tiles outnumber the counters; one slice has no reduction.
TEST(QuantizedGemvSchedule, TheLastCtaReducesSplitK) {
  using R = QuantizedGemvReduce;
  for (F f : {F::kGptq, F::kAwq, F::kFp8Block, F::kFp8Channel})
    for (K k : {K::kAuto, K::kMma, K::kMmaAsync, K::kSimt}) {
      const bool int4 = f == F::kGptq || f == F::kAwq;
      if (!int4 && k != K::kAuto && k != K::kSimt) continue;
      for (R r : {R::kAuto, R::kLastCta, R::kKernel}) {
        QuantizedGemvProblem p = problem(f, 4096, 4096);
        p.kernel = k;
        p.reduce = r;
        p.splits = 4;
        const QuantizedGemvSchedule s = quantized_gemv_schedule(p);
        SCOPED_TRACE(quantized_gemv_name(p, s));
        ASSERT_EQ(s.refusal, "");
        ASSERT_EQ(s.splits, 4);
        EXPECT_EQ(s.reduce, r == R::kKernel ? R::kKernel : R::kLastCta);
        EXPECT_NE(
            quantized_gemv_name(p, s).find(r == R::kKernel ? "reduce kernel" : "reduce last-cta"),
            std::string::npos);
        EXPECT_EQ(s.partial_bytes, 4 * 4096 * 4);
        p.splits = 1;
        const QuantizedGemvSchedule one = quantized_gemv_schedule(p);
        if (s.kernel != K::kSimt || !int4) {  // the SIMT int4 kernels keep slices of <= 1024 inputs
          EXPECT_EQ(one.splits, 1);
          EXPECT_EQ(one.reduce, R::kAuto);
          EXPECT_EQ(one.partial_bytes, 0);
        }
      }
    }
  // More tiles than counters: kAuto takes the second kernel, a forced kLastCta is refused.
  QuantizedGemvProblem p = problem(F::kFp8Channel, 16 * (kQuantizedGemvMaxTileCounters + 1), 4096);
  p.splits = 2;
  EXPECT_EQ(quantized_gemv_schedule(p).reduce, QuantizedGemvReduce::kKernel);
  p.reduce = QuantizedGemvReduce::kLastCta;
  EXPECT_NE(quantized_gemv_schedule(p).refusal.find("last-CTA"), std::string::npos);
}

// A forced slice count is clamped to the kernel's range: the SIMT int4 kernels' staged x (<= 1024
// inputs a slice), kQuantizedGemvMaxSplits, FP8 down to one 16-input chunk a slice.
TEST(QuantizedGemvSchedule, ForcedSplitsClampToTheKernelsRange) {
  struct Case {
    F f;
    K k;
    int64_t in, want, got;
  };
  for (Case c : std::vector<Case>{{F::kGptq, K::kSimt, 4096, 2, 4},
                                  {F::kGptq, K::kSimt, 4096, 8, 8},
                                  {F::kGptq, K::kMma, 4096, 2, 2},
                                  {F::kGptq, K::kMma, 4096, 1000, 64},
                                  {F::kAwq, K::kMmaAsync, 14336, 24, 24},
                                  {F::kFp8Channel, K::kSimt, 4096, 3, 3},
                                  {F::kFp8Block, K::kSimt, 512, 64, 32},
                                  {F::kFp8Block, K::kSimt, 4096, 0, 1}}) {
    QuantizedGemvProblem p = problem(c.f, 4096, c.in);
    p.kernel = c.k;
    p.splits = c.want;
    const QuantizedGemvSchedule s = quantized_gemv_schedule(p);
    SCOPED_TRACE(quantized_gemv_name(p, s));
    ASSERT_EQ(s.refusal, "");
    EXPECT_EQ(s.splits, c.got);
    EXPECT_GE(s.splits * s.k_per_split, c.in);
    EXPECT_LT((s.splits - 1) * s.k_per_split, c.in);
  }
}

TEST(QuantizedGemvSchedule, PrefetchIsTheProblems) {
  using P = QuantizedGemvPrefetch;
  QuantizedGemvProblem p = problem(F::kGptq, 4096, 4096);
  EXPECT_EQ(quantized_gemv_schedule(p).prefetch, P::kOff);
  EXPECT_EQ(quantized_gemv_name(p, quantized_gemv_schedule(p)).find("prefetch"), std::string::npos);
  for (auto [mode, name] : {std::pair{P::kAfterWait, "prefetch after-wait"},
                            std::pair{P::kBeforeWait, "prefetch before-wait"}}) {
    p.prefetch = mode;
    const QuantizedGemvSchedule s = quantized_gemv_schedule(p);
    EXPECT_EQ(s.prefetch, mode);
    EXPECT_NE(quantized_gemv_name(p, s).find(name), std::string::npos);
  }
}

}  // namespace
}  // namespace longctx::kernels
