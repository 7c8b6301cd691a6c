#include "kernels/cuda/convert_device.cuh"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/merge_device.cuh"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"

namespace longctx::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per (row, head) over all states at once (one pass over the lse values, one over o).
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) merge_states_kernel(MergeParams p) {
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t items = int64_t(p.num_rows) * p.num_heads;
  if (item >= items) return;
  const TIn* o_in = static_cast<const TIn*>(p.o_in);
  const int64_t D = p.head_dim;
  auto lse_at = [&](int s) {
    return p.lse_ptrs ? p.lse_ptrs[s][item] : p.lse_in[s * p.state_stride_lse + item];
  };
  auto o_at = [&](int s) -> const TIn* {
    return p.o_ptrs ? static_cast<const TIn*>(p.o_ptrs[s]) + item * D
                    : o_in + s * p.state_stride_o + item * D;
  };
  TOut* out = static_cast<TOut*>(p.o_out) + item * D;
  float lse = detail::merge_row_warp<TIn, TOut>(p.num_states, p.head_dim, lse_at, o_at, out);
  if (p.lse_out && (threadIdx.x & 31) == 0) p.lse_out[item] = lse;
}

template <typename TIn>
void launch_out(const MergeParams& p, cudaStream_t stream) {
  const int64_t items = int64_t(p.num_rows) * p.num_heads;
  dim3 grid(unsigned((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
  switch (p.out_dtype) {
    case DType::kF32:
      merge_states_kernel<TIn, float><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
      break;
    case DType::kBF16:
      merge_states_kernel<TIn, __nv_bfloat16><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
      break;
    case DType::kF16:
      merge_states_kernel<TIn, __half><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
      break;
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "merge_states: output dtype {} not f32/bf16/f16",
                    dtype_name(p.out_dtype));
  }
  LONGCTX_CUDA_CHECK_LAUNCH("merge_states_kernel");
}

}  // namespace

void merge_states(const MergeParams& p, cudaStream_t stream) {
  LONGCTX_CHECK(p.num_states >= 1, ErrorCode::kInvalidArgument,
                "merge_states: num_states {} must be >= 1", p.num_states);
  LONGCTX_CHECK(p.num_rows >= 0 && p.num_heads >= 1 && p.head_dim >= 1, ErrorCode::kInvalidArgument,
                "merge_states: bad shape rows {} heads {} dim {}", p.num_rows, p.num_heads,
                p.head_dim);
  LONGCTX_CHECK(p.o_out != nullptr &&
                    (p.o_ptrs ? p.lse_ptrs != nullptr : (p.o_in != nullptr && p.lse_in != nullptr)),
                ErrorCode::kInvalidArgument, "merge_states: missing input or output pointers");
  if (p.num_rows == 0) return;
  switch (p.in_dtype) {
    case DType::kF32:
      return launch_out<float>(p, stream);
    case DType::kBF16:
      return launch_out<__nv_bfloat16>(p, stream);
    case DType::kF16:
      return launch_out<__half>(p, stream);
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "merge_states: input dtype {} not f32/bf16/f16",
                    dtype_name(p.in_dtype));
  }
}

void merge_two_states(const void* o_a, const float* lse_a, const void* o_b, const float* lse_b,
                      void* o_out, float* lse_out, int num_rows, int num_heads, int head_dim,
                      DType dtype, cudaStream_t stream) {
  // Two states as the strided N-state form: state 1 is reached by the pointer difference, which
  // keeps this a single kernel without a device pointer array.
  LONGCTX_CHECK(o_a && o_b && lse_a && lse_b, ErrorCode::kInvalidArgument,
                "merge_two_states: null input");
  const size_t es = dtype_size(dtype);
  const auto d_o = static_cast<const char*>(o_b) - static_cast<const char*>(o_a);
  const auto d_lse = reinterpret_cast<const char*>(lse_b) - reinterpret_cast<const char*>(lse_a);
  MergeParams p;
  p.o_in = o_a;
  p.lse_in = lse_a;
  p.state_stride_o = d_o / int64_t(es);
  p.state_stride_lse = d_lse / int64_t(sizeof(float));
  LONGCTX_CHECK(d_o % int64_t(es) == 0 && d_lse % int64_t(sizeof(float)) == 0,
                ErrorCode::kInvalidArgument, "merge_two_states: misaligned inputs");
  p.o_out = o_out;
  p.lse_out = lse_out;
  p.num_states = 2;
  p.num_rows = num_rows;
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.in_dtype = p.out_dtype = dtype;
  merge_states(p, stream);
}

namespace {

// One warp per (row, head): the two weights once, then head_dim / 32 elements per lane.
template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    accumulate_state_kernel(StateAccumulateParams p) {
  const int64_t item = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= int64_t(p.num_rows) * p.num_heads) return;
  const int lane = threadIdx.x & 31;
  const T* o = static_cast<const T*>(p.o) + item * p.head_dim;
  float* acc = p.acc_o + item * p.head_dim;
  const float b = p.lse[item];
  if (p.init) {
    for (int d = lane; d < p.head_dim; d += 32) acc[d] = detail::to_f32<T>(o[d]);
    if (lane == 0) p.acc_lse[item] = b;
    return;
  }
  const float a = p.acc_lse[item], m = fmaxf(a, b);
  if (m == -INFINITY) return;
  const float wa = __expf(a - m), wb = __expf(b - m), inv = 1.f / (wa + wb);
  for (int d = lane; d < p.head_dim; d += 32)
    acc[d] = (wa * acc[d] + wb * detail::to_f32<T>(o[d])) * inv;
  __syncwarp();
  if (lane == 0) p.acc_lse[item] = m + __logf(wa + wb);
}

}  // namespace

void accumulate_state(const StateAccumulateParams& p, cudaStream_t stream) {
  LONGCTX_CHECK(p.num_rows >= 0 && p.num_heads >= 1 && p.head_dim >= 1 && p.acc_o && p.acc_lse &&
                    (p.num_rows == 0 || (p.o && p.lse)),
                ErrorCode::kInvalidArgument, "accumulate_state: bad shape or null pointers");
  if (p.num_rows == 0) return;
  const int64_t items = int64_t(p.num_rows) * p.num_heads;
  dim3 grid(unsigned((items + kWarpsPerBlock - 1) / kWarpsPerBlock));
  switch (p.dtype) {
    case DType::kF32:
      accumulate_state_kernel<float><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
      break;
    case DType::kBF16:
      accumulate_state_kernel<__nv_bfloat16><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
      break;
    case DType::kF16:
      accumulate_state_kernel<__half><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
      break;
    default:
      LONGCTX_THROW(ErrorCode::kUnsupported, "accumulate_state: dtype {} not f32/bf16/f16",
                    dtype_name(p.dtype));
  }
  LONGCTX_CUDA_CHECK_LAUNCH("accumulate_state_kernel");
}

}  // namespace longctx::kernels::cuda
