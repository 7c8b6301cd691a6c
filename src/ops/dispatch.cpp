// Device dispatch of every op: checks that an op's tensors share one device and calls the twin
// for it. A CUDA twin (`<op>_cuda`, in `<op>_cuda.cu`) is called only in a CUDA build; a CPU-only
// build has no .cu files and rejects device tensors with a clear error.
#include "longctx/core/error.h"
#include "ops/add.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/embedding.h"
#include "ops/gather_rows.h"
#include "ops/linear.h"
#include "ops/linear_attention.h"
#include "ops/moe.h"
#include "ops/op_utils.h"
#include "ops/qk_norm_rope.h"
#include "ops/quantized_linear.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/sampling.h"
#include "ops/silu_and_mul.h"

namespace longctx::ops {

namespace {

[[noreturn]] void no_cuda_twin(const char* op) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "{}: no CUDA implementation yet (CPU tensors only)", op);
}

[[maybe_unused]] [[noreturn]] void no_cuda_build(const char* op) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "{}: CUDA tensors need a build with LONGCTX_CUDA=ON (this one is CPU-only)", op);
}

}  // namespace

#ifdef LONGCTX_WITH_CUDA
#define LONGCTX_CUDA_TWIN(op, call) return call
#else
#define LONGCTX_CUDA_TWIN(op, call) no_cuda_build(op)
#endif

void embedding_shard(const Tensor& ids, const Tensor& table, int64_t first_row, const Tensor& out,
                     float scale) {
  if (common_device("embedding", {&ids, &table, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("embedding", embedding_shard_cuda(ids, table, first_row, out, scale));
  embedding_shard_cpu(ids, table, first_row, out, scale);
}

void embedding(const Tensor& ids, const Tensor& table, const Tensor& out, float scale) {
  if (common_device("embedding", {&ids, &table, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("embedding", embedding_cuda(ids, table, out, scale));
  embedding_cpu(ids, table, out, scale);
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  if (common_device("rms_norm", {&x, &weight, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("rms_norm", rms_norm_cuda(x, weight, eps, out));
  rms_norm_cpu(x, weight, eps, out);
}

void qk_norm_rope(const Tensor& qk, int64_t q_heads, const Tensor& q_weight, const Tensor& k_weight,
                  float eps, const Tensor& positions, const RopeArgs& rope) {
  if (common_device("qk_norm_rope", {&qk, &q_weight, &k_weight, &positions}).is_cuda())
    LONGCTX_CUDA_TWIN("qk_norm_rope",
                      qk_norm_rope_cuda(qk, q_heads, q_weight, k_weight, eps, positions, rope));
  qk_norm_rope_cpu(qk, q_heads, q_weight, k_weight, eps, positions, rope);
}

void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out) {
  if (common_device("add_rms_norm", {&x, &residual, &weight, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("add_rms_norm", add_rms_norm_cuda(x, residual, weight, eps, out));
  add_rms_norm_cpu(x, residual, weight, eps, out);
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  if (common_device("linear", {&x, &weight, &bias, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("linear", linear_cuda(x, weight, bias, out));
  linear_cpu(x, weight, bias, out);
}

void quantized_linear(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                      const Tensor& bias, const Tensor& out, const Tensor& workspace) {
  if (common_device("quantized_linear", {&x, &w.qweight, &w.scales, &w.qzeros, &bias, &out})
          .is_cuda())
    LONGCTX_CUDA_TWIN("quantized_linear", quantized_linear_cuda(x, w, q, bias, out, workspace));
  quantized_linear_cpu(x, w, q, bias, out);
}

void silu_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (common_device("silu_and_mul", {&gate, &up, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("silu_and_mul", silu_and_mul_cuda(gate, up, out));
  silu_and_mul_cpu(gate, up, out);
}

void moe_route(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
               const Tensor& topk_weights) {
  if (common_device("moe_route", {&logits, &topk_ids, &topk_weights}).is_cuda())
    LONGCTX_CUDA_TWIN("moe_route", moe_route_cuda(logits, renormalize, topk_ids, topk_weights));
  moe_route_cpu(logits, renormalize, topk_ids, topk_weights);
}

void moe_forward(const Tensor& logits, bool renormalize, const MoeArgs& a) {
  if (common_device("moe_forward",
                    {&logits, &a.x, &a.topk_ids, &a.topk_weights, &a.gate_up, &a.down,
                     &a.gate_up_scales, &a.down_scales, &a.shared, &a.shared_gate, &a.out})
          .is_cuda())
    LONGCTX_CUDA_TWIN("moe_forward", moe_forward_cuda(logits, renormalize, a));
  moe_forward_cpu(logits, renormalize, a);
}

void moe_experts(const MoeArgs& a) {
  if (common_device("moe_experts",
                    {&a.x, &a.topk_ids, &a.topk_weights, &a.gate_up, &a.down, &a.gate_up_scales,
                     &a.down_scales, &a.shared, &a.shared_gate, &a.out})
          .is_cuda())
    LONGCTX_CUDA_TWIN("moe_experts", moe_experts_cuda(a));
  moe_experts_cpu(a);
}

void gelu_tanh_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (common_device("gelu_tanh_and_mul", {&gate, &up, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("gelu_tanh_and_mul", gelu_tanh_and_mul_cuda(gate, up, out));
  gelu_tanh_and_mul_cpu(gate, up, out);
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (common_device("add", {&a, &b, &out}).is_cuda()) LONGCTX_CUDA_TWIN("add", add_cuda(a, b, out));
  add_cpu(a, b, out);
}

void rope(const Tensor& x, const Tensor& positions, const RopeArgs& args) {
  if (common_device("rope", {&x, &positions, &args.inv_freq, &args.lens}).is_cuda())
    LONGCTX_CUDA_TWIN("rope", rope_cuda(x, positions, args));
  rope_cpu(x, positions, args);
}

void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  RopeArgs a;
  a.inv_freq = inv_freq;
  rope(x, positions, a);
}

void gather_rows(const Tensor& x, const Tensor& rows, const Tensor& out) {
  if (common_device("gather_rows", {&x, &rows, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("gather_rows", gather_rows_cuda(x, rows, out));
  gather_rows_cpu(x, rows, out);
}

void cast(const Tensor& x, const Tensor& out) {
  if (common_device("cast", {&x, &out}).is_cuda()) LONGCTX_CUDA_TWIN("cast", cast_cuda(x, out));
  cast_cpu(x, out);
}

void attention(const AttentionArgs& a) {
  Device d = common_device("attention", {&a.q, &a.k, &a.v, &a.q_positions, &a.k_positions, &a.out});
  if (d.is_cuda()) no_cuda_twin("attention");
  attention_cpu(a);
}

void sample_rows(const kernels::SamplingBatch& batch, Device device) {
  if (device.is_cuda()) LONGCTX_CUDA_TWIN("sample_rows", sample_rows_cuda(batch, device));
  sample_rows_cpu(batch);
}

void gated_delta_rule(const GatedDeltaRuleArgs& a) {
  if (common_device("gated_delta_rule", {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.out}).is_cuda())
    LONGCTX_CUDA_TWIN("gated_delta_rule", gated_delta_rule_cuda(a));
  gated_delta_rule_cpu(a);
}

void causal_conv1d(const CausalConv1dArgs& a) {
  if (common_device("causal_conv1d", {&a.x, &a.weight, &a.out}).is_cuda())
    LONGCTX_CUDA_TWIN("causal_conv1d", causal_conv1d_cuda(a));
  causal_conv1d_cpu(a);
}

void sigmoid_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (common_device("sigmoid_and_mul", {&gate, &up, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("sigmoid_and_mul", sigmoid_and_mul_cuda(gate, up, out));
  sigmoid_and_mul_cpu(gate, up, out);
}

void delta_rule_gates(const Tensor& b, const Tensor& a, const Tensor& a_neg, const Tensor& dt_bias,
                      const Tensor& g, const Tensor& beta) {
  if (common_device("delta_rule_gates", {&b, &a, &a_neg, &dt_bias, &g, &beta}).is_cuda())
    LONGCTX_CUDA_TWIN("delta_rule_gates", delta_rule_gates_cuda(b, a, a_neg, dt_bias, g, beta));
  delta_rule_gates_cpu(b, a, a_neg, dt_bias, g, beta);
}

void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps,
                    const Tensor& out) {
  if (common_device("rms_norm_gated", {&x, &z, &weight, &out}).is_cuda())
    LONGCTX_CUDA_TWIN("rms_norm_gated", rms_norm_gated_cuda(x, z, weight, eps, out));
  rms_norm_gated_cpu(x, z, weight, eps, out);
}

}  // namespace longctx::ops
