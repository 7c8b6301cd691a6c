// The paged-kernel choice the resident paged backend and the CUDA offload device share
// (attention/backends/paged_dispatch.h), under the default tuning and its pins.
#include <gtest/gtest.h>

#include "attention/backends/paged_dispatch.h"
#include "kernels/decode_params.h"

namespace longctx {
namespace {

PagedShape llama_shape(int head_dim = 128, int page_size = 128) {
  PagedShape s;
  s.num_qo_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = head_dim;
  s.page_size = page_size;
  s.dtype = DType::kBF16;
  s.sm_scale = 0.088f;
  return s;
}

bool both(const PlannedKernels& k) { return k.decode && k.prefill; }

// A causal call whose longest sequence has max_q queries (1: a decode step).
PagedCallQueries step(int max_q, int window = 0,
                      kernels::MaskMode mask = kernels::MaskMode::kCausal) {
  PagedCallQueries q;
  q.max_q_len = max_q;
  q.window = window;
  q.mask = mask;
  return q;
}
// Verify steps reach the split-KV decode under --decode-max-q 16 (the default 1 keeps them on
// the prefill).
constexpr int kMaxQ = kernels::kDecodeMaxQLen;
bool none(const PlannedKernels& k) { return !k.decode && !k.prefill; }

TEST(PagedDispatch, DefaultTuningTakesThePlannedKernelsAtHeadDim64And128) {
  const kernels::KernelTuning t;
  for (int d : {64, 128}) {
    const PlannedKernels k = paged_planned_kernels(llama_shape(d), t);
    ASSERT_TRUE(both(k)) << d;
    EXPECT_EQ(choose_paged_kernel(k, step(1), kMaxQ), PagedKernel::kDecode);
    EXPECT_EQ(choose_paged_kernel(k, step(100), kMaxQ), PagedKernel::kPrefill);
  }
  PagedShape f16 = llama_shape();
  f16.dtype = DType::kF16;
  EXPECT_TRUE(both(paged_planned_kernels(f16, t)));
  EXPECT_TRUE(both(paged_planned_kernels(llama_shape(128, 1), t)));
  EXPECT_TRUE(both(paged_planned_kernels(llama_shape(128, 256), t)));
}

TEST(PagedDispatch, HeadDim256TakesThePlannedKernels) {
  // Gemma 3's heads: the mma.sync prefill and the split-KV decode's cp.async ring.
  const PlannedKernels k = paged_planned_kernels(llama_shape(256), kernels::KernelTuning{});
  EXPECT_TRUE(both(k));
  EXPECT_EQ(choose_paged_kernel(k, step(100), kMaxQ), PagedKernel::kPrefill);
  EXPECT_EQ(choose_paged_kernel(k, step(1), kMaxQ), PagedKernel::kDecode);
}

TEST(PagedDispatch, PlannedPrefillWithoutDecodeSendsDecodeStepsToTheGenericKernel) {
  PlannedKernels k;
  k.prefill = true;
  EXPECT_EQ(choose_paged_kernel(k, step(1), kMaxQ), PagedKernel::kGeneric);
  EXPECT_EQ(choose_paged_kernel(k, step(100), kMaxQ), PagedKernel::kPrefill);
}

TEST(PagedDispatch, OtherShapesTakeTheGenericKernel) {
  const kernels::KernelTuning t;
  EXPECT_TRUE(none(paged_planned_kernels(llama_shape(16), t)));  // the test models' small heads
  EXPECT_TRUE(none(paged_planned_kernels(llama_shape(96), t)));
  EXPECT_TRUE(none(paged_planned_kernels(llama_shape(512), t)));
  EXPECT_TRUE(none(paged_planned_kernels(llama_shape(128, 512), t)));  // past the prefill's pages
  PagedShape f32 = llama_shape();
  f32.dtype = DType::kF32;
  EXPECT_TRUE(none(paged_planned_kernels(f32, t)));
  PagedShape gqa = llama_shape();
  gqa.num_qo_heads = 12;
  gqa.num_kv_heads = 8;
  const PlannedKernels k = paged_planned_kernels(gqa, t);
  EXPECT_TRUE(none(k));
  EXPECT_EQ(choose_paged_kernel(k, step(1), kMaxQ), PagedKernel::kGeneric);
  EXPECT_EQ(choose_paged_kernel(k, step(100), kMaxQ), PagedKernel::kGeneric);
}

TEST(PagedDispatch, GenericTuningTakesTheGenericKernelEverywhere) {
  kernels::KernelTuning t;
  t.attention = kernels::AttentionKernel::kGeneric;
  for (int d : {64, 128, 256}) EXPECT_TRUE(none(paged_planned_kernels(llama_shape(d), t))) << d;
}

// An FP8 cache takes the planned kernels (the split-KV decode and the paged prefill read it, the
// prefill with the tuning's kernel, as a 16-bit cache: the Hopper one on sm_90) at head_dim 64 /
// 128.
TEST(PagedDispatch, Fp8CachePlansTheSameKernels) {
  kernels::KernelTuning t;
  ASSERT_EQ(t.prefill.kernel, kernels::PrefillKernel::kSm90);
  PagedShape s = llama_shape();
  s.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_TRUE(both(paged_planned_kernels(s, t)));
  for (int d : {64, 128}) {
    PagedShape fp8 = llama_shape(d);
    fp8.kv_format = kernels::KvCacheFormat::kFp8E4M3;
    const PlannedKernels a = paged_planned_kernels(fp8, t);
    const PlannedKernels b = paged_planned_kernels(llama_shape(d), t);
    EXPECT_EQ(a.prefill, b.prefill) << d;
    EXPECT_EQ(a.decode, b.decode) << d;
    EXPECT_EQ(choose_paged_kernel(a, step(2048), kMaxQ), choose_paged_kernel(b, step(2048), kMaxQ));
  }
  // Shapes without the planned kernels stay on the generic kernel, FP8 or not.
  PagedShape small = llama_shape(16);
  small.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_TRUE(none(paged_planned_kernels(small, t)));
  // The FP8 loaders stop at head_dim 128: Gemma 3's FP8 cache takes the generic kernel.
  PagedShape gemma = llama_shape(256);
  gemma.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_TRUE(none(paged_planned_kernels(gemma, t)));
}

TEST(PagedDispatch, VerifyStepsTakeTheSplitKvDecode) {
  const kernels::KernelTuning t;
  EXPECT_EQ(
      choose_paged_kernel(paged_planned_kernels(llama_shape(128), t), step(9), t.decode.max_q_len),
      PagedKernel::kPrefill);  // the default
  for (int d : {64, 128, 256}) {
    const PlannedKernels k = paged_planned_kernels(llama_shape(d), t);
    for (int q : {2, 9, 16}) {
      EXPECT_EQ(choose_paged_kernel(k, step(q), kMaxQ), PagedKernel::kDecode) << d << " " << q;
      EXPECT_EQ(choose_paged_kernel(k, step(q, 4096), kMaxQ), PagedKernel::kDecode);  // window
    }
    EXPECT_EQ(choose_paged_kernel(k, step(17), kMaxQ), PagedKernel::kPrefill);
    // A sequence without queries beside decode rows: still a decode step.
    EXPECT_EQ(choose_paged_kernel(k, step(0), kMaxQ), PagedKernel::kDecode);
  }
  // FP8 caches: the converting loader serves the verify rows the same way.
  PagedShape fp8 = llama_shape();
  fp8.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_EQ(choose_paged_kernel(paged_planned_kernels(fp8, t), step(9), kMaxQ),
            PagedKernel::kDecode);
}

TEST(PagedDispatch, VerifyStepsKeepThePrefillWhereTheDecodeRuleDiffers) {
  const PlannedKernels k = paged_planned_kernels(llama_shape(), kernels::KernelTuning{});
  // The offload path's ring items (no mask): the decode's rule without a window only.
  EXPECT_EQ(choose_paged_kernel(k, step(9, 0, kernels::MaskMode::kNone), kMaxQ),
            PagedKernel::kDecode);
  EXPECT_EQ(choose_paged_kernel(k, step(9, 512, kernels::MaskMode::kNone), kMaxQ),
            PagedKernel::kPrefill);
  // A prefill policy's block mask is read by the prefill alone.
  PagedCallQueries sparse = step(9);
  sparse.block_sparse = true;
  EXPECT_EQ(choose_paged_kernel(k, sparse, kMaxQ), PagedKernel::kPrefill);
  sparse.max_q_len = 1;  // decode steps ignore it, as before
  EXPECT_EQ(choose_paged_kernel(k, sparse, kMaxQ), PagedKernel::kDecode);
  // The tuning's bound: 1 sends verify steps to the prefill, 4 takes K + 1 <= 4 only.
  EXPECT_EQ(choose_paged_kernel(k, step(2), 1), PagedKernel::kPrefill);
  EXPECT_EQ(choose_paged_kernel(k, step(4), 4), PagedKernel::kDecode);
  EXPECT_EQ(choose_paged_kernel(k, step(5), 4), PagedKernel::kPrefill);
  // Without the planned decode a verify step is a prefill (the generic kernel where none).
  PlannedKernels prefill_only;
  prefill_only.prefill = true;
  EXPECT_EQ(choose_paged_kernel(prefill_only, step(9), kMaxQ), PagedKernel::kPrefill);
  EXPECT_EQ(choose_paged_kernel(PlannedKernels{}, step(9), kMaxQ), PagedKernel::kGeneric);
}

TEST(PagedDispatch, CallQueriesComeFromQoIndptr) {
  const int32_t qo[5] = {0, 1, 10, 10, 11};
  const PagedCallQueries q = paged_call_queries(qo, 4, kernels::MaskMode::kNone, 7);
  EXPECT_EQ(q.max_q_len, 9);
  EXPECT_EQ(q.mask, kernels::MaskMode::kNone);
  EXPECT_EQ(q.window, 7);
  EXPECT_FALSE(q.block_sparse);
  EXPECT_EQ(paged_call_queries(qo, 0, kernels::MaskMode::kCausal, 0).max_q_len, 0);
}

PagedShape fp8_llama(int page_size = 16) {
  PagedShape s = llama_shape(128, page_size);
  s.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  return s;
}

// The staged FP8 prefill's pool: the default cap (512 MiB) holds 128K keys of Llama-3.1-8B's
// layer (8 KV heads x 128, bf16 K and V) whatever the page size, plus each page's 4-byte index;
// smaller backends get the pool of their largest call; 16-bit caches, cap 0 and backends without
// the planned prefill none.
TEST(PagedDispatch, Fp8StagePoolIsTheLargestCallUpToTheCap) {
  const kernels::KernelTuning t;
  EXPECT_EQ(t.prefill.fp8_stage_mib, 512);
  for (int page : {16, 128}) {
    const PagedShape s = fp8_llama(page);
    const PlannedKernels k = paged_planned_kernels(s, t);
    const int64_t keys128k = 131072 / page;
    const size_t at_cap = paged_fp8_stage_bytes(s, k, t, int64_t(1) << 30);
    EXPECT_EQ(at_cap, paged_fp8_stage_bytes(s, k, t, keys128k)) << page;
    EXPECT_EQ(at_cap, (size_t(512) << 20) + keys128k * 4) << page;  // 256-aligned parts
    EXPECT_TRUE(paged_fp8_staged(s, PagedKernel::kPrefill, keys128k, at_cap));
    EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kPrefill, keys128k + 1, at_cap));
    const size_t small = paged_fp8_stage_bytes(s, k, t, 100);
    EXPECT_LT(small, at_cap);
    EXPECT_TRUE(paged_fp8_staged(s, PagedKernel::kPrefill, 100, small));
    EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kPrefill, 101, small));
  }
  const PagedShape s = fp8_llama();
  const PlannedKernels k = paged_planned_kernels(s, t);
  EXPECT_EQ(paged_fp8_stage_bytes(llama_shape(), paged_planned_kernels(llama_shape(), t), t, 100),
            0u);
  kernels::KernelTuning off = t;
  off.prefill.fp8_stage_mib = 0;
  EXPECT_EQ(paged_fp8_stage_bytes(s, k, off, 100), 0u);
  kernels::KernelTuning generic = t;
  generic.attention = kernels::AttentionKernel::kGeneric;
  EXPECT_EQ(paged_fp8_stage_bytes(s, paged_planned_kernels(s, generic), generic, 100), 0u);
  kernels::KernelTuning small_cap = t;
  small_cap.prefill.fp8_stage_mib = 1;  // 1 MiB: 16 pages of 16 x 8 x 128 bf16 K and V
  const size_t one = paged_fp8_stage_bytes(s, k, small_cap, 1000);
  EXPECT_TRUE(paged_fp8_staged(s, PagedKernel::kPrefill, 16, one));
  EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kPrefill, 17, one));
}

// Only prefill calls over an FP8 cache are staged: decode steps read the codes (their gain), a
// 16-bit cache needs no staging, an empty call none.
TEST(PagedDispatch, Fp8StagingTakesPrefillCallsOnly) {
  const kernels::KernelTuning t;
  const PagedShape s = fp8_llama();
  const size_t pool = paged_fp8_stage_bytes(s, paged_planned_kernels(s, t), t, 1000);
  EXPECT_TRUE(paged_fp8_staged(s, PagedKernel::kPrefill, 1000, pool));
  EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kDecode, 10, pool));
  EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kGeneric, 10, pool));
  EXPECT_FALSE(paged_fp8_staged(llama_shape(128, 16), PagedKernel::kPrefill, 10, pool));
  EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kPrefill, 0, pool));
  EXPECT_FALSE(paged_fp8_staged(s, PagedKernel::kPrefill, 10, 0));
}

}  // namespace
}  // namespace longctx
