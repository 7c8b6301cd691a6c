// W8A8 for the FP8 formats on sm_90: x quantized to E4M3 per token (and 128-input group), then
// cuBLASLt's scaled FP8 GEMM on the packed weight, fp32 accumulation.
//
// cuBLASLt is column-major (see linear_cuda.cu): out [n, out] row-major is D = [out, n] = op(A) B
// with A = the weight [out, in] read as column-major [in, out] with transa = T, B = the codes
// [n, in] read as [in, n]: the "TN" layout, the only one FP8 has on Hopper. Scales (cuBLAS docs,
// "128-element 1D and 128x128 2D block scaling" and "Outer vector scaling"):
//   - block format: A BLK128x128_32F, K-major, shape L4 x ceil(out/128) (L = ceil(in/128) rounded
//     up to 4 in the stride): the checkpoint's weight_scale_inv [ceil(out/128), L] row-major as it
//     is when L % 4 == 0 and it is f32; B VEC128_32F, N-major [L, n]: what the quantizer writes;
//   - channel / tensor scales: OUTER_VEC_32F on both, A [out] (a tensor scale broadcast), B [n].
// N (the rows of a GEMM) must be a multiple of 4: the last 1-3 rows run as a GEMM of 4 (zero
// rows after them) into a scratch in out's dtype (the main GEMMs' D type: nothing more is asked
// of cuBLASLt) and are copied out. Scales that cuBLASLt cannot read as
// stored (bf16 / f16, an unpadded block row, a tensor scale) are converted into the workspace each
// call (a few KiB). Fast accumulation stays off (cuBLASLt refuses it with block scales, and the
// CPU twin sums in fp32). The bias is added by a separate kernel.
#include <cublasLt.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/ceil_div.h"
#include "core/stream_limits.h"
#include "kernels/cuda/fp8_act_quant.h"
#include "kernels/fp8_act_quant.h"
#include "ops/cublaslt_context.h"
#include "ops/ops_device.cuh"
#include "ops/quantized_linear.h"
#include "ops/quantized_linear_w8a8.h"

namespace longctx::ops::w8a8_detail {

namespace {

using namespace cuda_detail;

using cublaslt::alignment;
using cublaslt::cuda_type;
using cublaslt::Plan;
using cublaslt::set_desc;

struct Key {
  int64_t n, in, out, ldo;
  DType o;
  bool block;
  uint32_t align_w, align_o;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    cublaslt::Fnv f;
    for (int64_t v : {k.n, k.in, k.out, k.ldo}) f.mix(uint64_t(v));
    f.mix(uint64_t(k.o) | uint64_t(k.block) << 8 | uint64_t(k.align_w) << 16 |
          uint64_t(k.align_o) << 40);
    return f.h;
  }
};

using Context = cublaslt::Context<Key, KeyHash>;

Context& context(int device) { return cublaslt::context<Key, KeyHash>(device, "quantized_linear"); }

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const Key& k, const void* a_scale,
                                const void* b_scale) {
  auto plan = std::make_unique<Plan>();
  LONGCTX_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
  const int32_t a_mode = k.block ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                 : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const int32_t b_mode = k.block ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                 : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
  LONGCTX_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, uint64_t(k.in), uint64_t(k.out), k.in));
  LONGCTX_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, uint64_t(k.in), uint64_t(k.n), k.in));
  LONGCTX_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&plan->c, cuda_type(k.o), uint64_t(k.out), uint64_t(k.n), k.ldo));
  int found = 0;
  const cublasStatus_t st =
      cublaslt::pick_algo(handle, *plan, {k.align_w, uint32_t(256), k.align_o}, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
      (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
    plan->refusal = LONGCTX_FORMAT(
        "cuBLASLt has no FP8 {} kernel for n = {}, [{}, {}] (out row stride {}, alignments "
        "weight {} B, out {} B): {}",
        k.block ? "block-scaled" : "vector-scaled", k.n, k.out, k.in, k.ldo, k.align_w, k.align_o,
        found == 0 && st == CUBLAS_STATUS_SUCCESS ? "no algorithm" : cublasLtGetStatusString(st));
    return plan;
  }
  LONGCTX_CUBLASLT_CHECK(st);
  return plan;
}

// The cached plan of a GEMM of n rows into D (ld ldo, dtype o); ctx.mu held.
const Plan& plan_for(Context& ctx, const QuantizedWeight& w, bool block, int64_t n, DType o,
                     int64_t ldo, const void* d, const void* a_scale, const void* b_scale) {
  const Key key{
      n,           w.in_features, w.out_features, ldo, o, block, alignment(w.qweight.data_ptr()),
      alignment(d)};
  return ctx.plan(key, [&] { return make_plan(ctx.handle, key, a_scale, b_scale); });
}

// ---------------------------------------------------------------------------------------------
// Small kernels: the weight scales as cuBLASLt reads them, the tail rows out, the bias.

// Block format: dst [ceil(out/128), l4] f32 (columns past the checkpoint's zero); otherwise dst
// [out] f32 (stride 0: a tensor scale broadcast).
struct PrepWeightScales {
  const void* src;
  DType dtype;
  int64_t src_cols, dst_cols, stride;  // stride: src elements per dst element (channel 1, tensor 0)
  bool block;
  float* dst;
  __device__ void operator()(int64_t r, int64_t c) const {
    if (block)
      dst[r * dst_cols + c] = c < src_cols ? load_any(src, dtype, r * src_cols + c) : 0.f;
    else
      dst[c] = load_any(src, dtype, c * stride);
  }
};

// out[row0 + j, o] = tail[j, o] (+ bias[o]), j < rows.
template <typename TO>
struct CopyTail {
  const TO* tail;  // [4, out]
  int64_t out_features;
  const void* bias;
  DType bias_dtype;
  TO* out;
  int64_t ldo;
  __device__ void operator()(int64_t j, int64_t o) const {
    const float b = bias ? load_any(bias, bias_dtype, o) : 0.f;
    out[j * ldo + o] = from_f32<TO>(to_f32(tail[j * out_features + o]) + b);
  }
};

template <typename TO>
struct AddBias {
  TO* out;
  int64_t ldo;
  const void* bias;
  DType bias_dtype;
  __device__ void operator()(int64_t j, int64_t o) const {
    TO* p = out + j * ldo + o;
    *p = from_f32<TO>(to_f32(*p) + load_any(bias, bias_dtype, o));
  }
};

// The weight's scales for cuBLASLt: the checkpoint's tensor when it is readable as it is, else a
// converted copy in `spare` (launched on `stream`).
const float* weight_scales(const QuantizedWeight& w, const QuantConfig& q, float* spare,
                           cudaStream_t stream) {
  const bool block = w.method == QuantMethod::kFp8Block;
  const Tensor& s = w.scales;
  const bool f32 = s.dtype() == DType::kF32 && alignment(s.data_ptr()) >= 16;
  const int64_t cols = ceil_div(w.in_features, kernels::kFp8ActGroup);
  const int64_t l4 = ceil_div(cols, 4) * 4;
  if (block) {
    if (f32 && cols == l4) return static_cast<const float*>(s.data_ptr());
    const int64_t rows = ceil_div(w.out_features, kernels::kFp8ActGroup);
    launch_rows(PrepWeightScales{s.data_ptr(), s.dtype(), cols, l4, 1, true, spare}, rows, l4,
                stream);
    return spare;
  }
  const bool channel = q.fp8_strategy == Fp8ScaleStrategy::kChannel;
  if (f32 && channel) return static_cast<const float*>(s.data_ptr());
  launch_rows(PrepWeightScales{s.data_ptr(), s.dtype(), 0, 0, channel ? 1 : 0, false, spare}, 1,
              w.out_features, stream);
  return spare;
}

// One GEMM: D [n, out] (row stride ldo, dtype o) = W8A8 of the quantized rows.
void gemm(Context& ctx, const QuantizedWeight& w, bool block, int64_t n, const void* codes,
          const float* a_scale, const float* b_scale, void* d, DType o, int64_t ldo,
          void* lt_workspace, cudaStream_t stream) {
  const Plan& plan = plan_for(ctx, w, block, n, o, ldo, d, a_scale, b_scale);
  LONGCTX_CHECK(plan.refusal.empty(), ErrorCode::kUnsupported, "quantized_linear: {}",
                plan.refusal);
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(a_scale));
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(b_scale));
  const float alpha = 1.f, beta = 0.f;
  LONGCTX_CUBLASLT_CHECK(cublasLtMatmul(ctx.handle, plan.desc, &alpha, w.qweight.data_ptr(), plan.a,
                                        codes, plan.b, &beta, d, plan.c, d, plan.c, &plan.algo,
                                        lt_workspace, cublaslt::kWorkspaceBytes, stream));
}

struct Chunking {
  int64_t full =
      0;  // rows run by GEMMs of chunk_rows (the last one maybe shorter, a multiple of 4)
  int64_t tail = 0;  // the last 0-3 rows
};

Chunking chunking(int64_t n) {
  Chunking c;
  c.tail = n % kW8a8RowMultiple;
  c.full = n - c.tail;
  return c;
}

}  // namespace

std::string w8a8_gemm_refusal(const W8a8Args& a, const QuantizedWeight& w, const QuantConfig& q,
                              int64_t chunk_rows) {
  (void)q;
  if (chunk_rows < kW8a8RowMultiple)
    return LONGCTX_FORMAT("the workspace holds {} rows (at least {} needed)", chunk_rows,
                          kW8a8RowMultiple);
  Context& ctx = context(a.device.index);
  std::lock_guard<std::mutex> lock(ctx.mu);
  const bool block = w.method == QuantMethod::kFp8Block;
  const Chunking c = chunking(a.n);
  // The heuristic reads the scale pointers' alignment only (the run's are 16-byte aligned, as
  // out's rows are).
  const void* scale = a.out;
  // The first chunk and the last (shorter) one; the chunks between differ from the first only in
  // their rows' address alignment.
  for (int64_t r0 :
       {int64_t(0), c.full > chunk_rows ? (c.full - 1) / chunk_rows * chunk_rows : int64_t(0)}) {
    if (r0 >= c.full) continue;
    const int64_t rows = std::min(chunk_rows, c.full - r0);
    void* d = static_cast<char*>(a.out) + r0 * a.ldo * int64_t(dtype_size(a.out_dtype));
    const Plan& p = plan_for(ctx, w, block, rows, a.out_dtype, a.ldo, d, scale, scale);
    if (!p.refusal.empty()) return p.refusal;
  }
  if (c.tail > 0) {
    // The tail's D is the workspace's [4, out] scratch in out's dtype, 256-aligned.
    const void* tail_d = reinterpret_cast<const void*>(uintptr_t(256));
    const Plan& p = plan_for(ctx, w, block, kW8a8RowMultiple, a.out_dtype, w.out_features, tail_d,
                             scale, scale);
    if (!p.refusal.empty()) return p.refusal;
  }
  return "";
}

void run_w8a8(const W8a8Args& a, const QuantizedWeight& w, const QuantConfig& q, int64_t chunk_rows,
              void* workspace, cudaStream_t stream) {
  const bool block = w.method == QuantMethod::kFp8Block;
  const int64_t in = w.in_features, out = w.out_features;
  const W8a8Layout lay = w8a8_layout(chunk_rows, w);
  char* ws = static_cast<char*>(workspace);
  uint8_t* codes = reinterpret_cast<uint8_t*>(ws + lay.codes);
  float* act_scales = reinterpret_cast<float*>(ws + lay.act_scales);
  void* tail_out = ws + lay.tail_out;
  const float* w_scales =
      weight_scales(w, q, reinterpret_cast<float*>(ws + lay.weight_scales), stream);
  const size_t xes = dtype_size(a.x_dtype), oes = dtype_size(a.out_dtype);
  Context& ctx = context(a.device.index);
  std::lock_guard<std::mutex> lock(ctx.mu);
  void* lt_ws = ctx.workspace(stream, a.device);
  kernels::cuda::Fp8ActQuantParams qp;
  qp.x_dtype = a.x_dtype;
  qp.in = in;
  qp.ldx = a.ldx;
  qp.group = block ? kernels::kFp8ActGroup : in;
  qp.codes = codes;
  qp.scales = act_scales;
  const Chunking c = chunking(a.n);
  auto quantize = [&](int64_t r0, int64_t rows, int64_t padded) {
    qp.x = static_cast<const char*>(a.x) + r0 * a.ldx * int64_t(xes);
    qp.rows = rows;
    qp.padded_rows = padded;
    qp.scale_ld = padded;
    kernels::cuda::fp8_act_quant_run(qp, stream);
  };
  for (int64_t r0 = 0; r0 < c.full; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, c.full - r0);
    quantize(r0, rows, rows);
    void* d = static_cast<char*>(a.out) + r0 * a.ldo * int64_t(oes);
    gemm(ctx, w, block, rows, codes, w_scales, act_scales, d, a.out_dtype, a.ldo, lt_ws, stream);
    if (a.bias)
      visit_float(a.out_dtype, "quantized_linear", [&](auto to) {
        using TO = decltype(to);
        launch_rows(AddBias<TO>{static_cast<TO*>(d), a.ldo, a.bias, a.bias_dtype}, rows, out,
                    stream);
      });
  }
  if (c.tail > 0) {
    quantize(c.full, c.tail, kW8a8RowMultiple);
    gemm(ctx, w, block, kW8a8RowMultiple, codes, w_scales, act_scales, tail_out, a.out_dtype, out,
         lt_ws, stream);
    void* d = static_cast<char*>(a.out) + c.full * a.ldo * int64_t(oes);
    visit_float(a.out_dtype, "quantized_linear", [&](auto to) {
      using TO = decltype(to);
      launch_rows(CopyTail<TO>{static_cast<const TO*>(tail_out), out, a.bias, a.bias_dtype,
                               static_cast<TO*>(d), a.ldo},
                  c.tail, out, stream);
    });
  }
}

std::string w8a8_plan(const W8a8Args& a, const QuantizedWeight& w, const QuantConfig& q,
                      int64_t chunk_rows) {
  const bool block = w.method == QuantMethod::kFp8Block;
  std::string s = LONGCTX_FORMAT(
      "w8a8 {} chunk {} rows{}", block ? "weight blk128x128 x vec128" : "outer-vector", chunk_rows,
      a.n % kW8a8RowMultiple ? LONGCTX_FORMAT(" + tail {}", a.n % kW8a8RowMultiple) : "");
  (void)q;
  Context& ctx = context(a.device.index);
  std::lock_guard<std::mutex> lock(ctx.mu);
  const int64_t rows = std::min(chunk_rows, a.n - a.n % kW8a8RowMultiple);
  if (rows <= 0) return s;
  const Plan& plan = plan_for(ctx, w, block, rows, a.out_dtype, a.ldo, a.out, a.out, a.out);
  if (!plan.refusal.empty()) return s + ": " + plan.refusal;
  return s + ": " + cublaslt::describe_algo(plan);
}

}  // namespace longctx::ops::w8a8_detail
