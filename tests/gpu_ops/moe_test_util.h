// The MoE GPU tests' shared inputs: seeded host tensors and a layer's routing inputs and expert
// weights on the GPU (moe_test.cpp, moe_perf_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>

#include "core/device_pool.h"
#include "gpu_ops/gpu_ops_util.h"
#include "longctx/core/parallel.h"
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

// splitmix64's finalizer: the hash of the fast generators below.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Expert weights on the host, uniform in [lo, hi) from a hash of (seed, i), written in dtype
// (f32 / bf16 / f16) by all cores: an 80B layer's 1.6G weights take a fraction of a second where
// random_host's sequential generator takes tens of seconds of the GPU machine's time.
inline Tensor random_weights(const Shape& shape, DType dtype, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, dtype);
  void* base = t.data_ptr();
  parallel_for(
      t.numel(),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const float u = float(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 40) * 0x1p-24f;
          const float v = lo + (hi - lo) * u;
          if (dtype == DType::kBF16)
            static_cast<uint16_t*>(base)[i] = f32_to_bf16(v);
          else if (dtype == DType::kF16)
            static_cast<uint16_t*>(base)[i] = f32_to_f16(v);
          else
            static_cast<float*>(base)[i] = v;
        }
      },
      1 << 16);
  return t;
}

// `step` captured once on `stream` as a CUDA graph whose buffers come from a private device pool,
// as the engine's decode graphs' do: one eager call first (so the pool holds its segments and the
// capture allocates nothing from the driver), then the capture. The graph and the pool go with
// the object.
class PrivatePoolGraph {
 public:
  PrivatePoolGraph(const TestStream& stream, const std::function<void()>& step)
      : pool_(detail::device_pool(kGpu.index)), id_(pool_.create_private_pool()) {
    cudaGraph_t graph = nullptr;
    pool_.begin_private(id_);
    try {
      step();
      stream.sync();
      LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
      step();
      LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
    } catch (...) {
      pool_.end_private();
      pool_.release_private_pool(id_);
      throw;
    }
    pool_.end_private();
    graph_ = graph;
    LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  PrivatePoolGraph(const PrivatePoolGraph&) = delete;
  PrivatePoolGraph& operator=(const PrivatePoolGraph&) = delete;
  ~PrivatePoolGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    cudaDeviceSynchronize();  // replays done before the pool's memory goes back
    pool_.release_private_pool(id_);
  }
  void launch(const TestStream& stream) const {
    LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec_, stream.get()));
  }

 private:
  detail::DevicePool& pool_;
  uint64_t id_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

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
