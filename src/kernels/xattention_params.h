// Parameter structs of XAttention's prefill estimate (docs/sparse.md), shared by the CPU
// references (kernels/cpu/xattention_cpu.h, which the CPU policy runs) and the CUDA kernels
// (kernels/cuda/xattention.h). Raw pointers and plain integers, as kernels/attention_params.h.
//
// A prefill segment of n queries (positions p0 = kv_len - n .. kv_len - 1) of request b, for each
// q head: the queries in groups of `stride` rows (query group r = queries [r S, r S + S)), the
// keys in groups of `stride` (key group c = keys [c S, c S + S)), a group pair scored along its
// antidiagonal,
//   a(r, c) = sm_scale / S * sum_s q[r S + S - 1 - s] . k[c S + s]      (terms past n or kv_len: 0)
// key group c visible to query group r when c S <= p0 + r S (and c S < kv_len). Two steps:
//   estimate  per (q head, query group r, key block j of 128 keys) the log-sum-exp of the visible
//             a(r, c) with c in block j (-inf when none is visible): block_lse;
//   select    per (q head, query block i of 128 queries) the softmax mass of each key block,
//             mass(i, j) = sum over the query groups r of block i of exp(block_lse(r, j) - LSE(r))
//             with LSE(r) the log-sum-exp of row r (per KV head: summed over its q heads, one
//             selection for all of them); the query block keeps the sink block (j = 0)
//             and its diagonal blocks, then the heaviest other blocks (ties: the lower j) until
//             the kept mass reaches threshold x the row's total: the block-sparse prefill
//             kernels' mask (kernels/attention_params.h), uint8 [Hq][q_blocks][k_blocks].
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"
#include "longctx/core/dtype.h"

namespace longctx::kernels {

inline int64_t xattn_q_groups(int64_t n, int64_t stride) { return (n + stride - 1) / stride; }
inline int64_t xattn_blocks(int64_t len) { return (len + kSparseBlock - 1) / kSparseBlock; }
// A request with one query, at most two key blocks (the sink and the diagonal are all there is)
// or fewer than min_kv_len keys (--xattn-min-len) gets the dense causal mask and no estimate (its
// block_lse range is empty).
inline bool xattn_dense(int64_t n, int64_t kv_len, int64_t min_kv_len = 0) {
  return n <= 1 || xattn_blocks(kv_len) <= 2 || kv_len < min_kv_len;
}
// Elements of one request's block_lse and mask.
inline int64_t xattn_lse_elems(int64_t n, int64_t kv_len, int64_t num_qo_heads, int64_t stride) {
  return num_qo_heads * xattn_q_groups(n, stride) * xattn_blocks(kv_len);
}
inline int64_t xattn_mask_elems(int64_t n, int64_t kv_len, int64_t num_qo_heads) {
  return num_qo_heads * xattn_blocks(n) * xattn_blocks(kv_len);
}

// Request b: queries q rows [qo_indptr[b], qo_indptr[b+1]) (row t at element t * q_row_stride,
// head h at + h * head_dim), keys through the page table as PagedPrefillParams. Writes request
// b's block_lse [Hq][q_groups][k_blocks] at block_lse + lse_indptr[b]; a row's entries past its
// last visible key block are unspecified (the CUDA kernel may skip them, select never reads them).
struct XAttnEstimateParams {
  const void* q = nullptr;                    // [total_q][Hq][d] rows q_row_stride elements apart
  int64_t q_row_stride = 0;                   // elements between query rows
  const void* k_cache = nullptr;              // [num_pages, page_size, num_kv_heads, head_dim]
  const int32_t* qo_indptr = nullptr;         // [batch + 1]
  const int32_t* kv_indptr = nullptr;         // [batch + 1] into kv_indices
  const int32_t* kv_indices = nullptr;        // page ids
  const int32_t* kv_last_page_len = nullptr;  // [batch]
  float* block_lse = nullptr;                 // see above
  const int64_t* lse_indptr = nullptr;        // [batch + 1] element offsets into block_lse
  // CUDA: the CTAs' work list, [num_work_items][2] (request, tile of kXAttnEstimateRows query
  // groups), from xattn_plan(); the CPU reference ignores it.
  const int32_t* work_items = nullptr;
  int num_work_items = 0;
  int batch_size = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0, page_size = 0;
  int stride = 8;              // divides 128
  DType dtype = DType::kBF16;  // of q and k_cache
  float sm_scale = 0.f;
};

// The estimate over a prefill's queries (contiguous [total_q, Hq, d]), keys and page table; the
// caller sets block_lse, lse_indptr and the work list.
inline XAttnEstimateParams xattn_estimate_params(const PagedPrefillParams& p, int stride) {
  XAttnEstimateParams e;
  e.q = p.q;
  e.q_row_stride = int64_t(p.num_qo_heads) * p.head_dim;
  e.k_cache = p.k_cache;
  e.qo_indptr = p.qo_indptr;
  e.kv_indptr = p.kv_indptr;
  e.kv_indices = p.kv_indices;
  e.kv_last_page_len = p.kv_last_page_len;
  e.batch_size = p.batch_size;
  e.num_qo_heads = p.num_qo_heads;
  e.num_kv_heads = p.num_kv_heads;
  e.head_dim = p.head_dim;
  e.page_size = p.page_size;
  e.stride = stride;
  e.dtype = p.dtype;
  e.sm_scale = p.sm_scale;
  return e;
}

// Request b's mask [Hq][q_blocks][k_blocks] at block_mask + mask_indptr[b] (the block-sparse
// prefill's block_mask / block_mask_indptr), from the estimate's block_lse.
struct XAttnSelectParams {
  const float* block_lse = nullptr;     // as XAttnEstimateParams
  const int64_t* lse_indptr = nullptr;  // [batch + 1]
  uint8_t* block_mask = nullptr;
  const int64_t* mask_indptr = nullptr;  // [batch + 1]
  const int32_t* q_lens = nullptr;       // [batch] n
  const int32_t* kv_lens = nullptr;      // [batch]
  // CUDA: [num_work_items][2] (request, query block); the CPU reference ignores it.
  const int32_t* work_items = nullptr;
  int num_work_items = 0;
  // Optional (CUDA): += {blocks kept, blocks a causal query block may see} over the CTAs.
  unsigned long long* counters = nullptr;  // [2]
  int batch_size = 0, num_qo_heads = 0;
  // q heads whose masses add up into one selection, written to each of them: 1 (per q head) or
  // num_qo_heads / num_kv_heads (per KV head); divides num_qo_heads.
  int heads_per_mask = 1;
  int stride = 8;
  double threshold = 0.9;  // in (0, 1]
  // Query blocks holding any of the segment's last dense_tail queries get the dense causal mask.
  int dense_tail = 0;
  int min_kv_len = 0;  // requests with fewer keys get the dense causal mask
};

// The values of the host blocks a step's masks keep (XAttention over an offloaded cache,
// docs/sparse.md). Item i = (request b, block position j in b's table, source block, destination
// block): for each KV head h, the rows of the block (keys [j bs, min((j + 1) bs, kv_len)) of
// request b) that lie in a key block of 128 which some q head of h's group keeps for some query
// block of b are copied, head h's head_dim elements of each row, from the source block to the
// destination block (rows [block_size][num_kv_heads][head_dim] at src / dst + block *
// block_stride bytes). Everything else of the destination is left as it was: the block-sparse
// prefill reads a KV head's rows of a key block only when some q head of the group keeps it.
struct XAttnGatherParams {
  const uint8_t* block_mask = nullptr;   // as XAttnSelectParams: [Hq][q_blocks][k_blocks] per b
  const int64_t* mask_indptr = nullptr;  // [batch + 1]
  const int32_t* q_lens = nullptr;       // [batch]
  const int32_t* kv_lens = nullptr;      // [batch]
  const int32_t* items = nullptr;        // [num_items][4] (b, j, source block, destination block)
  int num_items = 0;
  const void* src = nullptr;  // source block s at src + s * block_stride bytes
  void* dst = nullptr;        // destination block t at dst + (t + dst_block_offset) * block_stride
  int64_t block_stride = 0;   // bytes
  int64_t dst_block_offset = 0;
  int block_size = 0, num_qo_heads = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kBF16;
  unsigned long long* bytes_copied = nullptr;  // optional (CUDA): += bytes copied
};

// Elements of the GPU path's buffers for steps of up to max_tokens queries in max_seqs sequences
// of up to max_seq_len keys: the estimate's block_lse (f32) and the mask (u8).
struct XAttnBuffers {
  int64_t lse_elems = 0, mask_elems = 0;
  int64_t bytes() const { return lse_elems * 4 + mask_elems; }
};
inline XAttnBuffers xattn_buffers(int64_t num_qo_heads, int64_t stride, int64_t max_tokens,
                                  int64_t max_seqs, int64_t max_seq_len) {
  const int64_t k_blocks = xattn_blocks(max_seq_len);
  return {num_qo_heads * (max_tokens / stride + max_seqs) * k_blocks,
          num_qo_heads * (max_tokens / kSparseBlock + max_seqs) * k_blocks};
}
}  // namespace longctx::kernels
