// CUDA kernels of XAttention's prefill estimate (kernels/xattention_params.h; CPU references in
// kernels/cpu/xattention_cpu.h):
//   xattn_estimate_run  the strided antidiagonal scores as a GEMM on tensor cores: per tile of
//                       128 rows (the q heads of one KV head x query groups) a CTA walks the
//                       visible key groups in tiles of 128, accumulating over the stride's S
//                       slices through a 3-stage cp.async pipeline (slice s: query
//                       rows r S + S - 1 - s against key rows c S + s, each a [rows][head_dim]
//                       operand gathered through the page table), and reduces each tile's scores
//                       to per-(row, key block) log-sum-exps in registers;
//   xattn_select_run    one CTA per (query block, q head or KV head): the rows' totals, the block
//                       masses (per KV head: summed over its q heads),
//                       the sink and diagonal, then a bitonic sort of the other blocks by mass
//                       (ties: the lower block) and a prefix scan to the threshold.
// Both read device memory only (no host sync). Requests with one query or at most two key blocks
// get the dense causal mask (the CPU policy's "no selection").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/xattention_params.h"

namespace longctx::kernels::cuda {

inline constexpr int kXAttnEstimateRows = 128;  // (q head, query group) rows per estimate CTA
// q heads of one KV head in an estimate CTA's rows (each K slice then serves all of them): the
// largest of 8, 4, 2, 1 that divides the GQA group.
__host__ __device__ inline int xattn_heads_per_tile(int group) {
  return group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
}
inline constexpr int kXAttnMaxKvLen = 1 << 20;  // keys per request (the select kernel's sort)

// The host side of a step: work lists and the offsets of each request's block_lse and mask.
struct XAttnPlan {
  std::vector<int32_t> estimate_items;  // [n][2] (request, tile of 128 / heads-per-tile groups)
  std::vector<int32_t> select_items;    // [n][2] (request, query block)
  std::vector<int64_t> lse_indptr;      // [batch + 1]
  std::vector<int64_t> mask_indptr;     // [batch + 1]
  int max_k_blocks = 0;                 // sizes the select kernel's shared memory
};

// Requests that xattn_dense() calls dense (min_kv_len: --xattn-min-len) get no estimate items
// and no block_lse. Throws Error(kUnsupported) for a stride outside {2, 4, 8, 16} or a kv_len
// above kXAttnMaxKvLen, Error(kInvalidArgument) for q_len > kv_len.
XAttnPlan xattn_plan(const int32_t* qo_indptr_host, const int32_t* kv_len_host, int batch_size,
                     int num_qo_heads, int num_kv_heads, int stride, int64_t min_kv_len = 0);

bool xattn_stride_supported(int stride);  // 2, 4, 8 or 16
// True when the estimate kernel handles these params (head_dim 64 / 128, bf16 / f16, integral
// GQA ratio, stride 2..16).
bool xattn_estimate_supported(const XAttnEstimateParams& params);
void xattn_estimate_run(const XAttnEstimateParams& params, cudaStream_t stream);
// max_k_blocks: XAttnPlan::max_k_blocks of the plan whose items params names.
void xattn_select_run(const XAttnSelectParams& params, int max_k_blocks, cudaStream_t stream);

// XAttnGatherParams (head_dim * element size a multiple of 16 bytes, blocks 16-byte aligned):
// one CTA per (item, KV head); src may be mapped pinned host memory (the offload path reads the
// host pool in place over the link).
bool xattn_gather_supported(const XAttnGatherParams& params);
void xattn_gather_run(const XAttnGatherParams& params, cudaStream_t stream);

}  // namespace longctx::kernels::cuda
