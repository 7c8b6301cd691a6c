// CUDA rope: a block per (token, kBlock of its (head, i) pairs), one pair per thread (at one
// token, Llama's 40 q + k heads take 10 blocks: one block looping over the pairs paid a global
// round trip per pass, the stores keeping the next pass's loads behind them). Its threads first
// pick the token's frequencies (a table row,
// or dynamic NTK's recomputed from the token's sequence length with the CPU twin's arithmetic,
// rope_math.h), evaluate cos/sin of the token's rotary_dim / 2 angles (float(position) *
// inv_freq[i] in fp32, full-precision sincosf, times attention_scaling) into shared memory, then
// rotate every (head, i) pair of the token in place with separately rounded products and sums
// (__fmul_rn/__fadd_rn: no FMA contraction, as the CPU twin and torch's tensor ops round). Dims
// past rotary_dim are not touched.
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/stream.h"
#include "ops/ops_device.cuh"
#include "ops/rope.h"
#include "ops/rope_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

constexpr int kBlock = 256;
constexpr int64_t kMaxHeadDim = 1024;

template <typename T>
__global__ void __launch_bounds__(kBlock) rope_kernel(RopeParams p) {
  __shared__ float cos_t[kMaxHeadDim / 2], sin_t[kMaxHeadDim / 2];
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int half = int(p.rotary_dim / 2);
  rope_cos_sin<kBlock>(p, t, cos_t, sin_t);
  __syncthreads();
  const int64_t pairs = p.heads * half;
  const int64_t k = int64_t(blockIdx.y) * kBlock + threadIdx.x;
  if (k >= pairs) return;
  const int64_t h = k / half;
  const int i = int(k - h * half);
  T* v = row_of<T>(p.x, t * p.heads + h);
  const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
  const float c = cos_t[i], s = sin_t[i];
  v[i] = from_f32<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(-x2, s)));
  v[i + half] = from_f32<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace

void rope_cuda(const Tensor& x, const Tensor& positions, const RopeArgs& args) {
  const RopeParams p = rope_params(x, positions, args);
  LONGCTX_CHECK(p.head_dim <= kMaxHeadDim, ErrorCode::kUnsupported,
                "rope: head_dim {} above the CUDA kernel's {}", p.head_dim, kMaxHeadDim);
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "rope");
  if (p.n == 0 || p.heads == 0 || p.head_dim == 0) return;
  LONGCTX_CHECK(p.n <= 0x7fffffff, ErrorCode::kInvalidArgument, "rope: {} tokens", p.n);
  const int64_t pairs = p.heads * (p.rotary_dim / 2);
  if (pairs == 0) return;
  const int64_t blocks = (pairs + kBlock - 1) / kBlock;
  LONGCTX_CHECK(blocks <= 65535, ErrorCode::kInvalidArgument, "rope: {} pairs per token", pairs);
  visit_float(p.x.dtype, "rope", [&](auto tx) {
    kernels::cuda::launch_pdl(rope_kernel<decltype(tx)>, dim3(unsigned(p.n), unsigned(blocks)),
                              dim3(kBlock), 0, stream, p);
  });
}

void rope_cuda(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  RopeArgs a;
  a.inv_freq = inv_freq;
  rope_cuda(x, positions, a);
}

}  // namespace longctx::ops
