// CUDA rms_norm / add_rms_norm: kThreadsPerRow threads share a row (a warp for short rows such
// as Qwen3's per-head norms, a block for hidden-size rows). Pass 1 reads x (and for
// add_rms_norm adds it into the fp32 residual, storing it) and sums the squares in double like
// the CPU twin; pass 2 rereads the row (x, or the residual this thread just wrote) and stores
// w * (r * inv_rms). A thread's pass-2 elements are the ones it read in pass 1 and every read of
// pass 1 precedes the reduction, so out may alias x. Rows of at most 4 chunks a thread (hidden
// sizes to 8192) keep their chunks and weights in registers (kChunks): every load of the row is
// issued before the first store, and pass 2 reads nothing (a store keeps the loads after it in
// line behind it, since they may alias: a hidden-2048 row at decode paid four global round trips
// one after another in a single block).
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/stream.h"
#include "ops/ops_device.cuh"
#include "ops/rms_norm.h"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

constexpr int kBlock = 256;

// Sum of v over the kThreadsPerRow threads of a row (all threads of the block call it).
template <int kThreadsPerRow>
__device__ __forceinline__ double row_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (kThreadsPerRow > 32) {
    constexpr int kWarps = kThreadsPerRow / 32;
    __shared__ double partial[kBlock / 32];
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) partial[warp] = v;
    __syncthreads();
    const int first = warp / kWarps * kWarps;  // the row's first warp
    v = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[first + w];
  }
  return v;
}

// kChunks: 0 loops over the row's chunks (pass 2 rereads them); > 0, each thread's at most
// kChunks chunks (lane + j kThreadsPerRow) stay in registers.
template <int N, int kThreadsPerRow, int kChunks, typename TX, typename TO, bool kResidual>
__global__ void __launch_bounds__(kBlock) rms_norm_kernel(RmsNormParams p) {
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  constexpr int kRowsPerBlock = kBlock / kThreadsPerRow;
  const int lane = threadIdx.x % kThreadsPerRow;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const bool active = row < p.x.rows;  // idle threads still take part in the reduction
  const int64_t d = p.x.cols, chunks = d / N;
  const TX* x = active ? row_of<const TX>(p.x, row) : nullptr;
  float* res = kResidual && active ? row_of<float>(p.residual, row) : nullptr;
  if constexpr (kChunks > 0) {
    float v[kChunks][N], wt[kChunks][N];
    double ss = 0;
    if (active) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t c = lane + int64_t(j) * kThreadsPerRow;
        if (c < chunks) {
          load<N>(x + c * N, v[j]);
          if constexpr (kResidual) {
            float r[N];
            load<N>(res + c * N, r);
#pragma unroll
            for (int i = 0; i < N; ++i) v[j][i] = r[i] + v[j][i];
          }
#pragma unroll
          for (int i = 0; i < N; ++i) wt[j][i] = load_any(p.weight, p.weight_dtype, c * N + i);
        }
      }
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t c = lane + int64_t(j) * kThreadsPerRow;
        if (c < chunks) {
          if constexpr (kResidual) store<N>(res + c * N, v[j]);
#pragma unroll
          for (int i = 0; i < N; ++i) ss += double(v[j][i]) * double(v[j][i]);
        }
      }
    }
    ss = row_sum<kThreadsPerRow>(ss);
    if (!active) return;
    const float inv_rms = 1.0f / sqrtf(static_cast<float>(ss / double(d)) + p.eps);
    TO* out = row_of<TO>(p.out, row);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t c = lane + int64_t(j) * kThreadsPerRow;
      if (c < chunks) {
        float o[N];
#pragma unroll
        for (int i = 0; i < N; ++i) o[i] = __fmul_rn(wt[j][i], __fmul_rn(v[j][i], inv_rms));
        store<N>(out + c * N, o);
      }
    }
    return;
  }
  double ss = 0;
  if (active) {
    for (int64_t c = lane; c < chunks; c += kThreadsPerRow) {
      float v[N];
      load<N>(x + c * N, v);
      if constexpr (kResidual) {
        float r[N];
        load<N>(res + c * N, r);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = r[i] + v[i];
        store<N>(res + c * N, v);
      }
#pragma unroll
      for (int i = 0; i < N; ++i) ss += double(v[i]) * double(v[i]);
    }
  }
  ss = row_sum<kThreadsPerRow>(ss);
  if (!active) return;
  const float variance = static_cast<float>(ss / double(d));
  const float inv_rms = 1.0f / sqrtf(variance + p.eps);
  TO* out = row_of<TO>(p.out, row);
  for (int64_t c = lane; c < chunks; c += kThreadsPerRow) {
    float v[N], o[N];
    if constexpr (kResidual)
      load<N>(res + c * N, v);
    else
      load<N>(x + c * N, v);
#pragma unroll
    for (int i = 0; i < N; ++i)
      o[i] = __fmul_rn(load_any(p.weight, p.weight_dtype, c * N + i), __fmul_rn(v[i], inv_rms));
    store<N>(out + c * N, o);
  }
}

template <int N, typename TX, typename TO, bool kResidual>
void launch_width(const RmsNormParams& p, cudaStream_t stream) {
  const int64_t chunks = p.x.cols / N;
  auto launch = [&](auto tpr, auto per_thread) {
    constexpr int kTpr = decltype(tpr)::value, kChunks = decltype(per_thread)::value;
    const int64_t rows_per_block = kBlock / kTpr;
    const int64_t blocks = (p.x.rows + rows_per_block - 1) / rows_per_block;
    LONGCTX_CHECK(blocks <= 0x7fffffff, ErrorCode::kInvalidArgument, "rms_norm: {} rows", p.x.rows);
    kernels::cuda::launch_pdl(rms_norm_kernel<N, kTpr, kChunks, TX, TO, kResidual>,
                              dim3(unsigned(blocks)), dim3(kBlock), 0, stream, p);
  };
  using std::integral_constant;
  if (chunks <= 64)
    launch(integral_constant<int, 32>{}, integral_constant<int, 2>{});
  else if (chunks <= 256)
    launch(integral_constant<int, 128>{}, integral_constant<int, 2>{});
  else if (chunks <= 4 * 256)
    launch(integral_constant<int, 256>{}, integral_constant<int, 4>{});
  else
    launch(integral_constant<int, 256>{}, integral_constant<int, 0>{});
}

template <bool kResidual>
void run(const RmsNormParams& p, const char* op) {
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, op);
  if (p.x.rows == 0) return;
  const bool vec = p.x.cols % kVec == 0 && rows_aligned16(p.x) && rows_aligned16(p.out) &&
                   (!kResidual || rows_aligned16(p.residual));
  visit_float(p.x.dtype, op, [&](auto tx) {
    visit_float(p.out.dtype, op, [&](auto to) {
      using TX = decltype(tx);
      using TO = decltype(to);
      if (vec)
        launch_width<kVec, TX, TO, kResidual>(p, stream);
      else
        launch_width<1, TX, TO, kResidual>(p, stream);
    });
  });
}

}  // namespace

void rms_norm_cuda(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  run<false>(rms_norm_params(x, weight, eps, out), "rms_norm");
}

void add_rms_norm_cuda(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                       const Tensor& out) {
  run<true>(add_rms_norm_params(x, residual, weight, eps, out), "add_rms_norm");
}

}  // namespace longctx::ops
