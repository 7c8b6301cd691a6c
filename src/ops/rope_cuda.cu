// CUDA rope: one block per token. Its threads first evaluate cos/sin of the token's half
// head_dim angles (float(position) * inv_freq[i] in fp32, full-precision sincosf) into shared
// memory, then rotate every (head, i) pair of the token in place with separately rounded
// products and sums (__fmul_rn/__fadd_rn: no FMA contraction, as the CPU twin and torch's
// tensor ops round).
#include "longctx/core/stream.h"
#include "kernels/cuda/pdl.cuh"
#include "ops/ops_device.cuh"
#include "ops/rope.h"

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
  const int half = int(p.head_dim / 2);
  const float pos = __ll2float_rn(p.positions[t]);
  for (int i = threadIdx.x; i < half; i += kBlock)
    sincosf(__fmul_rn(pos, p.inv_freq[i]), &sin_t[i], &cos_t[i]);
  __syncthreads();
  const int64_t pairs = p.heads * half;
  for (int64_t k = threadIdx.x; k < pairs; k += kBlock) {
    const int64_t h = k / half;
    const int i = int(k - h * half);
    T* v = row_of<T>(p.x, t * p.heads + h);
    const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
    const float c = cos_t[i], s = sin_t[i];
    v[i] = from_f32<T>(__fadd_rn(__fmul_rn(x1, c), __fmul_rn(-x2, s)));
    v[i + half] = from_f32<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
  }
}

}  // namespace

void rope_cuda(const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  const RopeParams p = rope_params(x, positions, inv_freq);
  LONGCTX_CHECK(p.head_dim <= kMaxHeadDim, ErrorCode::kUnsupported,
                "rope: head_dim {} above the CUDA kernel's {}", p.head_dim, kMaxHeadDim);
  DeviceGuard guard(p.device.index);
  cudaStream_t stream = op_stream(p.device, "rope");
  if (p.n == 0 || p.heads == 0 || p.head_dim == 0) return;
  LONGCTX_CHECK(p.n <= 0x7fffffff, ErrorCode::kInvalidArgument, "rope: {} tokens", p.n);
  visit_float(p.x.dtype, "rope", [&](auto tx) {
    kernels::cuda::launch_pdl(rope_kernel<decltype(tx)>, dim3(unsigned(p.n)), dim3(kBlock), 0,
                              stream, p);
  });
}

}  // namespace longctx::ops
