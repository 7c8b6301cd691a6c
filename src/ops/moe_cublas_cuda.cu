// The cuBLASLt prefill path of moe_experts_cuda (moe_cublas.h), for many rows per expert: there
// cuBLASLt's Hopper GEMMs outrun the grouped mma.sync kernel of moe_cuda.cu (on an H100, one
// Qwen3-30B-A3B layer at 16K tokens 4.32 ms against 4.87, at 32K 6.97 against 9.59).
//
//   align:   moe_cuda.cu's align step without padding, and the expert counts to the host (one
//            small copy and a stream sync per call: eager only, never under graph capture);
//   layout:  per expert moe_lt_rows(count) rows in expert order (the extra rows zero), so the
//            GEMM shapes come from a bounded set whatever the routing; the table of counts and
//            offsets back to the device;
//   gather:  x rows into that layout (one kernel), each slot's row recorded for the combine;
//   gate/up: per expert [rows, hidden] x [2 inter, hidden]^T into 16-bit h [rows, 2 inter];
//   act:     silu(gate) * up over all rows in one launch, rounded to the 16-bit dtype;
//   down:    per expert [rows, inter] x [hidden, inter]^T into 16-bit y [rows, hidden].
// The per-expert GEMMs run as one linear_cuda call each (its cuBLASLt plans, cache and
// workspace). Besides the activation this rounds the gate, up and down outputs to the 16-bit
// dtype, as transformers' bf16 projections do. FP8 experts: Hopper's cuBLASLt has no 128 x 128
// block-scaled FP8 GEMM (its FP8 scales are per tensor), so before each expert's GEMM one kernel
// dequantizes that expert alone (code x block scale in f32, rounded to x's dtype, as the
// tensor-core kernel stages its tiles) into a scratch of one expert's largest matrix, reused by
// every expert in stream order: the step's scratch is one expert's weights (2 x 2 inter x hidden
// bytes), never the layer's, and this path runs only where experts average
// kMoeLtMinRowsPerExpert rows, so the extra pass over the expert's bytes is small beside its GEMM.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "longctx/core/stream.h"
#include "ops/linear.h"
#include "ops/moe_cublas.h"
#include "ops/moe_fp8_device.cuh"
#include "ops/moe_schedule.h"
#include "ops/ops_device.cuh"

namespace longctx::ops {

namespace {

using namespace cuda_detail;

// Per expert, from the host: the columns of the [kLtTableCols, experts] table.
enum LtTableCol { kLtCount, kLtExactOff, kLtPaddedOff, kLtPaddedRows, kLtTableCols };
constexpr int kLtGatherRows = 8;  // gathered rows per block

// Block (bx, e) writes rows [bx * kLtGatherRows, ...) of expert e's padded run: gathered row i
// < count is x[slot / top_k] for the slot at exact row exact_off + i of the align step (rows = 1),
// and that slot's inv becomes the padded row; rows from count to the padded count are zero.
// Rows are chunks of 16 bytes (hidden % 8 == 0, aligned).
__global__ void lt_gather_kernel(const uint4* __restrict__ x, int64_t chunks,
                                 const int32_t* __restrict__ sorted,
                                 const int32_t* __restrict__ table, int experts, int top_k,
                                 int32_t* __restrict__ inv, uint4* __restrict__ xg) {
  const int e = blockIdx.y;
  const int64_t count = table[kLtCount * experts + e];
  const int64_t padded_rows = table[kLtPaddedRows * experts + e];
  const int64_t exact_off = table[kLtExactOff * experts + e];
  const int64_t padded_off = table[kLtPaddedOff * experts + e];
  const int64_t i0 = int64_t(blockIdx.x) * kLtGatherRows;
  if (i0 >= padded_rows) return;
  for (int64_t idx = threadIdx.x; idx < kLtGatherRows * chunks; idx += blockDim.x) {
    const int64_t i = i0 + idx / chunks, c = idx % chunks;
    if (i >= padded_rows) break;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (i < count) {
      const int32_t slot = sorted[exact_off + i];
      v = x[int64_t(slot / top_k) * chunks + c];
      if (c == 0) inv[slot] = static_cast<int32_t>(padded_off + i);
    }
    xg[(padded_off + i) * chunks + c] = v;
  }
}

// act[r, c] = silu(h[r, c]) * h[r, inter + c] over [rows, inter], kVec elements per thread,
// rounded to T (the down GEMM's operand).
template <typename T>
__global__ void lt_silu_mul_kernel(const T* __restrict__ h, int64_t rows, int64_t inter,
                                   T* __restrict__ act) {
  const int64_t vecs = inter / kVec;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * vecs) return;
  const int64_t r = i / vecs, c = (i % vecs) * kVec;
  float g[kVec], u[kVec], o[kVec];
  load<kVec>(h + r * 2 * inter + c, g);
  load<kVec>(h + r * 2 * inter + inter + c, u);
#pragma unroll
  for (int j = 0; j < kVec; ++j) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  store<kVec>(act + r * inter + c, o);
}

// Expert e of FP8 codes [experts, n, k] into out ([n, k] of T): 8 codes per thread, times their
// block's scale (k % 8 == 0 and block_in % 8 == 0: moe_tc_operands).
template <typename T>
__global__ void dequant_expert_kernel(const uint2* __restrict__ codes, MoeFp8Scales fs, int64_t e,
                                      int64_t n, int64_t k, uint4* __restrict__ out) {
  const int64_t chunks = k / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * chunks) return;
  const int64_t r = i / chunks, c = (i % chunks) * 8;
  out[i] = fp8x8_to_elements<T>(codes[e * n * chunks + i], fs.row(e, r)[c / fs.block_in]);
}

// ---- the per-expert GEMMs ----

// FP8 experts' weights for expert_gemms: the scales, and the scratch that one expert at a time
// is dequantized into ([n * k] of x's dtype at least).
struct Fp8Feed {
  MoeFp8Scales scales;
  Tensor scratch;
};

// out rows of expert e = in rows of expert e @ w[e]^T, one linear_cuda call per non-empty expert
// over the layout of `table` (the host copy of the [kLtTableCols, experts] table): in [rows, k],
// w [experts, n, k], out [rows, n]; FP8 w is dequantized into fp8->scratch first. (cublasGemm
// GroupedBatchedEx, one call over the experts, measured slower at every size:
// GpuOpsPerf.MoeExpertGemms.)
void expert_gemms(const Tensor& in, const Tensor& w, const Tensor& out,
                  const std::vector<int32_t>& table, int64_t experts, const Fp8Feed* fp8,
                  cudaStream_t stream) {
  const int64_t n = w.size(1), k = w.size(2);
  Tensor wd;  // [n, k]: the dequantized expert
  if (fp8) wd = fp8->scratch.slice(0, 0, n * k).view({n, k});
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t off = table[kLtPaddedOff * experts + e];
    const int64_t rows = table[kLtPaddedRows * experts + e];
    if (rows == 0) continue;
    if (fp8) {
      const int64_t chunks = n * (k / 8);
      auto kernel = wd.dtype() == DType::kBF16 ? dequant_expert_kernel<__nv_bfloat16>
                                               : dequant_expert_kernel<__half>;
      kernel<<<unsigned((chunks + 255) / 256), 256, 0, stream>>>(
          static_cast<const uint2*>(w.data_ptr()), fp8->scales, e, n, k,
          static_cast<uint4*>(wd.data_ptr()));
      LONGCTX_CUDA_CHECK(cudaGetLastError());
    }
    linear_cuda(in.slice(0, off, off + rows), fp8 ? wd : w.select(0, e), Tensor(),
                out.slice(0, off, off + rows), LinearBackend::kCublasLt);
  }
}

}  // namespace

Tensor moe_cublas_experts(const MoeArgs& a, const MoeShape& s, cudaStream_t stream, Tensor& ints,
                          const int32_t** inv) {
  const Device d = a.x.device();
  const int64_t slots = s.tokens * s.top_k, experts = s.experts;
  const int64_t max_rows = moe_max_tiles(slots, experts, 1);
  ints = Tensor::empty({experts + 1 + max_rows + slots + kLtTableCols * experts}, DType::kI32, d);
  MoeAlignRows o;
  o.counts = ints.data<int32_t>();
  o.num_tiles = o.counts + experts;
  o.sorted = o.num_tiles + 1;
  o.inv = o.sorted + max_rows;
  int32_t* table = o.inv + slots;
  moe_align_rows(a, s, o, stream);
  std::vector<int32_t> host(kLtTableCols * experts);
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(host.data(), o.counts, experts * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  int64_t exact = 0, padded = 0, max_padded = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rows = moe_lt_rows(host[e]);
    host[kLtExactOff * experts + e] = static_cast<int32_t>(exact);
    host[kLtPaddedOff * experts + e] = static_cast<int32_t>(padded);
    host[kLtPaddedRows * experts + e] = static_cast<int32_t>(rows);
    exact += host[e];
    padded += rows;
    max_padded = std::max(max_padded, rows);
  }
  LONGCTX_CHECK(padded <= INT32_MAX, ErrorCode::kInvalidArgument,
                "moe_experts: {} tokens x top-{} gather {} rows (at most 2^31 - 1)", s.tokens,
                s.top_k, padded);
  *inv = o.inv;
  const DType wt = a.x.dtype();  // the GEMMs' dtype: the experts', or FP8 experts dequantized
  if (padded == 0) return Tensor::empty({0, s.hidden}, wt, d);  // every id out of range
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(table, host.data(), host.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream));
  Fp8Feed feed;
  Fp8Feed* fp8_feed = nullptr;
  if (a.gate_up_scales.defined()) {
    feed.scales = moe_fp8_scales(a, s, true);
    feed.scratch = Tensor::empty({moe_fp8_scratch_elems(s.hidden, s.inter)}, wt, d);
    fp8_feed = &feed;
  }
  Tensor h = Tensor::empty({padded, 2 * s.inter}, wt, d);
  {
    Tensor xg = Tensor::empty({padded, s.hidden}, wt, d);
    const int64_t chunks = s.hidden / kVec;
    const dim3 grid(unsigned((max_padded + kLtGatherRows - 1) / kLtGatherRows), unsigned(experts));
    lt_gather_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint4*>(a.x.data_ptr()), chunks,
                                               o.sorted, table, static_cast<int>(experts),
                                               static_cast<int>(s.top_k), o.inv,
                                               static_cast<uint4*>(xg.data_ptr()));
    LONGCTX_CUDA_CHECK(cudaGetLastError());
    expert_gemms(xg, a.gate_up, h, host, experts, fp8_feed, stream);
  }
  Tensor act = Tensor::empty({padded, s.inter}, wt, d);
  const int64_t vecs = padded * (s.inter / kVec);
  const dim3 blocks(unsigned((vecs + 255) / 256));
  if (wt == DType::kBF16)
    lt_silu_mul_kernel<<<blocks, 256, 0, stream>>>(h.data<__nv_bfloat16>(), padded, s.inter,
                                                   act.data<__nv_bfloat16>());
  else
    lt_silu_mul_kernel<<<blocks, 256, 0, stream>>>(h.data<__half>(), padded, s.inter,
                                                   act.data<__half>());
  LONGCTX_CUDA_CHECK(cudaGetLastError());
  h = Tensor();
  Tensor y = Tensor::empty({padded, s.hidden}, wt, d);
  if (fp8_feed) fp8_feed->scales = moe_fp8_scales(a, s, false);
  expert_gemms(act, a.down, y, host, experts, fp8_feed, stream);
  return y;
}

}  // namespace longctx::ops
