// Parameter structs of batch decode over a paged KV cache and of attention-state merging, shared
// by the CPU references (src/kernels/cpu/decode_cpu.h, merge_cpu.h) and the CUDA kernels
// (src/kernels/cuda/decode.h, merge.h). Raw pointers and plain integers only, same conventions as
// kernels/attention_params.h: int32 index arrays, bf16/f16 element tensors, fp32 accumulation,
// lse in natural log, and a row that sees no key gets o = 0, lse = -inf.
#pragma once

#include <cstdint>

#include "kernels/kv_format.h"
#include "longctx/core/dtype.h"

namespace longctx::kernels {

// Most queries one request of a decode call may have (a speculative verify step's K + 1).
constexpr int kDecodeMaxQLen = 16;

// Batch decode: request b has q_len = qo_indptr[b+1] - qo_indptr[b] query tokens (one each when
// qo_indptr is nullptr; at most kDecodeMaxQLen) and the pages kv_indices[kv_indptr[b] ..
// kv_indptr[b+1]); kv_len = (pages - 1) * page_size + kv_last_page_len[b] (0 with no page).
// Key j lives at page kv_indices[kv_indptr[b] + j / page_size], slot j % page_size. q head h reads
// kv head h / (num_qo_heads / num_kv_heads).
// Query i of request b (row qo_indptr[b] + i of q, o and lse) sees the keys [first, end):
//   causal:  end = kv_len - q_len + 1 + i (the queries are the last q_len keys' tokens);
//   else:    end = kv_len (every query sees every key);
//   first = max(0, end - window) with a window, else 0 (a row with end <= first sees no key).
// With one query per request both rules give [max(0, kv_len - window), kv_len).
struct DecodeParams {
  const void* q = nullptr;        // [rows, num_qo_heads, head_dim], rows q_token_stride apart
  const void* k_cache = nullptr;  // [num_pages, page_size, num_kv_heads, head_dim]
  const void* v_cache = nullptr;  // [num_pages, page_size, num_kv_heads, head_dim]
  void* o = nullptr;              // [rows, num_qo_heads, head_dim]
  float* lse = nullptr;           // [rows, num_qo_heads] fp32, natural log; optional
  float* o_f32 = nullptr;         // instead of o: the output in fp32, unrounded (o is not written)
  // [batch_size + 1] query rows of each request; nullptr: one each (rows = batch_size). The CPU
  // reference reads it on the host; the CUDA kernel takes it through its plan (decode.h) and
  // does not read this pointer.
  const int32_t* qo_indptr = nullptr;
  bool causal = true;  // the rule above; irrelevant with one query per request

  const int32_t* kv_indptr = nullptr;         // [batch_size + 1] into kv_indices
  const int32_t* kv_indices = nullptr;        // [kv_indptr[batch_size]] page ids
  const int32_t* kv_last_page_len = nullptr;  // [batch_size], in [1, page_size] (or 0: no page)

  // Elements from one request's q row to the next (a view of a fused QKV output is wider than
  // num_qo_heads * head_dim); 0 = num_qo_heads * head_dim (contiguous). Even on CUDA.
  int64_t q_token_stride = 0;

  int batch_size = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;            // 64 or 128 on CUDA; any on the CPU reference
  int page_size = 0;           // >= 1
  DType dtype = DType::kBF16;  // of q, o and (kv_format kDtype) k_cache, v_cache
  // kFp8E4M3: k_cache / v_cache hold FP8 codes scaled by k_scale / v_scale (kernels/kv_format.h).
  KvCacheFormat kv_format = KvCacheFormat::kDtype;
  const float* k_scale = nullptr;  // [num_pages, num_kv_heads] with kFp8E4M3
  const float* v_scale = nullptr;  // [num_pages, num_kv_heads] with kFp8E4M3
  float sm_scale = 0.f;            // usually 1/sqrt(head_dim)
  // Sliding window: the query sees keys [max(0, kv_len - window), kv_len); 0 = all of them.
  int window = 0;
};

// Merge of attention states computed over disjoint key sets of the same queries. State s of row
// r, head h is (o_s[r, h, :], lse_s[r, h]); the merged state is
//   lse = log(sum_s exp(lse_s)),   o = sum_s o_s * exp(lse_s - lse),
// computed stably (max-subtracted). States with lse = -inf (no key) contribute nothing; when all
// are -inf the result is o = 0, lse = -inf.
//
// States are read as o_s = o_in + s * state_stride_o (elements), lse_s = lse_in + s *
// state_stride_lse, i.e. [num_states, num_rows, num_heads, head_dim] when the strides are
// num_rows * num_heads * head_dim and num_rows * num_heads; or, when o_ptrs != nullptr, from the
// device/host pointer arrays o_ptrs[s] / lse_ptrs[s] (each [num_rows, num_heads, head_dim] and
// [num_rows, num_heads]).
struct MergeParams {
  const void* o_in = nullptr;     // [num_states, num_rows, num_heads, head_dim] (strided, above)
  const float* lse_in = nullptr;  // [num_states, num_rows, num_heads]
  int64_t state_stride_o = 0;     // elements between states in o_in
  int64_t state_stride_lse = 0;   // elements between states in lse_in
  const void* const* o_ptrs = nullptr;     // [num_states] alternative to o_in; nullptr = unused
  const float* const* lse_ptrs = nullptr;  // [num_states]

  void* o_out = nullptr;     // [num_rows, num_heads, head_dim]
  float* lse_out = nullptr;  // [num_rows, num_heads]; optional

  int num_states = 0;
  int num_rows = 0;
  int num_heads = 0;
  int head_dim = 0;
  DType in_dtype = DType::kF32;   // f32, bf16 or f16
  DType out_dtype = DType::kF32;  // f32, bf16 or f16
};

// In-place accumulation of one attention state into an fp32 running state (the offload path
// merges many partial states into one without rounding between them): for each row r < num_rows
// and head h, with the new state (o[r, h, :] of dtype, lse[r, h]):
//   init:  acc = new state (converted to fp32);
//   else:  acc = merge(acc, new state), as MergeParams with two states.
// Rows are contiguous: row r of o starts at element r * num_heads * head_dim.
struct StateAccumulateParams {
  float* acc_o = nullptr;      // [num_rows, num_heads, head_dim] f32
  float* acc_lse = nullptr;    // [num_rows, num_heads] f32
  const void* o = nullptr;     // [num_rows, num_heads, head_dim] of dtype
  const float* lse = nullptr;  // [num_rows, num_heads]
  int num_rows = 0;
  int num_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;  // f32, bf16 or f16
  bool init = false;
};

}  // namespace longctx::kernels
