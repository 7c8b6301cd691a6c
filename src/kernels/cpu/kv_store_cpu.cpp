// CPU KV store: one memcpy per (token, head) row, after all slots have been checked.
#include "kernels/cpu/kv_store_cpu.h"

#include <cstring>

#include "longctx/core/error.h"

namespace longctx::kernels::cpu {

void check_kv_store_params(const KvStoreParams& p) {
  using E = ErrorCode;
  LONGCTX_CHECK(p.dtype == DType::kBF16 || p.dtype == DType::kF16 || p.dtype == DType::kF32,
                E::kUnsupported, "kv store: dtype {} (want bf16, f16 or f32)", dtype_name(p.dtype));
  LONGCTX_CHECK(p.num_tokens >= 0, E::kInvalidArgument, "kv store: num_tokens {} < 0",
                p.num_tokens);
  LONGCTX_CHECK(p.num_kv_heads > 0 && p.head_dim > 0, E::kInvalidArgument,
                "kv store: num_kv_heads {} and head_dim {} must be positive", p.num_kv_heads,
                p.head_dim);
  LONGCTX_CHECK(p.page_size > 0 && p.num_pages >= 0, E::kInvalidArgument,
                "kv store: page_size {} must be positive and num_pages {} >= 0", p.page_size,
                p.num_pages);
  const int64_t row = int64_t(p.num_kv_heads) * p.head_dim;
  LONGCTX_CHECK(p.k_token_stride >= row && p.v_token_stride >= row, E::kInvalidArgument,
                "kv store: token strides k {} / v {} must be >= num_kv_heads * head_dim = {}",
                p.k_token_stride, p.v_token_stride, row);
  if (p.num_tokens > 0) {
    LONGCTX_CHECK(p.k && p.v && p.k_cache && p.v_cache && p.slot_mapping, E::kInvalidArgument,
                  "kv store: k, v, k_cache, v_cache and slot_mapping must be non-null for {} "
                  "tokens",
                  p.num_tokens);
  }
}

void kv_store(const KvStoreParams& p) {
  check_kv_store_params(p);
  const int64_t capacity = int64_t(p.num_pages) * p.page_size;
  for (int t = 0; t < p.num_tokens; ++t) {
    LONGCTX_CHECK(p.slot_mapping[t] < capacity, ErrorCode::kOutOfRange,
                  "kv store: slot_mapping[{}] = {} past the pool ({} pages x {} = {} slots)", t,
                  p.slot_mapping[t], p.num_pages, p.page_size, capacity);
  }
  const size_t esize = dtype_size(p.dtype);
  const int64_t row = int64_t(p.num_kv_heads) * p.head_dim;  // elements of one token's K (or V)
  for (int t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    // (page, offset) = (slot / page_size, slot % page_size) of [num_pages, page_size, heads, dim]
    // starts at element slot * row.
    const int64_t dst = slot * row;
    for (int h = 0; h < p.num_kv_heads; ++h) {
      const int64_t k_src = t * p.k_token_stride + int64_t(h) * p.head_dim;
      const int64_t v_src = t * p.v_token_stride + int64_t(h) * p.head_dim;
      const int64_t d = dst + int64_t(h) * p.head_dim;
      std::memcpy(static_cast<char*>(p.k_cache) + d * esize,
                  static_cast<const char*>(p.k) + k_src * esize, p.head_dim * esize);
      std::memcpy(static_cast<char*>(p.v_cache) + d * esize,
                  static_cast<const char*>(p.v) + v_src * esize, p.head_dim * esize);
    }
  }
}

}  // namespace longctx::kernels::cpu
