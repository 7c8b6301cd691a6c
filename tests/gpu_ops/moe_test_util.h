// The MoE GPU tests' shared inputs: seeded host tensors and a layer's routing inputs and expert
// weights on the GPU (moe_test.cpp, moe_perf_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

#include "gpu_ops/gpu_ops_util.h"
#include "ops/moe.h"

namespace longctx::gpu_ops_test {

inline constexpr DType kBf = DType::kBF16, kF16 = DType::kF16, kF32 = DType::kF32;

inline const char* backend_name(ops::MoeBackend b) {
  switch (b) {
    case ops::MoeBackend::kKernels:
      return "kernels";
    case ops::MoeBackend::kCublasLt:
      return "cublaslt";
    default:
      return "auto";
  }
}

inline Tensor random_host(const Shape& shape, DType dtype, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor f = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = d(rng);
  return dtype == DType::kF32 ? f : f.to_dtype(DType::kF32).to_dtype(dtype);
}

// Random routing inputs and weights on the GPU for the graph and perf tests.
struct DeviceMoe {
  Tensor logits, ids, weights;
  ops::MoeArgs args;
  DeviceMoe(int64_t tokens, int64_t experts, int64_t k, int64_t hidden, int64_t inter, DType dtype,
            uint32_t seed) {
    logits = random_host({tokens, experts}, kF32, seed, -3, 3).to(kGpu);
    ids = Tensor::empty({tokens, k}, DType::kI32, kGpu);
    weights = Tensor::empty({tokens, k}, kF32, kGpu);
    args.x = random_host({tokens, hidden}, dtype, seed + 1, -1, 1).to(kGpu);
    args.topk_ids = ids;
    args.topk_weights = weights;
    const float a1 = 2.f / std::sqrt(float(hidden)), a2 = 2.f / std::sqrt(float(inter));
    args.gate_up = Tensor::empty({experts, 2 * inter, hidden}, dtype, kGpu);
    args.down = Tensor::empty({experts, hidden, inter}, dtype, kGpu);
    fill_uniform(args.gate_up.data_ptr(), args.gate_up.numel(), dtype, seed + 2, -a1, a1);
    fill_uniform(args.down.data_ptr(), args.down.numel(), dtype, seed + 3, -a2, a2);
    args.out = Tensor::empty({tokens, hidden}, dtype, kGpu);
  }
  void run(bool renormalize = true, ops::MoeBackend backend = ops::MoeBackend::kAuto) {
    ops::moe_route(logits, renormalize, ids, weights);
    ops::moe_experts_cuda(args, backend);
  }
  void forward(bool renormalize = true) { ops::moe_forward(logits, renormalize, args); }
};

}  // namespace longctx::gpu_ops_test
