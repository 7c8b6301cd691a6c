// LONGCTX_PERF=1 timings of the MoE ops: one Qwen3-30B-A3B layer's experts on each prefill path,
// its expert GEMMs dense, per expert and grouped, and the MoE block's ops at decode batches
// (Qwen3-30B-A3B, Qwen3-Next-80B-A3B), eager and as CUDA graphs.
#include <cublas_v2.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gpu_ops/gpu_ops_util.h"
#include "gpu_ops/moe_test_util.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/moe_decode.h"
#include "ops/moe_schedule.h"
#include "ops/rms_norm.h"

namespace longctx::gpu_ops_test {
namespace {

// One Qwen3-30B-A3B layer's routed experts (128 experts, top-8, hidden 2048, inter 768, bf16):
// decode at 1 token (GB/s of the 8 routed experts' 75.5 MB, cycling 16 routings so that L2 holds
// little of them) and prefill chunks (TFLOP/s of 2 x 3 x 2048 x 768 x 8 FLOPs per token).
TEST(GpuOpsPerf, MoeQwen3_30B_A3B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  constexpr int64_t kE = 128, kK = 8, kH = 2048, kI = 768;
  const double flops_per_token = 2.0 * 3 * kH * kI * kK;
  {
    constexpr int kRoutings = 16;
    DeviceMoe m(kRoutings, kE, kK, kH, kI, kBf, 3);
    ops::moe_route(m.logits, true, m.ids, m.weights);
    int call = 0;
    auto op = [&] {
      const int64_t t = call++ % kRoutings;
      ops::MoeArgs a = m.args;
      a.x = m.args.x.slice(0, t, t + 1);
      a.topk_ids = m.ids.slice(0, t, t + 1);
      a.topk_weights = m.weights.slice(0, t, t + 1);
      a.out = m.args.out.slice(0, t, t + 1);
      ops::moe_experts(a);
    };
    const double ms = time_ms(s, op);
    const double bytes = 3.0 * kH * kI * kK * 2;
    std::printf("  moe decode  T=1     %9.4f ms %7.0f GB/s routed weights\n", ms,
                bytes / (ms * 1e6));
  }
  // Prefill on each path, and what the automatic choice takes.
  for (int64_t t : {512, 4096, 8192, 16384, 32768}) {
    DeviceMoe m(t, kE, kK, kH, kI, kBf, 4);
    ops::moe_route(m.logits, true, m.ids, m.weights);
    const ops::MoePath auto_path = ops::moe_auto_path(t, kK, kE, kH, kI, true, true, false);
    for (ops::MoeBackend b : {ops::MoeBackend::kKernels, ops::MoeBackend::kCublasLt}) {
      const double ms = time_ms(s, [&] { ops::moe_experts_cuda(m.args, b); });
      const bool is_auto = b == (auto_path == ops::MoePath::kCublasLt ? ops::MoeBackend::kCublasLt
                                                                      : ops::MoeBackend::kKernels);
      std::printf("  moe prefill T=%-6lld %-9s %9.4f ms %7.1f TFLOP/s%s\n", (long long)t,
                  backend_name(b), ms, flops_per_token * double(t) / (ms * 1e9),
                  is_auto ? "  (auto)" : "");
    }
  }
  std::fflush(stdout);
}

// ms per call of op(i), i = 0 .. calls - 1, captured once as one CUDA graph and replayed: what a
// decode graph pays for these launches, gaps between kernels and PDL overlap included. The
// capture's buffers come from a private pool, as the engine's decode graphs' do.
double graph_ms_per_call(const TestStream& s, const std::function<void(int)>& op, int calls) {
  const PrivatePoolGraph graph(s, [&] {
    for (int i = 0; i < calls; ++i) op(i);
  });
  return time_ms(s, [&] { graph.launch(s); }) / calls;
}

// Qwen3-30B-A3B's MoE block at decode batches (T = 1, 8, 32): each op alone (router GEMV, routing,
// the routed experts) and the whole block (router, moe_route, moe_experts: what moe_forward runs),
// eagerly and as a graph of 48 calls (the model's layers). The calls cycle
// over kLayers layers' own weights (1.2 GB of experts each), so a call's expert rows are not in
// L2 from the call before. ms per call; x48 is the block's share of a decode step.
// The MoE block's ops at decode batches, one model's shapes (bf16, hidden 2048), 4 layers' weights
// cycled so that L2 holds little of them; with the shared expert's output added by the combine
// where the model has one.
// fp8: the experts FP8 block-quantized (128 x 128 blocks, f32 scales), the GB/s of their codes.
struct DecodeBlockModel {
  const char* name;
  int64_t experts, top_k, inter;
  bool shared;
  bool fp8 = false;
};
void moe_decode_block_rows(const DecodeBlockModel& model) {
  TestStream s;
  const int64_t kE = model.experts, kK = model.top_k, kI = model.inter;
  constexpr int64_t kH = 2048, kLayers = 4;
  constexpr int kModelLayers = 48;
  std::printf("  %s: %lld experts, top-%lld, inter %lld%s%s\n", model.name, (long long)kE,
              (long long)kK, (long long)kI, model.shared ? ", shared expert" : "",
              model.fp8 ? ", FP8 experts" : "");
  constexpr int64_t kBlock = 128;
  const DType wt = model.fp8 ? DType::kFP8E4M3 : kBf;
  struct Layer {
    Tensor router, gate_up, down;        // [E, H], [E, 2 I, H], [E, H, I]
    Tensor gate_up_scales, down_scales;  // FP8: [E, 2 I / 128, H / 128], [E, H / 128, I / 128]
  };
  std::vector<Layer> layers(kLayers);
  const float a0 = 1.f / std::sqrt(float(kH)), a1 = 2.f / std::sqrt(float(kH)),
              a2 = 2.f / std::sqrt(float(kI));
  for (int64_t l = 0; l < kLayers; ++l) {
    Layer& w = layers[l];
    w.router = Tensor::empty({kE, kH}, kBf, kGpu);
    w.gate_up = Tensor::empty({kE, 2 * kI, kH}, wt, kGpu);
    w.down = Tensor::empty({kE, kH, kI}, wt, kGpu);
    fill_uniform(w.router.data_ptr(), w.router.numel(), kBf, uint32_t(20 + 3 * l), -a0, a0);
    if (model.fp8) {  // codes of values in [-448, 448], scales that bring them to the bf16 range
      fill_uniform(w.gate_up.data_ptr(), w.gate_up.numel(), wt, uint32_t(21 + 3 * l), -448, 448);
      fill_uniform(w.down.data_ptr(), w.down.numel(), wt, uint32_t(22 + 3 * l), -448, 448);
      w.gate_up_scales = Tensor::empty({kE, 2 * kI / kBlock, kH / kBlock}, kF32, kGpu);
      w.down_scales = Tensor::empty({kE, kH / kBlock, kI / kBlock}, kF32, kGpu);
      fill_uniform(w.gate_up_scales.data_ptr(), w.gate_up_scales.numel(), kF32, uint32_t(41 + l),
                   0.5f * a1 / 448, 1.5f * a1 / 448);
      fill_uniform(w.down_scales.data_ptr(), w.down_scales.numel(), kF32, uint32_t(51 + l),
                   0.5f * a2 / 448, 1.5f * a2 / 448);
    } else {
      fill_uniform(w.gate_up.data_ptr(), w.gate_up.numel(), kBf, uint32_t(21 + 3 * l), -a1, a1);
      fill_uniform(w.down.data_ptr(), w.down.numel(), kBf, uint32_t(22 + 3 * l), -a2, a2);
    }
  }
  // one token's routed expert rows (FP8: the codes; their scales add 1/4096)
  const double routed_bytes = 3.0 * kH * kI * kK * (model.fp8 ? 1 : 2);
  for (int64_t t : {1, 8, 32}) {
    const Tensor x = random_host({t, kH}, kBf, 7, -1, 1).to(kGpu);
    const Tensor logits = Tensor::empty({t, kE}, kF32, kGpu);
    ops::MoeArgs a;
    a.x = x;
    a.topk_ids = Tensor::empty({t, kK}, DType::kI32, kGpu);
    a.topk_weights = Tensor::empty({t, kK}, kF32, kGpu);
    a.out = Tensor::empty({t, kH}, kBf, kGpu);
    if (model.shared) {
      a.shared = random_host({t, kH}, kBf, 9, -1, 1).to(kGpu);
      a.shared_gate = random_host({t, 1}, kF32, 10, -2, 2).to(kGpu);
    }
    auto layer_args = [&](int i) {
      ops::MoeArgs b = a;
      const Layer& w = layers[i % kLayers];
      b.gate_up = w.gate_up;
      b.down = w.down;
      if (model.fp8) {
        b.gate_up_scales = w.gate_up_scales;
        b.down_scales = w.down_scales;
        b.block_out = b.block_in = kBlock;
      }
      return b;
    };
    auto router = [&](int i) { ops::linear(x, layers[i % kLayers].router, Tensor(), logits); };
    auto route = [&](int) { ops::moe_route(logits, true, a.topk_ids, a.topk_weights); };
    auto experts = [&](int i) { ops::moe_experts(layer_args(i)); };
    auto experts_tile = [&](ops::MoeTcTile tile) {
      return [&, tile](int i) {
        ops::moe_experts_cuda(layer_args(i), ops::MoeBackend::kKernels, tile);
      };
    };
    router(0);
    route(0);  // a real routing for the experts-alone rows
    struct Row {
      const char* name;
      std::function<void(int)> op;
    };
    const Tensor norm_w = random_host({kH}, kBf, 8, 0.5f, 1.5f).to(kGpu);
    const Tensor normed = Tensor::empty({t, kH}, kBf, kGpu);
    const Row rows[] = {
        // one row-wise kernel on [T, hidden]: what any launch costs in the graph
        {"rms_norm (tiny kernel)", [&](int) { ops::rms_norm(x, norm_w, 1e-6f, normed); }},
        {"router GEMV", router},
        {"moe_route", route},
        // the routing kernel that recomputes the probabilities on every pick, one warp a token
        // (above kMoeRouteSortMaxExperts experts; "moe_route" is the CTA sort below it)
        {"moe_route per pick",
         [&](int) {
           ops::moe_route_cuda(logits, true, a.topk_ids, a.topk_weights,
                               ops::MoeRouteKernel::kPerPick);
         }},
        {"moe_experts", experts},
        {"block: route+experts",
         [&](int i) {
           router(i);
           route(i);
           experts(i);
         }},
        // the unfused block with the single-warp routing kernel: what the CTA sort replaces
        {"block: per-pick route",
         [&](int i) {
           router(i);
           ops::moe_route_cuda(logits, true, a.topk_ids, a.topk_weights,
                               ops::MoeRouteKernel::kPerPick);
           experts(i);
         }},
        // the grouped GEMMs' row tiles forced (T > kMoeDecodeMaxTokens: moe_tc_rows picks)
        {"experts: 128-row tile", experts_tile(ops::MoeTcTile::kLarge)},
        {"experts: 32-row tile", experts_tile(ops::MoeTcTile::kSmall)},
    };
    for (const Row& r : rows) {
      if (t <= ops::kMoeDecodeMaxTokens && std::string(r.name).rfind("experts:", 0) == 0) continue;
      int call = 0;
      const double eager = time_ms(s, [&] { r.op(call++); });
      const double graph = graph_ms_per_call(s, r.op, kModelLayers);
      // at T = 1 the experts and the blocks read one token's routed rows (+ the router's)
      const std::string name = r.name;
      const double bytes = name == "moe_experts"         ? routed_bytes
                           : name.rfind("block", 0) == 0 ? routed_bytes + kE * kH * 2
                                                         : 0.0;
      const std::string gbs =
          t == 1 && bytes > 0 ? fmt::format("  {:.0f} GB/s", bytes / (graph * 1e6)) : "";
      std::printf("  moe decode T=%-3lld %-22s eager %8.4f ms  graph %8.4f ms  (x48 %6.3f ms)%s\n",
                  (long long)t, r.name, eager, graph, graph * kModelLayers, gbs.c_str());
    }
    std::fflush(stdout);
  }
}

TEST(GpuOpsPerf, MoeDecodeBlock) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  moe_decode_block_rows({"Qwen3-30B-A3B", 128, 8, 768, false});
}

// Qwen3-Next-80B-A3B's block: 512 experts (moe_route's CTA sort, 45 steps); top-10 (10 down
// warps); inter 512; a shared expert.
TEST(GpuOpsPerf, MoeDecodeBlockQwen3Next80B) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  moe_decode_block_rows({"Qwen3-Next-80B-A3B", 512, 10, 512, true});
}

// The same blocks with FP8 block experts (the checkpoints' quant_method fp8): half the bytes per
// routed row, so the experts' GEMVs should take about half the bf16 rows' time at T = 1.
TEST(GpuOpsPerf, MoeDecodeBlockFp8) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  moe_decode_block_rows({"Qwen3-30B-A3B", 128, 8, 768, false, true});
}

TEST(GpuOpsPerf, MoeDecodeBlockQwen3Next80BFp8) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  moe_decode_block_rows({"Qwen3-Next-80B-A3B", 512, 10, 512, true, true});
}

// One Qwen3-30B-A3B layer's experts at prefill sizes, bf16 beside FP8 block experts (the same
// shapes), on the grouped kernels and on cuBLASLt (FP8: each expert dequantized before its GEMMs).
TEST(GpuOpsPerf, MoePrefillFp8) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  constexpr int64_t kE = 128, kK = 8, kH = 2048, kI = 768, kBlock = 128;
  const double flops_per_token = 2.0 * 3 * kH * kI * kK;
  for (int64_t t : {4096, 32768}) {
    DeviceMoe m(t, kE, kK, kH, kI, kBf, 4);
    ops::moe_route(m.logits, true, m.ids, m.weights);
    ops::MoeArgs q = m.args;
    q.gate_up = Tensor::empty({kE, 2 * kI, kH}, DType::kFP8E4M3, kGpu);
    q.down = Tensor::empty({kE, kH, kI}, DType::kFP8E4M3, kGpu);
    fill_uniform(q.gate_up.data_ptr(), q.gate_up.numel(), DType::kFP8E4M3, 5, -448, 448);
    fill_uniform(q.down.data_ptr(), q.down.numel(), DType::kFP8E4M3, 6, -448, 448);
    q.gate_up_scales = Tensor::empty({kE, 2 * kI / kBlock, kH / kBlock}, kF32, kGpu);
    q.down_scales = Tensor::empty({kE, kH / kBlock, kI / kBlock}, kF32, kGpu);
    fill_uniform(q.gate_up_scales.data_ptr(), q.gate_up_scales.numel(), kF32, 7, 1e-4f, 1e-3f);
    fill_uniform(q.down_scales.data_ptr(), q.down_scales.numel(), kF32, 8, 1e-4f, 1e-3f);
    q.block_out = q.block_in = kBlock;
    for (const ops::MoeArgs* a : {&m.args, &q})
      for (ops::MoeBackend b : {ops::MoeBackend::kKernels, ops::MoeBackend::kCublasLt}) {
        const double ms = time_ms(s, [&] { ops::moe_experts_cuda(*a, b); });
        std::printf("  moe prefill T=%-6lld %-4s %-9s %9.4f ms %7.1f TFLOP/s\n", (long long)t,
                    a == &q ? "fp8" : "bf16", backend_name(b), ms,
                    flops_per_token * double(t) / (ms * 1e9));
      }
  }
  std::fflush(stdout);
}

// The expert GEMMs of Qwen3-30B-A3B's layer with `rows` rows per expert (256: a 4K prefill, 2048:
// 32K), gate/up and down (bf16 out, as the cuBLASLt path runs them), three ways: one dense cuBLASLt
// GEMM over all the rows (the ceiling), linear_cuda per expert (the cuBLASLt path's loop; also its
// host time per call), and one cublasGemmGroupedBatchedEx call over the experts as groups (measured
// slower than the loop on an H100 at both sizes, so the op does not use it).
TEST(GpuOpsPerf, MoeExpertGemms) {
  if (!perf_mode()) GTEST_SKIP() << "LONGCTX_PERF=1 only";
  TestStream s;
  constexpr int64_t kE = 128, kH = 2048, kI = 768;
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(handle, s.get()), CUBLAS_STATUS_SUCCESS);
  Tensor workspace = Tensor::empty({int64_t(32) << 20}, DType::kU8, kGpu);
  ASSERT_EQ(cublasSetWorkspace(handle, workspace.data_ptr(), workspace.nbytes()),
            CUBLAS_STATUS_SUCCESS);
  Tensor w1 = Tensor::empty({kE, 2 * kI, kH}, kBf, kGpu),
         w2 = Tensor::empty({kE, kH, kI}, kBf, kGpu);
  fill_uniform(w1.data_ptr(), w1.numel(), kBf, 8, -0.05f, 0.05f);
  fill_uniform(w2.data_ptr(), w2.numel(), kBf, 9, -0.05f, 0.05f);
  for (int64_t rows : {256, 2048}) {
    const int64_t total = rows * kE;
    Tensor x = Tensor::empty({total, kH}, kBf, kGpu), h = Tensor::empty({total, 2 * kI}, kBf, kGpu);
    Tensor act = Tensor::empty({total, kI}, kBf, kGpu), y = Tensor::empty({total, kH}, kBf, kGpu);
    fill_uniform(x.data_ptr(), x.numel(), kBf, 10, -1.f, 1.f);
    fill_uniform(act.data_ptr(), act.numel(), kBf, 11, -1.f, 1.f);
    struct Gemm {
      const char* name;
      const Tensor *in, *w, *out;
      int64_t k, n;  // reduction, output columns
    };
    for (const Gemm& g :
         {Gemm{"gate/up", &x, &w1, &h, kH, 2 * kI}, Gemm{"down", &act, &w2, &y, kI, kH}}) {
      const double flops = 2.0 * double(total) * g.k * g.n;
      const double dense = time_ms(s, [&] {
        ops::linear_cuda(*g.in, g.w->select(0, 0), Tensor(), *g.out, ops::LinearBackend::kCublasLt);
      });
      auto loop = [&] {
        for (int64_t e = 0; e < kE; ++e)
          ops::linear_cuda(g.in->slice(0, e * rows, (e + 1) * rows), g.w->select(0, e), Tensor(),
                           g.out->slice(0, e * rows, (e + 1) * rows),
                           ops::LinearBackend::kCublasLt);
      };
      const double per_expert = time_ms(s, loop);
      s.sync();
      const auto t0 = std::chrono::steady_clock::now();
      loop();
      const double host_us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          kE;
      s.sync();
      // cuBLAS grouped: column-major D [n, rows] = W^T (k x n, read as A [k, n] with op T) x
      // in^T ([k, rows]), as linear_cuda lays it out; pointer arrays on the device.
      const cudaDataType_t out_type = g.out->dtype() == kF32 ? CUDA_R_32F : CUDA_R_16BF;
      const size_t out_size = g.out->dtype() == kF32 ? 4 : 2;
      std::vector<const void*> a_ptrs(kE), b_ptrs(kE);
      std::vector<void*> c_ptrs(kE);
      for (int64_t e = 0; e < kE; ++e) {
        a_ptrs[e] = static_cast<const char*>(g.w->data_ptr()) + e * g.n * g.k * 2;
        b_ptrs[e] = static_cast<const char*>(g.in->data_ptr()) + e * rows * g.k * 2;
        c_ptrs[e] = static_cast<char*>(g.out->data_ptr()) + e * rows * g.n * out_size;
      }
      Tensor ptrs = Tensor::empty({3 * kE}, DType::kI64, kGpu);
      std::vector<const void*> all(a_ptrs);
      all.insert(all.end(), b_ptrs.begin(), b_ptrs.end());
      all.insert(all.end(), c_ptrs.begin(), c_ptrs.end());
      LONGCTX_CUDA_CHECK(cudaMemcpy(ptrs.data_ptr(), all.data(), all.size() * sizeof(void*),
                                    cudaMemcpyHostToDevice));
      const auto* d_ptrs = static_cast<const void* const*>(ptrs.data_ptr());
      std::vector<cublasOperation_t> ta(kE, CUBLAS_OP_T), tb(kE, CUBLAS_OP_N);
      std::vector<int> m(kE, int(g.n)), n(kE, int(rows)), k(kE, int(g.k)), lda(kE, int(g.k)),
          ldb(kE, int(g.k)), ldc(kE, int(g.n)), sizes(kE, 1);
      std::vector<float> alpha(kE, 1.f), beta(kE, 0.f);
      cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
      const double grouped = time_ms(s, [&] {
        st = cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                        alpha.data(), d_ptrs, CUDA_R_16BF, lda.data(), d_ptrs + kE,
                                        CUDA_R_16BF, ldb.data(), beta.data(),
                                        const_cast<void* const*>(d_ptrs + 2 * kE), out_type,
                                        ldc.data(), int(kE), sizes.data(), CUBLAS_COMPUTE_32F);
      });
      std::printf(
          "  experts %lld x %lld rows %-7s dense %8.4f ms %6.1f TFLOP/s | per expert %8.4f "
          "ms %6.1f TFLOP/s (host %.1f us/GEMM) | grouped %8.4f ms %6.1f TFLOP/s%s\n",
          (long long)kE, (long long)rows, g.name, dense, flops / (dense * 1e9), per_expert,
          flops / (per_expert * 1e9), host_us, grouped, flops / (grouped * 1e9),
          st == CUBLAS_STATUS_SUCCESS ? "" : " (cublas error)");
      std::fflush(stdout);
    }
  }
  cublasDestroy(handle);
}

}  // namespace
}  // namespace longctx::gpu_ops_test
