// CUDA side of RaggedBlockCausalAttention: device index buffers, the work list of the paged
// prefill kernel (built here, so graph mode can pad it to a fixed grid), and the launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "attention/block_causal/block_causal_cuda.h"
#include "kernels/attention_params.h"
#include "kernels/cuda/prefill.h"
#include "longctx/core/cuda_check.h"

namespace longctx::detail {

struct BlockCausalCuda {
  int device = 0;
  int64_t block_cap = 0;             // blocks the buffers hold (launch batch size)
  int64_t index_cap = 0;             // key indices the buffers hold
  int32_t* qo_indptr = nullptr;      // [block_cap + 1] device
  int32_t* kv_indptr = nullptr;      // [block_cap + 1] device
  int32_t* last_page_len = nullptr;  // [block_cap] device
  int32_t* kv_indices = nullptr;     // [index_cap] device
  int64_t batch = 0;                 // of the last plan (padded in graph mode)
  kernels::cuda::PrefillPlan plan;
  std::vector<int32_t> work_host;  // (block, row tile) pairs of the last plan
};

namespace {

void free_buffers(BlockCausalCuda* s) {
  if (s->qo_indptr) cudaFree(s->qo_indptr);
  if (s->kv_indices) cudaFree(s->kv_indices);
  s->qo_indptr = s->kv_indptr = s->last_page_len = s->kv_indices = nullptr;
}

void alloc_buffers(BlockCausalCuda* s, int64_t block_cap, int64_t index_cap) {
  free_buffers(s);
  int prev = 0;
  LONGCTX_CUDA_CHECK(cudaGetDevice(&prev));
  LONGCTX_CUDA_CHECK(cudaSetDevice(s->device));
  // One allocation for the three per-block arrays; kv_indices apart (it is the big one).
  void* p = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&p, sizeof(int32_t) * (3 * block_cap + 2)));
  s->qo_indptr = static_cast<int32_t*>(p);
  s->kv_indptr = s->qo_indptr + block_cap + 1;
  s->last_page_len = s->kv_indptr + block_cap + 1;
  p = nullptr;
  LONGCTX_CUDA_CHECK(cudaMalloc(&p, sizeof(int32_t) * std::max<int64_t>(index_cap, 1)));
  s->kv_indices = static_cast<int32_t*>(p);
  s->block_cap = block_cap;
  s->index_cap = index_cap;
  cudaSetDevice(prev);
}

int64_t tiles_of(int64_t q_len, int group, int tile_rows) {
  return (q_len * group + tile_rows - 1) / tile_rows;
}

}  // namespace

bool block_causal_cuda_compiled() { return true; }

BlockCausalCuda* block_causal_cuda_create(int device, int64_t block_cap, int64_t index_cap) {
  auto* s = new BlockCausalCuda;
  s->device = device;
  if (block_cap > 0) alloc_buffers(s, block_cap, index_cap);
  return s;
}

void block_causal_cuda_destroy(BlockCausalCuda* s) {
  free_buffers(s);
  delete s;
}

void block_causal_cuda_reserve(BlockCausalCuda* s, int64_t block_cap, int64_t index_cap) {
  if (block_cap <= s->block_cap && index_cap <= s->index_cap) return;
  alloc_buffers(s, std::max(block_cap, s->block_cap), std::max(index_cap, s->index_cap));
}

int64_t block_causal_cuda_work_cap(int64_t num_blocks, int64_t total_tokens, int group) {
  // sum_i ceil(q_i * G / R) <= ceil(T * G / R) + num_blocks over any split of T tokens.
  // 128-row tiles: a bound for the 192-row ones too (paged_prefill_tile_rows).
  return tiles_of(total_tokens, group, kernels::cuda::kPrefillTileRows) + num_blocks;
}

size_t block_causal_cuda_workspace_bytes(int64_t batch, int64_t total_tokens, int group,
                                         int64_t graph_work_cap) {
  int64_t items = std::max(graph_work_cap, block_causal_cuda_work_cap(batch, total_tokens, group));
  return sizeof(int32_t) * 2 * size_t(std::max<int64_t>(items, 1));
}

void block_causal_cuda_plan(BlockCausalCuda* s, const int32_t* qo_indptr, const int32_t* kv_indptr,
                            const int32_t* kv_indices, const int32_t* last_page_len,
                            const int32_t* kv_len, int64_t batch, int64_t num_indices,
                            int num_qo_heads, int num_kv_heads, int head_dim,
                            int64_t graph_work_cap, int64_t noop_block, void* workspace,
                            size_t workspace_bytes, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  LONGCTX_ASSERT(batch <= s->block_cap && num_indices <= s->index_cap,
                 "block-causal buffers too small: {} blocks / {} indices for {} / {}", batch,
                 num_indices, s->block_cap, s->index_cap);
  const int group = num_qo_heads / num_kv_heads;
  // Work list: (block, row tile), heaviest blocks (longest prefix) first so the long tail of a
  // span does not start last.
  const int tile_rows = kernels::cuda::paged_prefill_tile_rows(head_dim);
  std::vector<int32_t> order(batch);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return kv_len[a] > kv_len[b]; });
  s->work_host.clear();
  for (int32_t b : order) {
    int64_t tiles = tiles_of(qo_indptr[b + 1] - qo_indptr[b], group, tile_rows);
    for (int64_t t = 0; t < tiles; ++t) {
      s->work_host.push_back(b);
      s->work_host.push_back(int32_t(t));
    }
  }
  int64_t items = int64_t(s->work_host.size()) / 2;
  if (graph_work_cap > 0) {
    LONGCTX_ASSERT(items <= graph_work_cap, "graph work cap {} < {} items", graph_work_cap, items);
    LONGCTX_ASSERT(qo_indptr[noop_block + 1] == qo_indptr[noop_block] &&
                       kv_indptr[noop_block + 1] == kv_indptr[noop_block],
                   "no-op block {} is not empty", noop_block);
    for (; items < graph_work_cap; ++items) {  // no-op items: a block without queries
      s->work_host.push_back(int32_t(noop_block));
      s->work_host.push_back(0);
    }
  }
  LONGCTX_CHECK(size_t(items) * 2 * sizeof(int32_t) <= workspace_bytes, ErrorCode::kInvalidArgument,
                "block-causal plan: workspace has {} bytes, the work list needs {}",
                workspace_bytes, size_t(items) * 2 * sizeof(int32_t));
  // Pageable sources: cudaMemcpyAsync returns once they are staged, so the host vectors may
  // change after this returns (the next plan()).
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(s->qo_indptr, qo_indptr, sizeof(int32_t) * (batch + 1),
                                     cudaMemcpyHostToDevice, stream));
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(s->kv_indptr, kv_indptr, sizeof(int32_t) * (batch + 1),
                                     cudaMemcpyHostToDevice, stream));
  if (batch > 0)
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(s->last_page_len, last_page_len, sizeof(int32_t) * batch,
                                       cudaMemcpyHostToDevice, stream));
  if (num_indices > 0)
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(s->kv_indices, kv_indices, sizeof(int32_t) * num_indices,
                                       cudaMemcpyHostToDevice, stream));
  if (items > 0)
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(workspace, s->work_host.data(),
                                       sizeof(int32_t) * s->work_host.size(),
                                       cudaMemcpyHostToDevice, stream));
  s->batch = batch;
  s->plan.num_work_items = int(items);
  s->plan.work_items = static_cast<const int32_t*>(workspace);
  s->plan.tile_rows = tile_rows;
  s->plan.num_qo_heads = num_qo_heads;
  s->plan.num_kv_heads = num_kv_heads;
  s->plan.head_dim = head_dim;
  s->plan.mask_mode = kernels::MaskMode::kNone;
}

void block_causal_cuda_run(BlockCausalCuda* s, const void* q, const void* k, const void* v, void* o,
                           int num_qo_heads, int num_kv_heads, int head_dim, DType dtype,
                           float sm_scale, void* stream) {
  kernels::PagedPrefillParams p;
  p.q = q;
  p.k_cache = k;  // [n, Hkv, D] packed = [n pages, page_size 1, Hkv, D]
  p.v_cache = v;
  p.o = o;
  p.qo_indptr = s->qo_indptr;
  p.kv_indptr = s->kv_indptr;
  p.kv_indices = s->kv_indices;
  p.kv_last_page_len = s->last_page_len;
  p.batch_size = int(s->batch);
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.page_size = 1;
  p.kv_contiguous = true;  // a block's keys are its sequence's tokens [0, end): consecutive rows
  p.dtype = dtype;
  p.mask_mode = kernels::MaskMode::kNone;
  p.sm_scale = sm_scale;
  if (s->plan.num_work_items == 0) return;
  kernels::cuda::paged_prefill_run(p, s->plan, static_cast<cudaStream_t>(stream));
}

}  // namespace longctx::detail
