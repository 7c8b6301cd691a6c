// CUDA quantized Linear: out[n, out] = x[n, in] @ W^T (+ bias), W packed as its checkpoint stores
// it (include/longctx/loader/quantization.h), fp32 accumulation.
//
// Decode (n <= 64): the GEMVs of kernels/cuda/quantized_gemv.cu, in passes of 8 rows, each pass
// reading the packed weight once (kernel and K split: kernels::quantized_gemv_schedule).
// Otherwise quantized_linear_schedule picks W8A8 for the FP8 formats on sm_90
// (quantized_linear_w8a8_cuda.cu: x quantized to E4M3, cuBLASLt's scaled FP8 GEMM), or a
// dequantizing kernel writes W to a scratch [out, in] in x's dtype (f32 math, one rounding) and
// linear_cuda (cuBLASLt, or its GEMV) runs on it.
#include <cuda_fp8.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/ceil_div.h"
#include "core/stream_limits.h"
#include "kernels/cuda/func_attributes.h"
#include "kernels/cuda/quantized_gemv.h"
#include "longctx/core/stream.h"
#include "ops/linear.h"
#include "ops/ops_device.cuh"
#include "ops/quantized_linear.h"
#include "ops/quantized_linear_w8a8.h"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

// ---------------------------------------------------------------------------------------------
// Arguments.

// x, out, bias, n, strides, dtypes and device (what the W8A8 path takes), and the weight's sizes.
struct QArgs : w8a8_detail::W8a8Args {
  int64_t in = 0, out_features = 0;
};

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

int64_t row_stride(const Tensor& t) { return t.size(0) > 1 ? t.strides()[0] : t.size(1); }

QArgs q_args(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q, const Tensor& bias,
             const Tensor& out) {
  constexpr const char* kOp = "quantized_linear";
  check_quantized_weight(kOp, w, q);
  for (auto [name, t] : {std::pair{"x", &x}, {"out", &out}}) {
    LONGCTX_CHECK(t->defined() && t->rank() == 2, ErrorCode::kInvalidArgument,
                  "{}: {} must be a matrix, got {}", kOp, name, t->defined() ? t->str() : "none");
    LONGCTX_CHECK(t->strides()[1] == 1 || t->size(1) <= 1, ErrorCode::kInvalidArgument,
                  "{}: {} {} must have a contiguous last dim", kOp, name, t->str());
    LONGCTX_CHECK(t->device().is_cuda() && t->device() == x.device(), ErrorCode::kInvalidArgument,
                  "quantized_linear_cuda: {} {} is not on x's CUDA device", name, t->str());
  }
  for (auto [name, t] : {std::pair{"qweight", &w.qweight},
                         {"scales", &w.scales},
                         {"qzeros", &w.qzeros},
                         {"bias", &bias}})
    LONGCTX_CHECK(!t->defined() || t->device() == x.device(), ErrorCode::kInvalidArgument,
                  "quantized_linear_cuda: {} {} is not on x's device {}", name, t->str(),
                  x.device().str());
  QArgs a;
  a.n = x.size(0);
  a.in = x.size(1);
  a.out_features = w.out_features;
  LONGCTX_CHECK(a.in == w.in_features, ErrorCode::kInvalidArgument,
                "{}: x {} does not match the weight's in_features {}", kOp, x.str(), w.in_features);
  LONGCTX_CHECK(out.size(0) == a.n && out.size(1) == a.out_features, ErrorCode::kInvalidArgument,
                "{}: out must have shape [{}, {}], got {}", kOp, a.n, a.out_features, out.str());
  a.x_dtype = x.dtype();
  a.out_dtype = out.dtype();
  LONGCTX_CHECK(is_float_dtype(a.x_dtype), ErrorCode::kUnsupported,
                "{} (CUDA): x {} must be bf16, f16 or f32", kOp, x.str());
  LONGCTX_CHECK(a.out_dtype == DType::kF32 || a.out_dtype == a.x_dtype, ErrorCode::kUnsupported,
                "{} (CUDA): out {} must be f32 or x's dtype {}", kOp, out.str(),
                dtype_name(a.x_dtype));
  if (bias.defined()) {
    LONGCTX_CHECK(bias.is_contiguous() && bias.rank() == 1 && bias.size(0) == a.out_features &&
                      is_float_dtype(bias.dtype()),
                  ErrorCode::kInvalidArgument,
                  "{}: bias must be a contiguous f32/bf16/f16 [{}], got {}", kOp, a.out_features,
                  bias.str());
    a.bias = bias.data_ptr();
    a.bias_dtype = bias.dtype();
  }
  a.ldx = row_stride(x);
  a.ldo = row_stride(out);
  LONGCTX_CHECK(a.ldx >= a.in && a.ldo >= a.out_features, ErrorCode::kInvalidArgument,
                "{}: row strides of x {} ({}) and out {} ({}) must be at least their widths", kOp,
                x.str(), a.ldx, out.str(), a.ldo);
  a.x = x.data_ptr();
  a.out = out.data_ptr();
  a.device = x.device();
  return a;
}

// ---------------------------------------------------------------------------------------------
// Dequantization into a dense [out, in] scratch of T (the prefill path): f32 math, one rounding.

struct DequantParams {
  const void* qweight;
  const void* scales;
  DType scale_dtype;
  const uint32_t* qzeros;
  void* dst;  // [out, in]
  int64_t in, out_features, group;
  int zero_offset;
  int64_t block_out, block_in, scale_cols;
  int scale_stride;
};

// GPTQ: thread (r, o) writes inputs 8r..8r+7 of row o (a group may end inside them).
template <typename T>
struct DequantGptq {
  DequantParams p;
  __device__ void operator()(int64_t r, int64_t o) const {
    const uint32_t v = static_cast<const uint32_t*>(p.qweight)[r * p.out_features + o];
    float d[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t grp = (r * 8 + k) / p.group;
      const int z = int((p.qzeros[grp * (p.out_features / 8) + o / 8] >> (4 * (o % 8))) & 0xf) +
                    p.zero_offset;
      const float s = load_any(p.scales, p.scale_dtype, grp * p.out_features + o);
      d[k] = float(int((v >> (4 * k)) & 0xf) - z) * s;
    }
    store<8, T>(static_cast<T*>(p.dst) + o * p.in + r * 8, d);
  }
};

// AWQ: thread (r, p) reads words [8r..8r+7, p] and writes inputs 8r..8r+7 of columns 8p..8p+7.
template <typename T>
struct DequantAwq {
  DequantParams p;
  __device__ void operator()(int64_t r, int64_t col) const {
    constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column 8p + c sits in nibble kNibble[c]
    const int64_t words = p.out_features / 8;
    float d[8][8];  // [column][input]
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t v = static_cast<const uint32_t*>(p.qweight)[(r * 8 + k) * words + col];
      const int64_t grp = (r * 8 + k) / p.group;
      const uint32_t zw = p.qzeros[grp * words + col];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int z = int((zw >> (4 * kNibble[c])) & 0xf);
        const float s = load_any(p.scales, p.scale_dtype, grp * p.out_features + col * 8 + c);
        d[c][k] = float(int((v >> (4 * kNibble[c])) & 0xf) - z) * s;
      }
    }
#pragma unroll
    for (int c = 0; c < 8; ++c)
      store<8, T>(static_cast<T*>(p.dst) + (col * 8 + c) * p.in + r * 8, d[c]);
  }
};

// FP8: thread (o, k) writes element [o, k].
template <typename T>
struct DequantFp8 {
  DequantParams p;
  bool block;
  __device__ void operator()(int64_t o, int64_t k) const {
    const uint8_t b = static_cast<const uint8_t*>(p.qweight)[o * p.in + k];
    const __half_raw raw = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3);
    const float s =
        block ? load_any(p.scales, p.scale_dtype, (o / p.block_out) * p.scale_cols + k / p.block_in)
              : load_any(p.scales, p.scale_dtype, int64_t(p.scale_stride) * o);
    static_cast<T*>(p.dst)[o * p.in + k] = from_f32<T>(__half2float(__half(raw)) * s);
  }
};

// ---------------------------------------------------------------------------------------------
// The GEMV (kernels/cuda/quantized_gemv.h).

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

kernels::QuantizedGemvFormat gemv_format(QuantMethod m) {
  switch (m) {
    case QuantMethod::kGptq:
      return kernels::QuantizedGemvFormat::kGptq;
    case QuantMethod::kAwq:
      return kernels::QuantizedGemvFormat::kAwq;
    case QuantMethod::kFp8Block:
      return kernels::QuantizedGemvFormat::kFp8Block;
    default:
      return kernels::QuantizedGemvFormat::kFp8Channel;
  }
}

kernels::QuantizedGemvProblem gemv_problem(const QArgs& a, const QuantizedWeight& w,
                                           const QuantConfig& q, const QuantizedGemvOptions& opt) {
  kernels::QuantizedGemvProblem p;
  p.format = gemv_format(w.method);
  p.n = std::min(a.n, kQuantizedGemvPassRows);
  p.in = a.in;
  p.out = a.out_features;
  p.group = q.group_of(a.in);
  p.block_out = std::max<int64_t>(q.block_out, 1);
  p.block_in = std::max<int64_t>(q.block_in, 1);
  p.x_dtype = a.x_dtype;
  p.x_aligned16 =
      aligned16(a.x) && (a.n <= 1 || (a.ldx * int64_t(dtype_size(a.x_dtype))) % 16 == 0);
  p.qweight_aligned16 = aligned16(w.qweight.data_ptr());
  p.scale_dtype = w.scales.dtype();
  p.params_aligned =
      aligned16(w.scales.data_ptr()) &&
      (!w.qzeros.defined() || reinterpret_cast<uintptr_t>(w.qzeros.data_ptr()) % 8 == 0);
  p.sm_count = kernels::cuda::device_props(a.device.index).sm_count;
  p.kernel = opt.kernel;
  p.ctas_per_sm = opt.ctas_per_sm;
  p.splits = opt.splits;
  p.reduce = opt.reduce;
  p.prefetch = opt.prefetch;
  return p;
}

// The schedule, with the op's own refusal of n past kQuantizedGemvMaxRows.
kernels::QuantizedGemvSchedule plan_gemv(const QArgs& a, const kernels::QuantizedGemvProblem& p) {
  kernels::QuantizedGemvSchedule s;
  if (a.n < 1 || a.n > kQuantizedGemvMaxRows) {
    s.refusal = LONGCTX_FORMAT("n = {} outside [1, {}]", a.n, kQuantizedGemvMaxRows);
    return s;
  }
  return kernels::quantized_gemv_schedule(p);
}

kernels::QuantizedGemvParams gemv_params(const QArgs& a, const QuantizedWeight& w,
                                         const QuantConfig& q, void* partial) {
  kernels::QuantizedGemvParams p;
  p.format = gemv_format(w.method);
  p.x = a.x;
  p.ldx = a.ldx;
  p.x_dtype = a.x_dtype;
  p.n = int(a.n);
  p.qweight = w.qweight.data_ptr();
  p.scales = w.scales.data_ptr();
  p.scale_dtype = w.scales.dtype();
  p.qzeros = w.qzeros.defined() ? static_cast<const uint32_t*>(w.qzeros.data_ptr()) : nullptr;
  p.bias = a.bias;
  p.bias_dtype = a.bias_dtype;
  p.out = a.out;
  p.ldo = a.ldo;
  p.out_dtype = a.out_dtype;
  p.partial = static_cast<float*>(partial);
  p.in = a.in;
  p.out_features = a.out_features;
  p.group = q.group_of(a.in);
  p.zero_offset = w.method == QuantMethod::kGptq && q.gptq_zero_minus_one ? 1 : 0;
  p.block_out = std::max<int64_t>(q.block_out, 1);
  p.block_in = std::max<int64_t>(q.block_in, 1);
  p.scale_cols = ceil_div(a.in, p.block_in);
  p.scale_stride = q.fp8_strategy == Fp8ScaleStrategy::kChannel ? 1 : 0;
  return p;
}

void launch_dequant(const QArgs& a, const QuantizedWeight& w, const QuantConfig& q, void* dst,
                    cudaStream_t stream) {
  DequantParams d{};
  d.qweight = w.qweight.data_ptr();
  d.scales = w.scales.data_ptr();
  d.scale_dtype = w.scales.dtype();
  d.qzeros = w.qzeros.defined() ? static_cast<const uint32_t*>(w.qzeros.data_ptr()) : nullptr;
  d.dst = dst;
  d.in = a.in;
  d.out_features = a.out_features;
  d.group = q.group_of(a.in);
  d.zero_offset = w.method == QuantMethod::kGptq && q.gptq_zero_minus_one ? 1 : 0;
  d.block_out = std::max<int64_t>(q.block_out, 1);
  d.block_in = std::max<int64_t>(q.block_in, 1);
  d.scale_cols = ceil_div(a.in, d.block_in);
  d.scale_stride = q.fp8_strategy == Fp8ScaleStrategy::kChannel ? 1 : 0;
  visit_float(a.x_dtype, "quantized_linear", [&](auto xt) {
    using T = decltype(xt);
    switch (w.method) {
      case QuantMethod::kGptq:
        return launch_rows(DequantGptq<T>{d}, a.in / 8, a.out_features, stream);
      case QuantMethod::kAwq:
        return launch_rows(DequantAwq<T>{d}, a.in / 8, a.out_features / 8, stream);
      default:
        return launch_rows(DequantFp8<T>{d, w.method == QuantMethod::kFp8Block}, a.out_features,
                           a.in, stream);
    }
  });
}

// The op's own workspace per (device, stream), for callers that pass none.
Tensor& own_workspace(Device device, cudaStream_t stream) {
  static std::mutex mu;
  static std::unordered_map<cudaStream_t, Tensor>* buffers[kMaxCudaDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  auto*& m = buffers[device.index];
  if (!m) m = new std::unordered_map<cudaStream_t, Tensor>();  // never destroyed (see linear)
  return (*m)[stream];
}

void* workspace_ptr(const Tensor& given, int64_t bytes, Device device, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  if (given.defined()) {
    LONGCTX_CHECK(
        given.device() == device && given.is_contiguous() && int64_t(given.nbytes()) >= bytes,
        ErrorCode::kInvalidArgument,
        "quantized_linear: workspace {} is too small or elsewhere: {} bytes on {} needed",
        given.str(), bytes, device.str());
    return given.data_ptr();
  }
  Tensor& ws = own_workspace(device, stream);
  if (!ws.defined() || int64_t(ws.nbytes()) < bytes) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    LONGCTX_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    LONGCTX_CHECK(status == cudaStreamCaptureStatusNone, ErrorCode::kInvalidArgument,
                  "quantized_linear: {} bytes of workspace needed while capturing a CUDA graph: "
                  "pass a workspace (quantized_linear_workspace_bytes) or warm the shape up first",
                  bytes);
    // The old buffer may still be read by queued kernels of this stream.
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
    ws = Tensor::empty({bytes}, DType::kU8, device);
  }
  return ws.data_ptr();
}

// The GEMVs' tile counters per (device, stream) (kLastCta): zero between GEMVs, since the CTA
// that reduces a tile resets its counter, so one buffer serves every GEMV of the stream (they run
// in stream order). Allocated zeroed on the first split GEMV, outside graph capture (the engine's
// warm-up forward runs before it captures).
uint32_t* tile_counters(Device device, cudaStream_t stream) {
  static std::mutex mu;
  static std::unordered_map<cudaStream_t, Tensor>* buffers[kMaxCudaDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  auto*& m = buffers[device.index];
  if (!m) m = new std::unordered_map<cudaStream_t, Tensor>();  // never destroyed (see linear)
  Tensor& t = (*m)[stream];
  if (!t.defined()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    LONGCTX_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    LONGCTX_CHECK(status == cudaStreamCaptureStatusNone, ErrorCode::kInvalidArgument,
                  "quantized_linear: the GEMV's tile counters are allocated while capturing a "
                  "CUDA graph: run a split GEMV on this stream once before capturing");
    t = Tensor::empty({kernels::kQuantizedGemvMaxTileCounters}, DType::kI32, device);
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream));
  }
  return static_cast<uint32_t*>(t.data_ptr());
}

// The path (quantized_linear_schedule) and, for W8A8, the rows per chunk; cuBLASLt's refusal of
// the W8A8 GEMMs sends kAuto to the dequantizing path and is an error for a requested kW8a8.
struct Route {
  QuantizedLinearPath path = QuantizedLinearPath::kDequantGemm;
  kernels::QuantizedGemvProblem gemv_problem;
  kernels::QuantizedGemvSchedule gemv;
  int64_t chunk_rows = 0;
  std::string w8a8_refusal;
};

Route route(const QArgs& a, const QuantizedWeight& w, const QuantConfig& q,
            QuantizedLinearPath path, const QuantizedGemvOptions& opt, const Tensor& workspace) {
  Route r;
  r.gemv_problem = gemv_problem(a, w, q, opt);
  r.gemv = plan_gemv(a, r.gemv_problem);
  QuantizedLinearProblem p;
  p.n = a.n;
  p.x_dtype = a.x_dtype;
  p.out_dtype = a.out_dtype;
  const auto& props = kernels::cuda::device_props(a.device.index);
  p.sm = props.major * 10 + props.minor;
  p.requested = path;
  p.gemv_refusal = r.gemv.refusal;
  p.out_aligned16 =
      aligned16(a.out) && (a.n <= 1 || (a.ldo * int64_t(dtype_size(a.out_dtype))) % 16 == 0);
  const QuantizedLinearSchedule s = quantized_linear_schedule(p, w, q);
  r.path = s.path;
  r.w8a8_refusal = s.w8a8_refusal;
  if (r.path != QuantizedLinearPath::kW8a8) return r;
  r.chunk_rows = w8a8_chunk_rows(a.n, w, workspace.defined() ? int64_t(workspace.nbytes()) : 0);
  r.w8a8_refusal = w8a8_detail::w8a8_gemm_refusal(a, w, q, r.chunk_rows);
  if (!r.w8a8_refusal.empty()) {
    LONGCTX_CHECK(path != QuantizedLinearPath::kW8a8, ErrorCode::kUnsupported,
                  "quantized_linear: W8A8 cannot run n = {}, [{}, {}]: {}", a.n, a.out_features,
                  a.in, r.w8a8_refusal);
    r.path = QuantizedLinearPath::kDequantGemm;
  }
  return r;
}

}  // namespace

void quantized_linear_cuda(const Tensor& x, const QuantizedWeight& w, const QuantConfig& q,
                           const Tensor& bias, const Tensor& out, const Tensor& workspace,
                           QuantizedLinearPath path, const QuantizedGemvOptions& gemv) {
  const QArgs a = q_args(x, w, q, bias, out);
  DeviceGuard guard(a.device.index);
  cudaStream_t stream = op_stream(a.device, "quantized_linear");
  if (a.n == 0) return;
  const Route r = route(a, w, q, path, gemv, workspace);
  const kernels::QuantizedGemvSchedule& pl = r.gemv;
  if (r.path == QuantizedLinearPath::kW8a8) {
    const int64_t bytes = w8a8_layout(r.chunk_rows, w).bytes;
    void* ws = workspace_ptr(workspace, bytes, a.device, stream);
    w8a8_detail::run_w8a8(a, w, q, r.chunk_rows, ws, stream);
    return;
  }
  if (r.path == QuantizedLinearPath::kGemv) {
    void* partial = workspace_ptr(workspace, pl.partial_bytes, a.device, stream);
    uint32_t* counters = pl.splits > 1 && pl.reduce == kernels::QuantizedGemvReduce::kLastCta
                             ? tile_counters(a.device, stream)
                             : nullptr;
    // Passes of up to 8 rows, in stream order (a pass's reduction reads the partials before the
    // next pass writes them).
    for (int64_t r0 = 0; r0 < a.n; r0 += kQuantizedGemvPassRows) {
      QArgs pass = a;
      pass.n = std::min(kQuantizedGemvPassRows, a.n - r0);
      pass.x = static_cast<const char*>(a.x) + r0 * a.ldx * int64_t(dtype_size(a.x_dtype));
      pass.out = static_cast<char*>(a.out) + r0 * a.ldo * int64_t(dtype_size(a.out_dtype));
      kernels::QuantizedGemvParams p = gemv_params(pass, w, q, partial);
      p.tile_counters = counters;
      kernels::cuda::quantized_gemv_run(p, pl, stream);
    }
    return;
  }
  const int64_t bytes = a.out_features * a.in * int64_t(dtype_size(a.x_dtype));
  void* scratch = workspace_ptr(workspace, bytes, a.device, stream);
  launch_dequant(a, w, q, scratch, stream);
  const Tensor dense = Tensor::from_blob(scratch, {a.out_features, a.in}, a.x_dtype, a.device);
  linear_cuda(x, dense, bias, out);
}

std::string quantized_linear_cuda_plan(const Tensor& x, const QuantizedWeight& w,
                                       const QuantConfig& q, const Tensor& bias, const Tensor& out,
                                       QuantizedLinearPath path, const QuantizedGemvOptions& gemv) {
  const QArgs a = q_args(x, w, q, bias, out);
  DeviceGuard guard(a.device.index);
  if (a.n == 0) return "nothing (n = 0)";
  const Route r = route(a, w, q, path, gemv, Tensor());
  if (r.path == QuantizedLinearPath::kW8a8) return w8a8_detail::w8a8_plan(a, w, q, r.chunk_rows);
  if (r.path == QuantizedLinearPath::kGemv)
    return kernels::quantized_gemv_name(r.gemv_problem, r.gemv);
  // The dense plan's operands only need their addresses' alignment: a scratch is 256-aligned.
  const Tensor dense =
      Tensor::from_blob(w.qweight.data_ptr(), {a.out_features, a.in}, a.x_dtype, a.device);
  return "dequant + " + linear_cuda_plan(x, dense, bias, out) + " (w8a8: " + r.w8a8_refusal + ")";
}

}  // namespace longctx::ops
