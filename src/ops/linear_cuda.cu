// CUDA linear: out[n, out] = x[n, in] @ W[out, in]^T (+ bias), fp32 accumulation.
//
// cuBLASLt is column-major. A row-major [r, c] matrix with row stride ld is the column-major
// [c, r] matrix with leading dimension ld, so out (row-major [n, out], ld ldo) is the
// column-major D = [out, n] = W x^T = op(A) * B with A = W read as column-major [in, out]
// (ld ldw) and transa = T, B = x read as column-major [in, n] (ld ldx) and transb = N: the
// "TN" layout cuBLASLt's tensor-core kernels prefer. The bias runs over D's rows (the out
// features): CUBLASLT_EPILOGUE_BIAS.
//
// Handle, workspaces and the plan cache: ops/cublaslt_context.h; a plan's key is the problem
// (sizes, strides, dtypes, operand alignments, epilogue).
//
// Decode (n <= kGemvAutoRows, i.e. 1) uses gemv_kernel instead: each warp streams one weight
// row once with 16-byte loads (kGemvLoads in flight per lane) and dots it with the n x rows,
// which stay in L1.
#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/stream_limits.h"
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/stream.h"
#include "ops/cublaslt_context.h"
#include "ops/linear.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

using cublaslt::alignment;
using cublaslt::cuda_type;
using cublaslt::Plan;
using cublaslt::set_desc;
// kAuto picks the GEMV up to this n. Measured on an H200 (Llama-3.1-8B shapes, weights
// streamed from HBM): at n = 1 the GEMV reads 2.8-4.3 TB/s against cuBLASLt's 2.3-4.2 (ahead
// on 4 of 5 shapes); at n = 4 cuBLASLt is ahead on every shape (3.0-4.2 against 1.9-3.1).
constexpr int64_t kGemvAutoRows = 1;
constexpr int64_t kGemvMaxRows = 8;  // the GEMV kernel's limit
constexpr int kGemvWarps = 8;
// 16-byte weight loads in flight per lane. Llama-3.1-8B shapes on an H200, each pair in one
// call: 8 against 4 is +1-4 % on every projection (o_proj 2594 -> 2654 GB/s, qkv 3036 -> 3151,
// lm_head 4289 -> 4366); 16 against 8 is 2-5 % slower on every one.
constexpr int kGemvLoads = 8;

// ---------------------------------------------------------------------------------------------
// Arguments.

struct LinearArgs {
  const void* x = nullptr;     // [n, in], row stride ldx
  const void* w = nullptr;     // [out, in], row stride ldw
  const void* bias = nullptr;  // [out] or nullptr
  void* out = nullptr;         // [n, out], row stride ldo
  int64_t n = 0, in = 0, out_features = 0, ldx = 0, ldw = 0, ldo = 0;
  DType x_dtype = DType::kBF16, w_dtype = DType::kBF16, out_dtype = DType::kBF16;
  DType bias_dtype = DType::kF32;
  Device device;
};

std::string describe(const LinearArgs& a) {
  return LONGCTX_FORMAT(
      "x [{}, {}] {} (row stride {}) @ weight [{}, {}] {}^T -> out {} (row "
      "stride {})",
      a.n, a.in, dtype_name(a.x_dtype), a.ldx, a.out_features, a.in, dtype_name(a.w_dtype),
      dtype_name(a.out_dtype), a.ldo);
}

// Row stride of a rank-2 operand: strides()[0], or the width when there is a single row (a
// size-1 dim may carry any stride).
int64_t row_stride(const Tensor& t) { return t.size(0) > 1 ? t.strides()[0] : t.size(1); }

LinearArgs linear_args(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Tensor& out) {
  for (auto [name, t] : {std::pair{"x", &x}, {"weight", &weight}, {"out", &out}}) {
    LONGCTX_CHECK(t->defined(), ErrorCode::kInvalidArgument, "linear: {} is undefined", name);
    LONGCTX_CHECK(t->rank() == 2, ErrorCode::kInvalidArgument,
                  "linear: {} must have rank 2, got {}", name, t->str());
    LONGCTX_CHECK(t->strides()[1] == 1 || t->size(1) <= 1, ErrorCode::kInvalidArgument,
                  "linear: {} {} must have a contiguous last dim", name, t->str());
    LONGCTX_CHECK(t->device().is_cuda() && t->device() == x.device(), ErrorCode::kInvalidArgument,
                  "linear_cuda: {} {} is not on x's CUDA device", name, t->str());
  }
  LONGCTX_CHECK(weight.is_contiguous(), ErrorCode::kInvalidArgument,
                "linear: weight {} must be contiguous", weight.str());
  LinearArgs a;
  a.n = x.size(0);
  a.in = x.size(1);
  a.out_features = weight.size(0);
  LONGCTX_CHECK(weight.size(1) == a.in, ErrorCode::kInvalidArgument,
                "linear: x {} does not match weight {} (in_features {})", x.str(), weight.str(),
                weight.size(1));
  LONGCTX_CHECK(out.size(0) == a.n && out.size(1) == a.out_features, ErrorCode::kInvalidArgument,
                "linear: out must have shape [{}, {}], got {}", a.n, a.out_features, out.str());
  a.x_dtype = x.dtype();
  a.w_dtype = weight.dtype();
  a.out_dtype = out.dtype();
  const bool pair_ok = (a.x_dtype == DType::kBF16 && a.w_dtype == DType::kBF16) ||
                       (a.x_dtype == DType::kF16 && a.w_dtype == DType::kF16) ||
                       (a.x_dtype == DType::kF32 && a.w_dtype == DType::kF32);
  LONGCTX_CHECK(pair_ok, ErrorCode::kUnsupported,
                "linear (CUDA): x {} and weight {} must both be bf16, f16 or f32", x.str(),
                weight.str());
  LONGCTX_CHECK(a.out_dtype == DType::kF32 || a.out_dtype == a.x_dtype, ErrorCode::kUnsupported,
                "linear (CUDA): out {} must be f32 or x's dtype {}", out.str(),
                dtype_name(a.x_dtype));
  if (bias.defined()) {
    LONGCTX_CHECK(bias.is_contiguous() && bias.rank() == 1 && bias.size(0) == a.out_features,
                  ErrorCode::kInvalidArgument, "linear: bias must be a contiguous [{}], got {}",
                  a.out_features, bias.str());
    const DType bt = bias.dtype();
    LONGCTX_CHECK(bt == DType::kF32 || bt == DType::kBF16 || bt == DType::kF16,
                  ErrorCode::kInvalidArgument, "linear: bias must be f32, bf16 or f16, got {}",
                  bias.str());
    LONGCTX_CHECK(bias.device() == x.device(), ErrorCode::kInvalidArgument,
                  "linear: bias {} is not on x's device", bias.str());
    a.bias = bias.data_ptr();
    a.bias_dtype = bias.dtype();
  }
  a.ldx = row_stride(x);
  a.ldo = row_stride(out);
  a.ldw = a.in;
  LONGCTX_CHECK(a.ldx >= a.in && a.ldo >= a.out_features, ErrorCode::kInvalidArgument,
                "linear: row strides of x {} ({}) and out {} ({}) must be at least their widths",
                x.str(), a.ldx, out.str(), a.ldo);
  a.x = x.data_ptr();
  a.w = weight.data_ptr();
  a.out = out.data_ptr();
  a.device = x.device();
  return a;
}

// ---------------------------------------------------------------------------------------------
// Bias add for the dtype pairs the epilogue does not take: out[r, c] += bias[c] in fp32.

template <typename TO>
struct BiasAddRow {
  void* out;
  int64_t ldo;
  const void* bias;
  DType bias_dtype;
  __device__ void operator()(int64_t r, int64_t c) const {
    TO* o = static_cast<TO*>(out) + r * ldo + c;
    *o = from_f32<TO>(to_f32(*o) + load_any(bias, bias_dtype, c));
  }
};

void launch_bias_add(const LinearArgs& a, cudaStream_t stream) {
  visit_float(a.out_dtype, "linear", [&](auto to) {
    using TO = decltype(to);
    launch_rows(BiasAddRow<TO>{a.out, a.ldo, a.bias, a.bias_dtype}, a.n, a.out_features, stream);
  });
}

// ---------------------------------------------------------------------------------------------
// GEMV for decode: out[j, o] = sum_k x[j, k] w[o, k] (+ bias[o]), j < N.

struct GemvParams {
  const void* x;  // [N, in], row stride ldx (16-byte aligned rows)
  int64_t ldx;
  const void* w;  // [out, in], row stride ldw (16-byte aligned rows)
  int64_t ldw;
  const void* bias;  // [out] or nullptr
  DType bias_dtype;
  void* out;  // [N, out], row stride ldo
  int64_t ldo;
  int64_t in, out_features;
};

template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = unpack2<T>(wv[i]), b = unpack2<T>(xv[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

template <int N, typename T, typename TO>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvParams p) {
  constexpr int U = kGemvLoads;
  const int lane = threadIdx.x & 31;
  const int64_t o = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (o >= p.out_features) return;
  const uint4* w = reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + o * p.ldw);
  const T* x = static_cast<const T*>(p.x);
  const int64_t chunks = p.in / 8;
  float acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.f;
  int64_t c = lane;
  // x comes from the kernel before (a norm, the attention), launched as its dependent: wait for
  // it. Prefetching the first weight bytes into L2 before this wait measured 3-10 % slower per
  // token (docs/benchmarks.md), so nothing is read before it.
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  // U 16-byte weight loads in flight per lane before they are used (streaming: evict first).
  for (; c + (U - 1) * 32 < chunks; c += U * 32) {
    uint4 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) wv[u] = __ldcs(w + c + u * 32);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < N; ++j)
        acc[j] = dot8<T>(wv[u], __ldg(reinterpret_cast<const uint4*>(x + j * p.ldx) + c + u * 32),
                         acc[j]);
  }
  for (; c < chunks; c += 32) {
    const uint4 wv = __ldcs(w + c);
#pragma unroll
    for (int j = 0; j < N; ++j)
      acc[j] = dot8<T>(wv, __ldg(reinterpret_cast<const uint4*>(x + j * p.ldx) + c), acc[j]);
  }
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], s);
  if (lane == 0) {
    const float b = p.bias ? load_any(p.bias, p.bias_dtype, o) : 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j) static_cast<TO*>(p.out)[j * p.ldo + o] = from_f32<TO>(acc[j] + b);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Why the GEMV cannot run these arguments ("" when it can).
std::string gemv_refusal(const LinearArgs& a) {
  if (a.x_dtype == DType::kF32) return "f32 x/weight";
  if (a.n < 1 || a.n > kGemvMaxRows)
    return LONGCTX_FORMAT("n = {} outside [1, {}]", a.n, kGemvMaxRows);
  if (a.in % 8 != 0 || a.ldw % 8 != 0 || (a.n > 1 && a.ldx % 8 != 0) || !aligned16(a.x) ||
      !aligned16(a.w))
    return "x/weight rows not 16-byte aligned";
  return "";
}

template <int N>
void launch_gemv_n(const LinearArgs& a, cudaStream_t stream) {
  const GemvParams p{a.x,          a.ldx, a.w,   a.ldw, a.bias,
                     a.bias_dtype, a.out, a.ldo, a.in,  a.out_features};
  const int64_t blocks = (a.out_features + kGemvWarps - 1) / kGemvWarps;
  LONGCTX_CHECK(blocks <= 0x7fffffff, ErrorCode::kInvalidArgument, "linear: {} outputs",
                a.out_features);
  visit_float(a.out_dtype, "linear", [&](auto to) {
    using TO = decltype(to);
    const dim3 grid{unsigned(blocks)}, block{kGemvWarps * 32};
    if (a.x_dtype == DType::kBF16)
      kernels::cuda::launch_pdl(gemv_kernel<N, __nv_bfloat16, TO>, grid, block, 0, stream, p);
    else
      kernels::cuda::launch_pdl(gemv_kernel<N, __half, TO>, grid, block, 0, stream, p);
  });
}

void launch_gemv(const LinearArgs& a, cudaStream_t stream) {
  switch (a.n) {
    case 1:
      return launch_gemv_n<1>(a, stream);
    case 2:
      return launch_gemv_n<2>(a, stream);
    case 3:
      return launch_gemv_n<3>(a, stream);
    case 4:
      return launch_gemv_n<4>(a, stream);
    case 5:
      return launch_gemv_n<5>(a, stream);
    case 6:
      return launch_gemv_n<6>(a, stream);
    case 7:
      return launch_gemv_n<7>(a, stream);
    default:
      return launch_gemv_n<8>(a, stream);
  }
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt.

// Everything a cached plan depends on.
struct GemmKey {
  int64_t n, in, out, ldx, ldw, ldo;
  DType x, w, o;
  bool bias_epilogue;
  uint32_t align_x, align_w, align_o, align_bias;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    cublaslt::Fnv f;
    for (int64_t v : {k.n, k.in, k.out, k.ldx, k.ldw, k.ldo}) f.mix(uint64_t(v));
    f.mix(uint64_t(k.x) | uint64_t(k.w) << 8 | uint64_t(k.o) << 16 |
          uint64_t(k.bias_epilogue) << 24);
    f.mix(uint64_t(k.align_x) | uint64_t(k.align_w) << 16 | uint64_t(k.align_o) << 32 |
          uint64_t(k.align_bias) << 48);
    return f.h;
  }
};

using DeviceContext = cublaslt::Context<GemmKey, GemmKeyHash>;

DeviceContext& device_context(int device) {
  return cublaslt::context<GemmKey, GemmKeyHash>(device, "linear");
}

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const GemmKey& k, const LinearArgs& a) {
  auto plan = std::make_unique<Plan>();
  LONGCTX_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
  if (k.bias_epilogue) {
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(k.o)));
    // The heuristic reads the pointer's alignment; launches set their own pointer.
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias);
  }
  LONGCTX_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, cuda_type(k.w), uint64_t(k.in), uint64_t(k.out), k.ldw));
  LONGCTX_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, cuda_type(k.x), uint64_t(k.in), uint64_t(k.n), k.ldx));
  LONGCTX_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&plan->c, cuda_type(k.o), uint64_t(k.out), uint64_t(k.n), k.ldo));
  int found = 0;
  const cublasStatus_t st =
      cublaslt::pick_algo(handle, *plan, {k.align_w, k.align_x, k.align_o}, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
    LONGCTX_THROW(ErrorCode::kUnsupported,
                  "linear: cuBLASLt has no kernel for {} (operand alignments x {} B, weight {} B, "
                  "out {} B; rows that are multiples of 16 bytes always work)",
                  describe(a), k.align_x, k.align_w, k.align_o);
  LONGCTX_CUBLASLT_CHECK(st);
  return plan;
}

bool use_bias_epilogue(const LinearArgs& a) {
  return a.bias != nullptr && a.bias_dtype == a.out_dtype && alignment(a.bias) >= 16;
}

// The cached plan for a's problem (made on first use); ctx.mu held.
const Plan& plan_for(DeviceContext& ctx, const LinearArgs& a, bool bias_epilogue) {
  const GemmKey key{a.n,
                    a.in,
                    a.out_features,
                    a.ldx,
                    a.ldw,
                    a.ldo,
                    a.x_dtype,
                    a.w_dtype,
                    a.out_dtype,
                    bias_epilogue,
                    alignment(a.x),
                    alignment(a.w),
                    alignment(a.out),
                    bias_epilogue ? alignment(a.bias) : 0u};
  return ctx.plan(key, [&] { return make_plan(ctx.handle, key, a); });
}

void run_cublaslt(const LinearArgs& a, bool bias_epilogue, cudaStream_t stream) {
  LONGCTX_CHECK(a.in > 0, ErrorCode::kInvalidArgument,
                "linear (CUDA): in_features must be positive for {}", describe(a));
  DeviceContext& ctx = device_context(a.device.index);
  std::lock_guard<std::mutex> lock(ctx.mu);
  void* workspace = ctx.workspace(stream, a.device);
  const Plan& plan = plan_for(ctx, a, bias_epilogue);
  if (bias_epilogue) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias);
  const float alpha = 1.0f, beta = 0.0f;
  LONGCTX_CUBLASLT_CHECK(cublasLtMatmul(ctx.handle, plan.desc, &alpha, a.w, plan.a, a.x, plan.b,
                                        &beta, a.out, plan.c, a.out, plan.c, &plan.algo, workspace,
                                        cublaslt::kWorkspaceBytes, stream));
}

}  // namespace

void linear_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                 LinearBackend backend) {
  const LinearArgs a = linear_args(x, weight, bias, out);
  DeviceGuard guard(a.device.index);
  cudaStream_t stream = op_stream(a.device, "linear");
  if (a.n == 0 || a.out_features == 0) return;
  const std::string refusal = gemv_refusal(a);
  if (backend == LinearBackend::kGemv)
    LONGCTX_CHECK(refusal.empty(), ErrorCode::kUnsupported, "linear: GEMV cannot run {}: {}",
                  describe(a), refusal);
  const bool gemv = backend == LinearBackend::kGemv ||
                    (backend == LinearBackend::kAuto && refusal.empty() && a.n <= kGemvAutoRows);
  if (gemv) return launch_gemv(a, stream);
  const bool bias_epilogue = use_bias_epilogue(a);
  run_cublaslt(a, bias_epilogue, stream);
  if (a.bias && !bias_epilogue) launch_bias_add(a, stream);
}

std::string linear_cuda_plan(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& out, LinearBackend backend) {
  const LinearArgs a = linear_args(x, weight, bias, out);
  DeviceGuard guard(a.device.index);
  const bool gemv =
      backend == LinearBackend::kGemv ||
      (backend == LinearBackend::kAuto && gemv_refusal(a).empty() && a.n <= kGemvAutoRows);
  if (gemv) return "gemv";
  DeviceContext& ctx = device_context(a.device.index);
  std::lock_guard<std::mutex> lock(ctx.mu);
  const bool bias_epilogue = use_bias_epilogue(a);
  const Plan& plan = plan_for(ctx, a, bias_epilogue);
  return cublaslt::describe_algo(plan) + (bias_epilogue ? " +bias epilogue"
                                          : a.bias      ? " +bias add"
                                                        : "");
}

}  // namespace longctx::ops
