// The CUDA FP8 staging conversion (kernels/cuda/fp8_stage.h) against its CPU twin
// (kernels/cpu/fp8_stage_cpu.h, itself checked against the reference decoder in
// tests/kernels/fp8_stage_ref_test.cpp): bit-identical elements (NaN codes: NaN), the iota, and
// nothing written outside the call's pages (guard elements), over odd shapes, extreme scales and a
// call of Llama-3.1-8B's layer shape.
#include "kernels/cuda/fp8_stage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/fp8_stage_case.h"
#include "gpu_kernels/harness.h"
#include "kernels/cpu/fp8_stage_cpu.h"
#include "longctx/core/cuda_check.h"

namespace longctx::gpu_test {
namespace {

using testing::Fp8StageInputs;
using testing::Fp8StageShape;

bool is_nan(uint16_t bits, DType dt) {
  return dt == DType::kBF16 ? std::isnan(bf16_to_f32(bits)) : std::isnan(f16_to_f32(bits));
}

void expect_cuda_equals_twin(const Fp8StageShape& s) {
  SCOPED_TRACE(::testing::Message()
               << "pages " << s.call_pages << "/" << s.cache_pages << " page " << s.page_size
               << " hk " << s.num_kv_heads << " d " << s.head_dim << " " << dtype_name(s.dtype));
  const Fp8StageInputs in = make_fp8_stage_inputs(s);
  std::vector<uint16_t> want_k = in.guarded_output(), want_v = in.guarded_output();
  std::vector<int32_t> want_iota(s.call_pages);
  kernels::cpu::fp8_stage(in.params(in.k.data(), in.v.data(), in.k_scale.data(), in.v_scale.data(),
                                    in.indices.data(), want_k.data(), want_v.data(),
                                    want_iota.data()));
  GuardedBuffer kc = upload_vector(in.k), vc = upload_vector(in.v);
  GuardedBuffer ks = upload_vector(in.k_scale), vs = upload_vector(in.v_scale);
  GuardedBuffer idx = upload_vector(in.indices);
  GuardedBuffer ko = upload_vector(in.guarded_output()), vo = upload_vector(in.guarded_output());
  GuardedBuffer iota(std::max<size_t>(s.call_pages * 4, 4), 0xFF);
  kernels::cuda::fp8_stage_run(
      in.params(static_cast<const uint8_t*>(kc.data()), static_cast<const uint8_t*>(vc.data()),
                static_cast<const float*>(ks.data()), static_cast<const float*>(vs.data()),
                static_cast<const int32_t*>(idx.data()), static_cast<uint16_t*>(ko.data()),
                static_cast<uint16_t*>(vo.data()), static_cast<int32_t*>(iota.data())),
      nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  for (const GuardedBuffer* b : {&ko, &vo, &iota}) EXPECT_TRUE(b->guards_intact());
  const std::vector<int32_t> got_iota = iota.download<int32_t>();
  for (int j = 0; j < s.call_pages; ++j) ASSERT_EQ(got_iota[j], want_iota[j]) << j;
  for (int kv = 0; kv < 2; ++kv) {
    const std::vector<uint16_t> got = (kv == 0 ? ko : vo).download<uint16_t>();
    const std::vector<uint16_t>& want = kv == 0 ? want_k : want_v;
    EXPECT_TRUE(Fp8StageInputs::guards_intact(got)) << (kv ? "V" : "K");
    int64_t mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool same = got[i] == want[i] || (is_nan(got[i], s.dtype) && is_nan(want[i], s.dtype));
      if (!same && ++mismatches <= 5)
        ADD_FAILURE() << (kv ? "V" : "K") << " element " << int64_t(i) - testing::kStageGuard
                      << ": " << got[i] << " want " << want[i];
    }
    EXPECT_EQ(mismatches, 0) << (kv ? "V" : "K");
  }
}

TEST(Fp8StageGpu, EqualsTheCpuTwin) {
  uint64_t seed = 100;
  for (Fp8StageShape s : {
           Fp8StageShape{11, 5, 1, 4, 64}, Fp8StageShape{9, 9, 7, 3, 16},
           Fp8StageShape{13, 7, 16, 2, 128}, Fp8StageShape{3, 1, 256, 1, 64},
           Fp8StageShape{6, 4, 128, 8, 128},
           Fp8StageShape{700, 613, 16, 8, 128},  // Llama-3.1-8B's layer: many CTAs, grid-stride
       }) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      s.dtype = dt;
      s.scales = {0x1p-20f, 0x1p-16f, 0x1p-8f, 1.f, 0x1p3f, 0x1p8f};
      s.seed = seed++;
      expect_cuda_equals_twin(s);
    }
  }
}

// An empty call launches nothing; misaligned pointers are refused.
TEST(Fp8StageGpu, EmptyCallAndMisalignedPointers) {
  const Fp8StageInputs in = make_fp8_stage_inputs(Fp8StageShape{4, 3, 16, 2, 64});
  GuardedBuffer kc = upload_vector(in.k), vc = upload_vector(in.v);
  GuardedBuffer ks = upload_vector(in.k_scale), vs = upload_vector(in.v_scale);
  GuardedBuffer idx = upload_vector(in.indices);
  GuardedBuffer ko = upload_vector(in.guarded_output()), vo = upload_vector(in.guarded_output());
  kernels::Fp8StageParams p =
      in.params(static_cast<const uint8_t*>(kc.data()), static_cast<const uint8_t*>(vc.data()),
                static_cast<const float*>(ks.data()), static_cast<const float*>(vs.data()),
                static_cast<const int32_t*>(idx.data()), static_cast<uint16_t*>(ko.data()),
                static_cast<uint16_t*>(vo.data()), nullptr);
  kernels::Fp8StageParams empty = p;
  empty.num_pages = 0;
  kernels::cuda::fp8_stage_run(empty, nullptr);
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> untouched = ko.download<uint16_t>();
  for (uint16_t x : untouched) ASSERT_EQ(x, testing::kStageGuardValue);
  kernels::Fp8StageParams odd = p;
  odd.k_out = static_cast<uint16_t*>(p.k_out) + 1;
  EXPECT_THROW(kernels::cuda::fp8_stage_run(odd, nullptr), Error);
}

}  // namespace
}  // namespace longctx::gpu_test
