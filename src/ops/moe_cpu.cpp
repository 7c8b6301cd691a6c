// CPU reference of the MoE ops: a readable loop over tokens and each token's experts, fp32
// throughout (weights converted row by row), as transformers' eager Qwen2MoeExperts computes
// it at float32.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/ceil_div.h"
#include "longctx/core/parallel.h"
#include "ops/moe.h"
#include "ops/op_utils.h"

namespace longctx::ops {

namespace {

constexpr const char* kRoute = "moe_route";
constexpr const char* kExperts = "moe_experts";

// Row r of a contiguous float matrix [rows, cols] at `data` (any float dtype) as f32.
const float* matrix_row_f32(const Tensor& t, int64_t offset_elems, int64_t cols, float* buf) {
  const void* p = element_ptr(t, offset_elems);
  if (t.dtype() == DType::kF32) return static_cast<const float*>(p);
  convert_to_f32(p, t.dtype(), cols, buf);
  return buf;
}

// Row r of expert e's [rows, cols] matrix in `w` (its experts [E, rows, cols]) as f32: float
// weights converted, FP8 codes times their block's scale (`scales` [E, block rows, ceil(cols /
// block_in)]; block row `block_row`), in f32 as the loader's dequantize computes them.
const float* expert_row_f32(const Tensor& w, const Tensor& scales, int64_t block_row,
                            int64_t block_in, int64_t e, int64_t r, int64_t rows, int64_t cols,
                            float* buf) {
  const int64_t offset = (e * rows + r) * cols;
  if (!scales.defined()) return matrix_row_f32(w, offset, cols, buf);
  const uint8_t* codes = w.data<uint8_t>() + offset;
  const int64_t scale_cols = scales.size(2);
  const float* s = scales.data<float>() + (e * scales.size(1) + block_row) * scale_cols;
  for (int64_t c = 0; c < cols; ++c) buf[c] = fp8e4m3_to_f32(codes[c]) * s[c / block_in];
  return buf;
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void check_moe_route_args(const Tensor& logits, const Tensor& topk_ids,
                          const Tensor& topk_weights) {
  check_float_activation(kRoute, "logits", logits);
  check_rank(kRoute, "logits", logits, 2);
  check_contiguous(kRoute, "logits", logits);
  check_contiguous(kRoute, "topk_ids", topk_ids);
  check_contiguous(kRoute, "topk_weights", topk_weights);
  check_dtype(kRoute, "topk_ids", topk_ids, DType::kI32);
  check_dtype(kRoute, "topk_weights", topk_weights, DType::kF32);
  check_rank(kRoute, "topk_ids", topk_ids, 2);
  const int64_t t = logits.size(0), e = logits.size(1), k = topk_ids.size(1);
  LONGCTX_CHECK(topk_ids.size(0) == t && k >= 1 && k <= e, ErrorCode::kInvalidArgument,
                "{}: topk_ids {} must be [{}, k] with 1 <= k <= {} experts", kRoute, topk_ids.str(),
                t, e);
  check_shape(kRoute, "topk_weights", topk_weights, {t, k});
}

bool moe_runs_fp8_experts(Device device) { return device.is_cpu() || device.is_cuda(); }

MoeShape check_moe_args(const MoeArgs& a) {
  check_float_activation(kExperts, "x", a.x);
  check_float_activation(kExperts, "out", a.out);
  const bool fp8 = a.gate_up_scales.defined() || a.down_scales.defined();
  if (fp8) {
    check_dtype(kExperts, "gate_up", a.gate_up, DType::kFP8E4M3);
    check_dtype(kExperts, "down", a.down, DType::kFP8E4M3);
    check_dtype(kExperts, "gate_up_scales", a.gate_up_scales, DType::kF32);
    check_dtype(kExperts, "down_scales", a.down_scales, DType::kF32);
    check_contiguous(kExperts, "gate_up_scales", a.gate_up_scales);
    check_contiguous(kExperts, "down_scales", a.down_scales);
    LONGCTX_CHECK(a.block_out > 0 && a.block_in > 0, ErrorCode::kInvalidArgument,
                  "{}: FP8 experts need block sizes > 0 (block_out {}, block_in {})", kExperts,
                  a.block_out, a.block_in);
  } else {
    check_float_weight(kExperts, "gate_up", a.gate_up);
    check_float_weight(kExperts, "down", a.down);
  }
  for (auto [name, t] : {std::pair{"x", &a.x},
                         {"out", &a.out},
                         {"gate_up", &a.gate_up},
                         {"down", &a.down},
                         {"topk_ids", &a.topk_ids},
                         {"topk_weights", &a.topk_weights}})
    check_contiguous(kExperts, name, *t);
  check_rank(kExperts, "x", a.x, 2);
  check_rank(kExperts, "gate_up", a.gate_up, 3);
  check_rank(kExperts, "down", a.down, 3);
  check_rank(kExperts, "topk_ids", a.topk_ids, 2);
  check_dtype(kExperts, "topk_ids", a.topk_ids, DType::kI32);
  check_dtype(kExperts, "topk_weights", a.topk_weights, DType::kF32);
  MoeShape s;
  s.tokens = a.x.size(0);
  s.hidden = a.x.size(1);
  s.experts = a.gate_up.size(0);
  s.inter = a.gate_up.size(1) / 2;
  s.top_k = a.topk_ids.size(1);
  LONGCTX_CHECK(a.gate_up.size(1) % 2 == 0 && s.inter > 0 && a.gate_up.size(2) == s.hidden,
                ErrorCode::kInvalidArgument,
                "{}: gate_up {} must be [experts, 2 inter, hidden {}] with inter > 0", kExperts,
                a.gate_up.str(), s.hidden);
  check_shape(kExperts, "down", a.down, {s.experts, s.hidden, s.inter});
  LONGCTX_CHECK(a.topk_ids.size(0) == s.tokens && s.top_k >= 1 && s.top_k <= s.experts,
                ErrorCode::kInvalidArgument, "{}: topk_ids {} must be [{}, k], 1 <= k <= {}",
                kExperts, a.topk_ids.str(), s.tokens, s.experts);
  check_shape(kExperts, "topk_weights", a.topk_weights, {s.tokens, s.top_k});
  check_shape(kExperts, "out", a.out, {s.tokens, s.hidden});
  if (fp8) {
    check_shape(kExperts, "gate_up_scales", a.gate_up_scales,
                {s.experts, 2 * ceil_div(s.inter, a.block_out), ceil_div(s.hidden, a.block_in)});
    check_shape(kExperts, "down_scales", a.down_scales,
                {s.experts, ceil_div(s.hidden, a.block_out), ceil_div(s.inter, a.block_in)});
  }
  LONGCTX_CHECK(a.shared.defined() == a.shared_gate.defined(), ErrorCode::kInvalidArgument,
                "{}: shared and shared_gate come together", kExperts);
  if (a.shared.defined()) {
    check_float_activation(kExperts, "shared", a.shared);
    check_float_activation(kExperts, "shared_gate", a.shared_gate);
    check_contiguous(kExperts, "shared", a.shared);
    check_contiguous(kExperts, "shared_gate", a.shared_gate);
    check_shape(kExperts, "shared", a.shared, {s.tokens, s.hidden});
    check_shape(kExperts, "shared_gate", a.shared_gate, {s.tokens, 1});
  }
  return s;
}

void moe_route_cpu(const Tensor& logits, bool renormalize, const Tensor& topk_ids,
                   const Tensor& topk_weights) {
  check_moe_route_args(logits, topk_ids, topk_weights);
  LONGCTX_CHECK(logits.device().is_cpu(), ErrorCode::kInvalidArgument,
                "moe_route_cpu: tensors are on {}", logits.device().str());
  const int64_t t_count = logits.size(0), e = logits.size(1), k = topk_ids.size(1);
  int32_t* ids = topk_ids.data<int32_t>();
  float* weights = topk_weights.data<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    std::vector<float> buf(e);
    const float* l = matrix_row_f32(logits, t * e, e, buf.data());
    // softmax as torch computes it: exp(x - max) / sum
    const float mx = *std::max_element(l, l + e);
    std::vector<float> p(e);
    float sum = 0.0f;
    for (int64_t i = 0; i < e; ++i) sum += p[i] = std::exp(l[i] - mx);
    for (int64_t i = 0; i < e; ++i) p[i] /= sum;
    // top-k: larger probability first, the lower index among equal ones
    std::vector<int32_t> order(e);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float picked = 0.0f;
    for (int64_t j = 0; j < k; ++j) picked += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = renormalize ? p[order[j]] / picked : p[order[j]];
    }
  }
}

void moe_experts_cpu(const MoeArgs& a) {
  const MoeShape s = check_moe_args(a);
  const Device d = common_device(
      kExperts, {&a.x, &a.topk_ids, &a.topk_weights, &a.gate_up, &a.down, &a.gate_up_scales,
                 &a.down_scales, &a.shared, &a.shared_gate, &a.out});
  LONGCTX_CHECK(d.is_cpu(), ErrorCode::kInvalidArgument, "moe_experts_cpu: tensors are on {}",
                d.str());
  const int32_t* ids = a.topk_ids.data<int32_t>();
  const float* weights = a.topk_weights.data<float>();
  for (int64_t i = 0; i < s.tokens * s.top_k; ++i)
    LONGCTX_CHECK(ids[i] >= 0 && ids[i] < s.experts, ErrorCode::kInvalidArgument,
                  "{}: topk_ids[{}] = {} is not an expert of [0, {})", kExperts, i, ids[i],
                  s.experts);
  const int64_t h = s.hidden, n = s.inter;
  // FP8 experts: the block row of gate row r, of up row r (after gate's), of down row c.
  const int64_t bo = std::max<int64_t>(a.block_out, 1), bi = a.block_in;
  const int64_t up_block0 = ceil_div(n, bo);
  parallel_for(
      s.tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<float> xb(h), row(std::max(h, n)), gate(n), act(n), acc(h), sb(h);
        for (int64_t t = begin; t < end; ++t) {
          const float* x = matrix_row_f32(a.x, t * h, h, xb.data());
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < s.top_k; ++j) {
            const int64_t e = ids[t * s.top_k + j];
            const float w = weights[t * s.top_k + j];
            for (int64_t r = 0; r < n; ++r) {  // expert e's [2 inter, hidden]: gate, then up
              const float g = dot(expert_row_f32(a.gate_up, a.gate_up_scales, r / bo, bi, e, r,
                                                 2 * n, h, row.data()),
                                  x, h);
              const float u = dot(expert_row_f32(a.gate_up, a.gate_up_scales, up_block0 + r / bo,
                                                 bi, e, n + r, 2 * n, h, row.data()),
                                  x, h);
              act[r] = g / (1.0f + std::exp(-g)) * u;
            }
            for (int64_t c = 0; c < h; ++c)  // expert e's [hidden, inter]
              acc[c] +=
                  w * dot(expert_row_f32(a.down, a.down_scales, c / bo, bi, e, c, h, n, row.data()),
                          act.data(), n);
          }
          if (a.shared.defined()) {
            float g = 0.0f;
            convert_to_f32(element_ptr(a.shared_gate, t), a.shared_gate.dtype(), 1, &g);
            const float sig = 1.0f / (1.0f + std::exp(-g));
            const float* sh = matrix_row_f32(a.shared, t * h, h, sb.data());
            for (int64_t c = 0; c < h; ++c) acc[c] += sig * sh[c];
          }
          convert_from_f32(acc.data(), h, a.out.dtype(),
                           const_cast<void*>(element_ptr(a.out, t * h)));
        }
      },
      1);
}

void moe_forward_cpu(const Tensor& logits, bool renormalize, const MoeArgs& a) {
  const MoeShape s = check_moe_args(a);
  check_moe_route_args(logits, a.topk_ids, a.topk_weights);
  LONGCTX_CHECK(logits.size(0) == s.tokens && logits.size(1) == s.experts,
                ErrorCode::kInvalidArgument, "moe_forward: logits {} must be [{}, {} experts]",
                logits.str(), s.tokens, s.experts);
  moe_route_cpu(logits, renormalize, a.topk_ids, a.topk_weights);
  moe_experts_cpu(a);
}

}  // namespace longctx::ops
