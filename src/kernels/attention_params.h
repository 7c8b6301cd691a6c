// Parameter structs shared by the CPU reference attention kernels (src/kernels/cpu) and the CUDA
// kernels (src/kernels/cuda). Raw pointers and plain integers only (FlashInfer style): the same
// struct describes host buffers for the reference and device buffers for the CUDA kernel, so a
// test fills one struct twice and compares.
//
// Conventions (all kernels):
//  - index arrays (qo_indptr, kv_indptr, kv_indices, kv_last_page_len) are int32;
//  - element tensors are bf16 or f16 (DType::kBF16 / kF16), contiguous, row-major as commented;
//  - scores are accumulated in fp32; lse is fp32 in natural log: lse = log(sum_j exp(s_j)) with
//    s_j = sm_scale * q.k_j over the keys the query may see;
//  - a query that may see no key at all (e.g. causal with kv_len < q_len, or a block mask row of
//    zeros) gets o = 0 and lse = -inf.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/kv_format.h"
#include "longctx/core/dtype.h"

namespace longctx::kernels {

enum class MaskMode : uint8_t {
  kNone,    // every query sees keys [0, kv_len)
  kCausal,  // query i of a segment of q_len queries sees keys [0, kv_len - q_len + i]
};

// The first key a query at key position `pos` sees under a sliding window of `window` keys
// (itself included; 0: no window). Key positions are those of the page table the kernel gets: a
// caller that trims leading pages (a sliding group's dropped blocks) shifts queries and keys alike.
LONGCTX_HD_INLINE int32_t window_first_key(int32_t pos, int32_t window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// Block size (tokens) of the block-sparse mask, both for query blocks and key blocks.
inline constexpr int kSparseBlock = 128;

// Batch prefill over a paged KV cache, optionally block-sparse.
//
// Request b owns queries [qo_indptr[b], qo_indptr[b+1]) and the pages
// kv_indices[kv_indptr[b] .. kv_indptr[b+1]); its kv_len is
//   (kv_indptr[b+1] - kv_indptr[b] - 1) * page_size + kv_last_page_len[b]   (0 if it has no page).
// Key j of request b lives at page kv_indices[kv_indptr[b] + j / page_size], slot j % page_size.
// Query q_head h reads kv head h / (num_qo_heads / num_kv_heads) (GQA; the ratio must be integral).
//
// Block-sparse (block_mask != nullptr): request b's mask is the uint8 array
//   block_mask[block_mask_indptr[b] ...] of shape [block_mask_heads, num_q_blocks, num_k_blocks]
// with num_q_blocks = ceil(q_len / 128), num_k_blocks = ceil(kv_len / 128); query i of the segment
// is in query block i / 128 (counted from the segment start), key j in key block j / 128.
// block_mask_heads is 1 (shared by all q heads) or num_qo_heads (per q head). A key is seen only
// when its (query block, key block) byte is nonzero AND mask_mode allows it (so kCausal inside a
// block mask gives causal-within-block). The CUDA kernel skips key tiles no row needs.
struct PagedPrefillParams {
  const void* q = nullptr;        // [total_q, num_qo_heads, head_dim]
  const void* k_cache = nullptr;  // [num_pages, page_size, num_kv_heads, head_dim]
  const void* v_cache = nullptr;  // [num_pages, page_size, num_kv_heads, head_dim]
  void* o = nullptr;              // [total_q, num_qo_heads, head_dim]
  float* lse = nullptr;           // [total_q, num_qo_heads] fp32, natural log; optional
  // Instead of o: the output in fp32, unrounded (partial states merged later, e.g. the offload
  // path's). When set, o is not written.
  float* o_f32 = nullptr;  // [total_q, num_qo_heads, head_dim]

  const int32_t* qo_indptr = nullptr;         // [batch_size + 1]
  const int32_t* kv_indptr = nullptr;         // [batch_size + 1] into kv_indices
  const int32_t* kv_indices = nullptr;        // [kv_indptr[batch_size]] page ids
  const int32_t* kv_last_page_len = nullptr;  // [batch_size], in [1, page_size] (or 0: no page)

  const uint8_t* block_mask = nullptr;         // see above; nullptr = dense
  const int64_t* block_mask_indptr = nullptr;  // [batch_size + 1] element offsets into block_mask
  int block_mask_heads = 1;                    // 1 or num_qo_heads

  // A promise that each request's pages are consecutive ids (kv_indices[kv_indptr[b] + j] ==
  // kv_indices[kv_indptr[b]] + j), so its keys are consecutive cache slots: a packed ragged K/V
  // (block-causal attention) or a contiguous cache. kv_indices stays valid and complete; a kernel
  // may read only each request's first id and then copy any run of keys at once (the Hopper
  // kernel's TMA boxes, at any page size). Others ignore it.
  bool kv_contiguous = false;

  int batch_size = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;            // 64, 128 or 256 (the generic kernel: 8 .. 256)
  int page_size = 0;           // 1 .. 256
  DType dtype = DType::kBF16;  // of q, o and (kv_format kDtype) k_cache, v_cache
  // kFp8E4M3: k_cache / v_cache hold FP8 codes scaled by k_scale / v_scale (kernels/kv_format.h).
  KvCacheFormat kv_format = KvCacheFormat::kDtype;
  const float* k_scale = nullptr;  // [num_pages, num_kv_heads] with kFp8E4M3
  const float* v_scale = nullptr;  // [num_pages, num_kv_heads] with kFp8E4M3
  MaskMode mask_mode = MaskMode::kNone;
  // Sliding window (kCausal only): query i of a segment sees keys [window_first_key(kv_len -
  // q_len + i, window), kv_len - q_len + i]; 0 = every earlier key. Kernels skip whole key tiles
  // before a tile's first visible key and mask the band's edge.
  int window = 0;
  float sm_scale = 0.f;  // usually 1/sqrt(head_dim)
};

// kv_len of request b from a host-side view of the page table (helper for plans and references).
inline int32_t paged_kv_len(const int32_t* kv_indptr, const int32_t* kv_last_page_len, int b,
                            int page_size) {
  int32_t pages = kv_indptr[b + 1] - kv_indptr[b];
  return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[b];
}

}  // namespace longctx::kernels
