#include "ops/op_utils.h"
#include "ops/qk_norm_rope.h"
#include "ops/rms_norm.h"

namespace longctx::ops {

namespace {

void check_head_weight(const char* arg, const Tensor& w, int64_t head_dim) {
  constexpr const char* kOp = "qk_norm_rope";
  check_contiguous(kOp, arg, w);
  check_float_weight(kOp, arg, w);
  check_shape(kOp, arg, w, {head_dim});
}

}  // namespace

QkNormRopeParams qk_norm_rope_params(const Tensor& qk, int64_t q_heads, const Tensor& q_weight,
                                     const Tensor& k_weight, float eps, const Tensor& positions,
                                     const RopeArgs& rope) {
  QkNormRopeParams p;
  p.rope = rope_params(qk, positions, rope);
  LONGCTX_CHECK(q_heads >= 0 && q_heads <= p.rope.heads, ErrorCode::kInvalidArgument,
                "qk_norm_rope: q_heads {} not in [0, {}] (qk {})", q_heads, p.rope.heads, qk.str());
  check_head_weight("q_weight", q_weight, p.rope.head_dim);
  check_head_weight("k_weight", k_weight, p.rope.head_dim);
  common_device("qk_norm_rope", {&qk, &q_weight, &k_weight, &positions});
  p.q_heads = q_heads;
  p.q_weight = q_weight.data_ptr();
  p.k_weight = k_weight.data_ptr();
  p.q_weight_dtype = q_weight.dtype();
  p.k_weight_dtype = k_weight.dtype();
  p.eps = eps;
  return p;
}

// The reference is the unfused sequence itself.
void qk_norm_rope_cpu(const Tensor& qk, int64_t q_heads, const Tensor& q_weight,
                      const Tensor& k_weight, float eps, const Tensor& positions,
                      const RopeArgs& rope) {
  const QkNormRopeParams p =
      qk_norm_rope_params(qk, q_heads, q_weight, k_weight, eps, positions, rope);
  LONGCTX_CHECK(p.rope.device.is_cpu(), ErrorCode::kInvalidArgument,
                "qk_norm_rope_cpu: tensors are on {}", p.rope.device.str());
  const int64_t heads = p.rope.heads;
  if (q_heads > 0) {
    const Tensor q = qk.slice(1, 0, q_heads);
    rms_norm_cpu(q, q_weight, eps, q);
  }
  if (q_heads < heads) {
    const Tensor k = qk.slice(1, q_heads, heads);
    rms_norm_cpu(k, k_weight, eps, k);
  }
  rope_cpu(qk, positions, rope);
}

}  // namespace longctx::ops
