// Device dispatch of every op: checks that an op's tensors share one device and calls the twin
// for it. A CUDA twin (`<op>_cuda.cu`) declares `<op>_cuda` in the op's header and replaces the
// matching no_cuda_twin() call below.
#include "longctx/core/error.h"
#include "ops/add.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/op_utils.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/silu_and_mul.h"

namespace longctx::ops {

namespace {

[[noreturn]] void no_cuda_twin(const char* op) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "{}: no CUDA implementation yet (CPU tensors only)", op);
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  if (common_device("embedding", {&ids, &table, &out}).is_cuda()) no_cuda_twin("embedding");
  embedding_cpu(ids, table, out);
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  if (common_device("rms_norm", {&x, &weight, &out}).is_cuda()) no_cuda_twin("rms_norm");
  rms_norm_cpu(x, weight, eps, out);
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  if (common_device("linear", {&x, &weight, &bias, &out}).is_cuda()) no_cuda_twin("linear");
  linear_cpu(x, weight, bias, out);
}

void silu_and_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (common_device("silu_and_mul", {&gate, &up, &out}).is_cuda()) no_cuda_twin("silu_and_mul");
  silu_and_mul_cpu(gate, up, out);
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (common_device("add", {&a, &b, &out}).is_cuda()) no_cuda_twin("add");
  add_cpu(a, b, out);
}

void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  if (common_device("rope", {&x, &positions, &inv_freq}).is_cuda()) no_cuda_twin("rope");
  rope_cpu(x, positions, inv_freq);
}

void attention(const AttentionArgs& a) {
  Device d = common_device("attention", {&a.q, &a.k, &a.v, &a.q_positions, &a.k_positions, &a.out});
  if (d.is_cuda()) no_cuda_twin("attention");
  attention_cpu(a);
}

}  // namespace longctx::ops
