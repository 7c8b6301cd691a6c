// CUDA qk_norm_rope: a block per (token, kWarps heads), each warp one head (at one token, Qwen3's
// 36 q + k heads take 5 blocks instead of one block's 8 warps walking 4-5 heads each: a head's
// loads are a global round trip, and a single block at decode paid them one after another). The
// block's threads first evaluate the token's cos/sin (rope_cuda's code: the table row or dynamic
// NTK's frequencies, sincosf of the float32 angle, times attention_scaling) into shared memory;
// then each warp sums its head's squares in double (rms_norm_cuda's arithmetic), and each lane
// loads all its pairs (i, i + rotary_dim / 2) and their weights at once, normalizes them,
// rounds them to the dtype as rms_norm would store them, and rotates them with separately
// rounded products and sums. Dims past rotary_dim are only normalized. A lane writes only the
// elements it read after the warp's sum (a full-warp shuffle), so the update in place is
// race-free.
#include "kernels/cuda/pdl.cuh"
#include "longctx/core/stream.h"
#include "ops/ops_device.cuh"
#include "ops/qk_norm_rope.h"
#include "ops/rope_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int kMaxPairsPerLane = int(kMaxHeadDim / 2 / 32);

template <typename T>
__global__ void __launch_bounds__(kBlock) qk_norm_rope_kernel(QkNormRopeParams p) {
  __shared__ float cos_t[kMaxHeadDim / 2], sin_t[kMaxHeadDim / 2];
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_launch_dependents();
  const RopeParams& r = p.rope;
  const int64_t t = blockIdx.x;
  const int half = int(r.rotary_dim / 2);
  rope_cos_sin<kBlock>(r, t, cos_t, sin_t);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t d = r.head_dim;
  const int64_t h = int64_t(blockIdx.y) * kWarps + warp;
  if (h >= r.heads) return;
  T* v = row_of<T>(r.x, t * r.heads + h);
  const bool is_q = h < p.q_heads;
  const void* w = is_q ? p.q_weight : p.k_weight;
  const DType wd = is_q ? p.q_weight_dtype : p.k_weight_dtype;
  double ss = 0;
  for (int64_t j = lane; j < d; j += 32) {
    const float x = to_f32(v[j]);
    ss += double(x) * double(x);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float variance = static_cast<float>(ss / double(d));
  const float inv_rms = 1.0f / sqrtf(variance + p.eps);
  // rms_norm's output, stored in T
  auto norm = [&](float x, float wt) { return from_f32<T>(__fmul_rn(wt, __fmul_rn(x, inv_rms))); };
  // The lane's pairs i = lane + 32 u: every load before the first store (the stores may alias
  // the weights for all the compiler knows, so loads inside the loop would wait on them).
  float x1[kMaxPairsPerLane], x2[kMaxPairsPerLane], w1[kMaxPairsPerLane], w2[kMaxPairsPerLane];
#pragma unroll
  for (int u = 0; u < kMaxPairsPerLane; ++u) {
    const int i = lane + 32 * u;
    if (i < half) {
      x1[u] = to_f32(v[i]);
      x2[u] = to_f32(v[i + half]);
      w1[u] = load_any(w, wd, i);
      w2[u] = load_any(w, wd, i + half);
    }
  }
#pragma unroll
  for (int u = 0; u < kMaxPairsPerLane; ++u) {
    const int i = lane + 32 * u;
    if (i < half) {
      const float a = to_f32(norm(x1[u], w1[u])), b = to_f32(norm(x2[u], w2[u]));
      const float c = cos_t[i], s = sin_t[i];
      v[i] = from_f32<T>(__fadd_rn(__fmul_rn(a, c), __fmul_rn(-b, s)));
      v[i + half] = from_f32<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
    }
  }
  for (int64_t j = r.rotary_dim + lane; j < d; j += 32)
    v[j] = norm(to_f32(v[j]), load_any(w, wd, j));
}

}  // namespace

void qk_norm_rope_cuda(const Tensor& qk, int64_t q_heads, const Tensor& q_weight,
                       const Tensor& k_weight, float eps, const Tensor& positions,
                       const RopeArgs& rope) {
  const QkNormRopeParams p =
      qk_norm_rope_params(qk, q_heads, q_weight, k_weight, eps, positions, rope);
  LONGCTX_CHECK(p.rope.head_dim <= kMaxHeadDim, ErrorCode::kUnsupported,
                "qk_norm_rope: head_dim {} above the CUDA kernel's {}", p.rope.head_dim,
                kMaxHeadDim);
  DeviceGuard guard(p.rope.device.index);
  cudaStream_t stream = op_stream(p.rope.device, "qk_norm_rope");
  if (p.rope.n == 0 || p.rope.heads == 0) return;
  LONGCTX_CHECK(p.rope.n <= 0x7fffffff, ErrorCode::kInvalidArgument, "qk_norm_rope: {} tokens",
                p.rope.n);
  visit_float(p.rope.x.dtype, "qk_norm_rope", [&](auto tx) {
    kernels::cuda::launch_pdl(
        qk_norm_rope_kernel<decltype(tx)>,
        dim3(unsigned(p.rope.n), unsigned((p.rope.heads + kWarps - 1) / kWarps)), dim3(kBlock), 0,
        stream, p);
  });
}

}  // namespace longctx::ops
