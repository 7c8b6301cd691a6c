// The paged-kernel choice the resident paged backend and the CUDA offload device share
// (attention/backends/paged_dispatch.h), under the default tuning and its pins.
#include <gtest/gtest.h>

#include "attention/backends/paged_dispatch.h"

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
bool none(const PlannedKernels& k) { return !k.decode && !k.prefill; }

TEST(PagedDispatch, DefaultTuningTakesThePlannedKernelsAtHeadDim64And128) {
  const kernels::KernelTuning t;
  for (int d : {64, 128}) {
    const PlannedKernels k = paged_planned_kernels(llama_shape(d), t);
    ASSERT_TRUE(both(k)) << d;
    EXPECT_EQ(choose_paged_kernel(k, /*all_decode=*/true), PagedKernel::kDecode);
    EXPECT_EQ(choose_paged_kernel(k, /*all_decode=*/false), PagedKernel::kPrefill);
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
  EXPECT_EQ(choose_paged_kernel(k, /*all_decode=*/false), PagedKernel::kPrefill);
  EXPECT_EQ(choose_paged_kernel(k, /*all_decode=*/true), PagedKernel::kDecode);
}

TEST(PagedDispatch, PlannedPrefillWithoutDecodeSendsDecodeStepsToTheGenericKernel) {
  PlannedKernels k;
  k.prefill = true;
  EXPECT_EQ(choose_paged_kernel(k, /*all_decode=*/true), PagedKernel::kGeneric);
  EXPECT_EQ(choose_paged_kernel(k, /*all_decode=*/false), PagedKernel::kPrefill);
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
  EXPECT_EQ(choose_paged_kernel(k, true), PagedKernel::kGeneric);
  EXPECT_EQ(choose_paged_kernel(k, false), PagedKernel::kGeneric);
}

TEST(PagedDispatch, GenericTuningTakesTheGenericKernelEverywhere) {
  kernels::KernelTuning t;
  t.attention = kernels::AttentionKernel::kGeneric;
  for (int d : {64, 128, 256}) EXPECT_TRUE(none(paged_planned_kernels(llama_shape(d), t))) << d;
}

// An FP8 cache takes the planned kernels (the split-KV decode and the mma.sync prefill read it):
// its prefill plans pin the mma.sync kernel (kFa2), whatever the tuning asked; a 16-bit cache
// keeps the tuning's choice.
TEST(PagedDispatch, Fp8CachePlansTheMmaSyncPrefill) {
  kernels::KernelTuning t;
  ASSERT_EQ(t.prefill.kernel, kernels::PrefillKernel::kSm90);
  PagedShape s = llama_shape();
  s.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_TRUE(both(paged_planned_kernels(s, t)));
  EXPECT_EQ(prefill_tuning_for(s, t.prefill).kernel, kernels::PrefillKernel::kFa2);
  EXPECT_EQ(prefill_tuning_for(llama_shape(), t.prefill).kernel, kernels::PrefillKernel::kSm90);
  t.prefill.kernel = kernels::PrefillKernel::kFa2;
  EXPECT_EQ(prefill_tuning_for(llama_shape(), t.prefill).kernel, kernels::PrefillKernel::kFa2);
  // Shapes without the planned kernels stay on the generic kernel, FP8 or not.
  PagedShape small = llama_shape(16);
  small.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_TRUE(none(paged_planned_kernels(small, t)));
  // The FP8 loaders stop at head_dim 128: Gemma 3's FP8 cache takes the generic kernel.
  PagedShape gemma = llama_shape(256);
  gemma.kv_format = kernels::KvCacheFormat::kFp8E4M3;
  EXPECT_TRUE(none(paged_planned_kernels(gemma, t)));
}

}  // namespace
}  // namespace longctx
