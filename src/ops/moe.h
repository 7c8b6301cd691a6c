// The mixture-of-experts feed-forward of Qwen2-MoE / Qwen3-MoE (transformers'
// Qwen2MoeTopKRouter + Qwen2MoeExperts), in two ops:
//
//   moe_route:   probs = softmax(router_logits) in fp32; the top-k experts of each token by
//                probability; their probabilities as weights, divided by their sum when
//                `renormalize` (norm_topk_prob).
//   moe_experts: out[t] = sum_j weight[t, j] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t]))
//                over the token's experts e = ids[t, j], plus sigmoid(shared_gate[t]) * shared[t]
//                when a shared expert's output is given (Qwen2-MoE).
//
// Ties: transformers picks with torch.topk, whose order among equal values is unspecified (its
// documentation says the indices of tied elements are not guaranteed stable; on the CPU it
// selects with std::nth_element / std::partial_sort on values alone, and pytorch issue 88184
// shows topk(k=1) of four equal values returning index 2). So no rule reproduces torch on every
// tie. Both twins use the stable rule (larger probability first, the lower expert index among
// equal ones, as tf.math.top_k and ONNX TopK specify), deterministic across devices and batch
// shapes. A tie needs two of a token's probabilities to be bit-equal (equal router logits, or ones
// a rounding apart); it changes only which of two equally weighted experts is taken, and
// random-weight fixtures do not hit one.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"

namespace longctx::ops {

// logits: [T, E] f32/bf16/f16 (rows contiguous); topk_ids: [T, k] i32; topk_weights: [T, k] f32,
// both contiguous, k <= E. Row t's ids are sorted by descending probability (ties: lower id).
void moe_route(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
               const Tensor& topk_weights);
void moe_route_cpu(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
                   const Tensor& topk_weights);
// The CUDA routing kernel: kSort (E <= kMoeRouteSortMaxExperts) sorts each token's experts in one
// CTA, kPerPick runs one warp per token that recomputes the probabilities on every pick (what
// kAuto runs above the limit); both give the same ids and weights to the bit
// (tests/gpu_ops/moe_route_test.cpp compares them). kSort above the limit throws
// Error(kUnsupported).
enum class MoeRouteKernel { kAuto, kSort, kPerPick };
void moe_route_cuda(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
                    const Tensor& topk_weights, MoeRouteKernel kernel = MoeRouteKernel::kAuto);

struct MoeArgs {
  Tensor x;             // [T, hidden] activations, contiguous
  Tensor topk_ids;      // [T, k] i32 in [0, E)
  Tensor topk_weights;  // [T, k] f32
  Tensor gate_up;       // [E, 2 inter, hidden]: each expert's gate rows, then its up rows
  Tensor down;          // [E, hidden, inter]
  // FP8 block experts (a `quant_method: fp8` checkpoint's experts kept packed): gate_up and down
  // then hold F8_E4M3 codes, W = code * the f32 scale of its [block_out, block_in] block. Gate
  // and up are blocked apart (a block never spans both), so gate_up's block rows are gate's
  // ceil(inter / block_out), then up's. Undefined (and block sizes 0) for float experts.
  Tensor gate_up_scales;  // [E, 2 ceil(inter / block_out), ceil(hidden / block_in)] f32
  Tensor down_scales;     // [E, ceil(hidden / block_out), ceil(inter / block_in)] f32
  int64_t block_out = 0, block_in = 0;
  Tensor shared;       // optional [T, hidden]: the shared expert's output ...
  Tensor shared_gate;  // ... [T, 1] f32/act: its gate logit (out += sigmoid(gate) * shared)
  Tensor out;          // [T, hidden], contiguous, not overlapping the inputs
};
void moe_experts(const MoeArgs& args);
void moe_experts_cpu(const MoeArgs& args);

// Whether the MoE ops on `device` run FP8 block experts (MoeArgs::gate_up_scales), so that a
// model keeps them packed there: the CPU twin (dequantizing row by row in fp32) and the CUDA twin
// (moe_cuda.cu: the decode GEMVs read the codes and scale each 16-code partial sum; the grouped
// GEMMs and cuBLASLt dequantize tiles or one expert at a time to x's 16-bit dtype).
bool moe_runs_fp8_experts(Device device);

// Which CUDA path computes the routed experts (moe_schedule.h, moe_cuda.cu). kAuto: the decode
// GEMVs for a few tokens, cuBLASLt per expert once the experts average kMoeLtMinRowsPerExpert
// rows (not under CUDA graph capture: it reads the expert counts on the host), else the grouped
// GEMM kernels. The others force one, for tests and benchmarks: kKernels the project's kernels as
// moe_path picks them (never a host sync), kCublasLt the cuBLASLt path, which throws
// Error(kUnsupported) where it cannot run (moe_lt_refusal).
enum class MoeBackend { kAuto, kKernels, kCublasLt };
// The tensor-core grouped GEMMs' row tile: kPlanned as moe_tc_rows picks it from the step's shape
// (moe_schedule.h), kLarge / kSmall forced (kMoeTcRows / kMoeTcSmallRows), for tests and the perf
// rows. The other paths ignore it.
enum class MoeTcTile { kPlanned, kLarge, kSmall };
void moe_experts_cuda(const MoeArgs& args, MoeBackend backend = MoeBackend::kAuto,
                      MoeTcTile tile = MoeTcTile::kPlanned);

// The routed block from its router logits: moe_route(logits, renormalize, args.topk_ids,
// args.topk_weights), then moe_experts(args), whose routing inputs it writes. logits: [T, E]
// with E the experts of args.gate_up. Both twins are those two calls.
void moe_forward(const Tensor& logits, bool renormalize, const MoeArgs& args);
void moe_forward_cpu(const Tensor& logits, bool renormalize, const MoeArgs& args);
void moe_forward_cuda(const Tensor& logits, bool renormalize, const MoeArgs& args);

// The shape checks both twins share (T, k, E, hidden, inter; FP8 experts' codes, scales and block
// sizes), naming the argument at fault.
struct MoeShape {
  int64_t tokens = 0, top_k = 0, experts = 0, hidden = 0, inter = 0;
};
MoeShape check_moe_args(const MoeArgs& args);
void check_moe_route_args(const Tensor& logits, const Tensor& topk_ids, const Tensor& topk_weights);

}  // namespace longctx::ops
